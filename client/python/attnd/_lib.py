"""ctypes declarations of libattnd-client (client/include/attnd/client.h), nothing else."""

import ctypes
import ctypes.util
import os

REF_MAX_DIMS = 4

# attnd_dtype
F32, F16, BF16, FP8_E4M3, I32, I64 = range(6)
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16", FP8_E4M3: "fp8_e4m3", I32: "i32", I64: "i64"}


class Opts(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("token", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int32), ("channel_slots", ctypes.c_int32),
                ("spin_us", ctypes.c_int32)]


class Geometry(ctypes.Structure):
    _fields_ = [("num_layers", ctypes.c_uint32), ("num_q_heads", ctypes.c_uint32),
                ("num_kv_heads", ctypes.c_uint32), ("head_size", ctypes.c_uint32),
                ("block_size", ctypes.c_uint32), ("cache_dtype", ctypes.c_int),
                ("num_blocks", ctypes.c_uint32), ("max_blocks_per_seq", ctypes.c_uint32),
                ("scale", ctypes.c_float), ("linear_slots", ctypes.c_uint32),
                ("linear_heads", ctypes.c_uint32), ("linear_head_dim", ctypes.c_uint32)]


class Limits(ctypes.Structure):
    _fields_ = [("max_seqs", ctypes.c_uint32), ("max_step_tokens", ctypes.c_uint32),
                ("max_regions", ctypes.c_uint32), ("max_inline_bytes", ctypes.c_uint64),
                ("request_timeout_ms", ctypes.c_uint32)]


class ServerInfo(ctypes.Structure):
    _fields_ = [("protocol_version", ctypes.c_uint32), ("session", ctypes.c_uint64),
                ("version", ctypes.c_char * 64), ("backend", ctypes.c_char * 16),
                ("geometry", Geometry), ("limits", Limits), ("blocks_free", ctypes.c_uint32)]


class Status(ctypes.Structure):
    _fields_ = [("version", ctypes.c_char * 64), ("backend", ctypes.c_char * 16),
                ("geometry", Geometry), ("blocks_free", ctypes.c_uint32),
                ("num_sequences", ctypes.c_uint32), ("num_sessions", ctypes.c_uint32),
                ("requests", ctypes.c_uint64), ("errors", ctypes.c_uint64),
                ("uptime_s", ctypes.c_double)]


class SeqInfo(ctypes.Structure):
    _fields_ = [("seq_id", ctypes.c_uint64), ("num_tokens", ctypes.c_uint32),
                ("num_blocks", ctypes.c_uint32), ("step", ctypes.c_uint64)]


class StepSeq(ctypes.Structure):
    _fields_ = [("seq_id", ctypes.c_uint64), ("new_tokens", ctypes.c_uint32)]


class Step(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("num_tokens", ctypes.c_uint32)]


class Ref(ctypes.Structure):
    _fields_ = [("region", ctypes.c_uint32), ("offset", ctypes.c_uint64),
                ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * REF_MAX_DIMS),
                ("strides", ctypes.c_int64 * REF_MAX_DIMS), ("has_strides", ctypes.c_int32),
                ("data", ctypes.c_void_p), ("out", ctypes.c_void_p), ("bytes", ctypes.c_size_t)]


class Shm(ctypes.Structure):
    _fields_ = [("region", ctypes.c_uint32), ("name", ctypes.c_char * 64),
                ("base", ctypes.c_void_p), ("size", ctypes.c_size_t)]


def _candidates():
    env = os.environ.get("ATTND_CLIENT_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    for build in ("build", "build-client"):
        yield os.path.join(root, build, "client", "libattnd-client.so")
    found = ctypes.util.find_library("attnd-client")
    if found:
        yield found


def load(path=None):
    """Load the shared library: path, $ATTND_CLIENT_LIB, the repo's build/, or the system's."""
    tried = []
    for p in ([path] if path else _candidates()):
        try:
            return _declare(ctypes.CDLL(p))
        except OSError as e:
            tried.append(f"{p}: {e}")
    raise OSError("libattnd-client not found (set ATTND_CLIENT_LIB); tried:\n  " +
                  "\n  ".join(tried))


def _fn(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


def _declare(lib):
    P, E = ctypes.POINTER, ctypes.c_int  # attnd_err
    c, u32, u64, i32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
    _fn(lib, "attnd_client_alloc", E, P(c), P(Opts))
    _fn(lib, "attnd_client_free", None, c)
    _fn(lib, "attnd_client_set_tls", E, c, ctypes.c_char_p, ctypes.c_char_p)
    _fn(lib, "attnd_client_dial", E, c, ctypes.c_char_p)
    _fn(lib, "attnd_client_hello", E, c, P(ServerInfo))
    _fn(lib, "attnd_client_connect", E, c, ctypes.c_char_p, P(ServerInfo))
    _fn(lib, "attnd_client_session", u64, c)
    _fn(lib, "attnd_client_set_timeout", None, c, i32)
    _fn(lib, "attnd_client_last_error_copy", ctypes.c_size_t, c, ctypes.c_char_p,
        ctypes.c_size_t)
    _fn(lib, "attnd_client_last_error_remote", ctypes.c_int, c)
    _fn(lib, "attnd_client_status", E, c, P(Status))
    _fn(lib, "attnd_client_region_unregister", E, c, u32)
    _fn(lib, "attnd_client_shm_create", E, c, ctypes.c_size_t, P(Shm))
    _fn(lib, "attnd_client_shm_destroy", E, c, P(Shm))
    _fn(lib, "attnd_client_seq_create", E, c, u64, P(SeqInfo))
    _fn(lib, "attnd_client_seq_fork", E, c, u64, u64, P(SeqInfo))
    _fn(lib, "attnd_client_seq_free", E, c, u64)
    _fn(lib, "attnd_client_seq_query", E, c, u64, P(SeqInfo))
    _fn(lib, "attnd_client_seq_list", E, c, P(SeqInfo), ctypes.c_size_t,
        P(ctypes.c_size_t))
    _fn(lib, "attnd_client_step_begin", E, c, P(StepSeq), ctypes.c_size_t, P(Step), P(u32))
    _fn(lib, "attnd_client_step_end", E, c, u64, ctypes.c_int)
    _fn(lib, "attnd_client_attend", E, c, u64, u32, P(Ref), P(Ref), P(Ref), P(Ref), P(Ref))
    _fn(lib, "attnd_err_name", ctypes.c_char_p, E)
    _fn(lib, "attnd_strerror", ctypes.c_char_p, E)
    return lib
