#!/usr/bin/env python3
"""CTest attnctl_cli: the attnctl binary from the outside, against a daemon this script starts
(and `attnd --help` against daemon/main.c's option table).

--version and --help; every bad command line exits 2 with a message naming the option, before
anything is sent (the daemon's request counter does not move); nothing listening gives exit 1
and a hint naming the URL and where it came from; `+` chains; attend's .npy round trip with
options after the operands; bench --json is one JSON object with consistent counts; the
capacity check refuses a run the free blocks cannot hold, before creating anything; the
prefill progress line appears with --progress, not on a pipe without it, and not for a short
prefill on a terminal.

Environment: ATTNCTL, ATTND (binaries), ATTND_VERSION (the project's version).
Standard library only (the .npy files are written and read by hand).
"""
from __future__ import annotations

import ast
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest

ATTNCTL = os.environ["ATTNCTL"]
ATTND = os.environ["ATTND"]
VERSION = os.environ["ATTND_VERSION"]

# 2 layers, 4 q / 1 kv heads, head 32, block 16, bf16 cache; 64 blocks of which a sequence may
# hold 16 (256 tokens)
CONFIG = """{"backend": "cpu", "threads": 1, "server": {"listen": "%s"},
 "geometry": {"num_layers": 2, "num_q_heads": 4, "num_kv_heads": 1, "head_size": 32,
              "block_size": 16, "cache_dtype": "bf16", "num_blocks": 64, "max_blocks_per_seq": 16},
 "log": {"level": "warn", "stats_interval_s": 0}}"""

TMP = tempfile.mkdtemp(prefix="attnctl-cli-")
URL = "ipc://" + os.path.join(TMP, "attnd.sock")
DAEMON: subprocess.Popen | None = None


def attnctl(*args: str, env: dict | None = None, url: str | None = URL,
            stderr=subprocess.PIPE) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("ATTND_URL", "ATTND_TOKEN")}
    if url is not None:
        e["ATTND_URL"] = url
    e.update(env or {})
    return subprocess.run([ATTNCTL, *args], env=e, stdout=subprocess.PIPE, stderr=stderr,
                          text=True, timeout=120, cwd=TMP)


def status() -> dict[str, str]:
    r = attnctl("status")
    assert r.returncode == 0, r.stderr
    return dict(re.findall(r"^(\w[\w ]*?):\s+(.*)$", r.stdout, re.M))


def requests_seen() -> int:
    return int(re.match(r"(\d+)", status()["requests"]).group(1))


def write_npy(path: str, shape: tuple[int, ...], values: list[float]) -> None:
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (shape,)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % len(values), *values))


def read_npy(path: str) -> tuple[tuple[int, ...], list[float]]:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", path
    hlen = struct.unpack("<H", data[8:10])[0]
    h = ast.literal_eval(data[10:10 + hlen].decode())
    assert h["descr"] == "<f4", h
    n = 1
    for d in h["shape"]:
        n *= d
    return h["shape"], list(struct.unpack("<%df" % n, data[10 + hlen:10 + hlen + 4 * n]))


def setUpModule() -> None:
    global DAEMON
    with open(os.path.join(TMP, "attnd.json"), "w") as f:
        f.write(CONFIG % URL)
    DAEMON = subprocess.Popen([ATTND, "--config", os.path.join(TMP, "attnd.json")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if attnctl("status").returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("attnd did not come up at " + URL)


def tearDownModule() -> None:
    if DAEMON is not None:
        DAEMON.send_signal(signal.SIGTERM)
        DAEMON.wait(timeout=30)
    shutil.rmtree(TMP, ignore_errors=True)


class Basics(unittest.TestCase):
    def test_status_shows_every_layer(self) -> None:
        r = attnctl("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("layers:       all 2: window 0, softcap 0, scale 0.176777, no ALiBi, no sinks",
                      r.stdout)
        self.assertIn("mps:          unknown\n", r.stdout)  # the CPU backend has no GPU to share

    def test_version(self) -> None:
        for flag in ("--version", "-V"):
            r = attnctl(flag, url=None)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), f"attnctl {VERSION} (protocol 1)")

    def test_help_names_every_option_and_command(self) -> None:
        r = attnctl("--help", url=None)
        self.assertEqual(r.returncode, 0)
        for word in ("--url", "--timeout", "--name", "--token", "--tls-ca", "--socket-only",
                     "--help", "--version", "$ATTND_URL", "$ATTND_TOKEN", "status", "info",
                     "seqs", "create", "fork", "free", "query", "attend", "bench", "--json",
                     "truncate",
                     "--progress", "--clients", "--abort", "--lse", "--inline"):
            self.assertIn(word, r.stdout)
        self.assertEqual(attnctl("-h", url=None).stdout, r.stdout)


class DaemonHelp(unittest.TestCase):
    def test_attnd_help_describes_every_option(self) -> None:
        # the option table of daemon/main.c, read from the source
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "daemon", "main.c")) as f:
            longopts = re.findall(r'\{"([a-z-]+)", (?:required|no)_argument', f.read())
        self.assertIn("config", longopts)
        r = subprocess.run([ATTND, "--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0)
        for name in longopts:
            self.assertRegex(r.stdout, r"\n  -\w, --%s\b" % name)
        for word in ("SIGHUP", "SIGTERM", "Exit status", "attnd.schema.json"):
            self.assertIn(word, r.stdout)
        r = subprocess.run([ATTND, "--bogus"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("attnd --help", r.stderr)


class BadCommandLines(unittest.TestCase):
    CASES = [
        ((), "no command"),
        (("-u",), "-u needs a value"),
        (("--url",), "--url needs a value"),
        (("-t", "abc", "status"), "'abc' is not a timeout"),
        (("--timeout=1.5", "status"), "'1.5' is not a timeout"),
        (("-x", "status"), "unknown option '-x'"),
        (("--bogus", "status"), "unknown or ambiguous option '--bogus'"),
        (("--url", "", "status"), "empty URL"),
        (("nope",), "nope: unknown command"),
        (("status", "+"), "empty command"),
        (("status", "extra"), "status: takes no arguments"),
        (("create",), "create: needs at least one sequence id"),
        (("create", "x1"), "create: 'x1' is not a sequence id"),
        (("fork", "1"), "fork: needs PARENT and CHILD"),
        (("truncate", "1"), "truncate: needs a sequence id and a token count"),
        (("truncate", "1", "x"), "truncate: 'x' is not a token count"),
        (("bench", "--seqs"), "bench: --seqs needs a value"),
        (("bench", "--seqs", "x"), "bench: --seqs: 'x' is not a number"),
        (("bench", "--context", "-1"), "bench: --context: '-1' is not a number"),
        (("bench", "--steps", "99999999999"), "bench: --steps: 99999999999 is above"),
        (("bench", "--steps", "0"), "must be > 0"),
        (("bench", "--json=yes"), "'--json=yes': the option takes no value"),
        (("bench", "--dtype", "f64"), "bench: --dtype: unknown dtype 'f64'"),
        (("bench", "--bogus"), "bench: unknown or ambiguous option '--bogus'"),
        (("bench", "extra"), "bench: unexpected argument 'extra'"),
        (("attend", "q.npy", "k.npy", "v.npy"), "attend: needs Q.npy K.npy V.npy OUT.npy (3"),
        (("attend", "q", "k", "v", "o", "--seqs", "1-2"), "attend: --seqs: '1-2' is not ID:N"),
        (("attend", "q", "k", "v", "o", "--seqs", ""), "attend: --seqs wants ID:N"),
        (("attend", "q", "k", "v", "o", "--layer", "L"), "attend: --layer: 'L' is not a number"),
        (("attend", "q", "k", "v", "o", "--lse"), "attend: --lse needs a value"),
    ]

    def test_exit_2_with_the_option_named(self) -> None:
        for args, message in self.CASES:
            with self.subTest(args=args):
                r = attnctl(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertTrue(r.stderr.startswith("attnctl: "), r.stderr)
                self.assertEqual(r.stdout, "")

    def test_a_bad_chain_sends_nothing(self) -> None:
        before = requests_seen()
        r = attnctl("create", "5", "+", "status", "+", "bench", "--seqs", "x")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stdout, "")
        self.assertEqual(requests_seen(), before + 1)  # only the second status itself


class NothingListens(unittest.TestCase):
    def test_hint_for_a_missing_socket(self) -> None:
        path = os.path.join(TMP, "nobody.sock")
        r = attnctl("status", url="ipc://" + path)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"connect: UNAVAILABLE: dial ipc://{path}", r.stderr)
        self.assertIn(f"hint: no socket at {path}: is attnd running", r.stderr)
        self.assertIn("The URL is from $ATTND_URL", r.stderr)

    def test_hint_for_a_stale_socket_and_for_tcp(self) -> None:
        path = os.path.join(TMP, "stale.sock")
        open(path, "w").close()
        r = attnctl("-u", "ipc://" + path, "status", url=None)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"nothing accepts connections on {path}", r.stderr)
        self.assertIn("The URL is given by -u", r.stderr)
        r = attnctl("-u", "tcp://127.0.0.1:1", "status", url=None)
        self.assertEqual(r.returncode, 1)
        self.assertIn('"server.listen_tcp": "tcp://127.0.0.1:1"', r.stderr)

    def test_the_default_url(self) -> None:
        r = attnctl("--help", url=None)
        self.assertIn("else ipc:///tmp/attnd.sock", r.stdout)


class Commands(unittest.TestCase):
    def test_chain_of_sequence_commands(self) -> None:
        r = attnctl("create", "7", "8", "+", "fork", "7", "9", "+", "query", "9", "+", "seqs",
                    "+", "free", "7", "8", "9")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("created 7\ncreated 8\nforked 7 -> 9", r.stdout)
        self.assertIn("3 sequence(s)", r.stdout)
        self.assertIn("freed 9", r.stdout)
        r = attnctl("create", "4", "+", "truncate", "4", "1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("truncate: INVALID_ARGUMENT: tokens: 1 tokens to drop, sequence 4 has 0",
                      r.stderr)
        r = attnctl("create", "7", "+", "create", "7")
        self.assertEqual(r.returncode, 1)
        self.assertIn("create: ALREADY_EXISTS", r.stderr)

    def test_attend_round_trip_options_after_the_operands(self) -> None:
        t, hq, hk, d = 3, 4, 1, 32
        v_row = [float(i % 5 - 2) for i in range(hk * d)]  # exact in bf16
        write_npy(os.path.join(TMP, "q.npy"), (t, hq, d), [0.01 * (i % 13) for i in range(t * hq * d)])
        write_npy(os.path.join(TMP, "k.npy"), (t, hk, d), [0.02 * (i % 7) for i in range(t * hk * d)])
        write_npy(os.path.join(TMP, "v.npy"), (t, hk, d), v_row * t)
        r = attnctl("create", "1", "+", "attend", "q.npy", "k.npy", "v.npy", "out.npy",
                    "--seqs", "1:3", "--layer", "1", "+", "truncate", "1", "1", "+", "query", "1",
                    "+", "free", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("attend: 3 tokens in 1 sequence(s), layer 1, f32 via shm", r.stdout)
        self.assertIn("truncated 1 by 1: 2 tokens, 1 blocks", r.stdout)
        shape, out = read_npy(os.path.join(TMP, "out.npy"))
        self.assertEqual(tuple(shape), (t, hq, d))
        # every key's value row is the same, so every output row is that row (softmax weights
        # summing to 1 within f32 rounding)
        self.assertEqual(len(out), t * hq * d)
        self.assertLess(max(abs(a - b) for a, b in zip(out, v_row * (t * hq))), 1e-5)
        self.assertEqual(out[:d], v_row)  # the first row sees one key: exact


class Bench(unittest.TestCase):
    def test_json(self) -> None:
        r = attnctl("bench", "--seqs", "2", "--context", "40", "--steps", "7", "--warmup", "2",
                    "--clients", "2", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        d = json.loads(r.stdout)
        self.assertEqual(list(d), ["daemon", "run", "requests", "throughput"])
        self.assertEqual(d["daemon"]["layers"], 2)
        self.assertEqual(d["daemon"]["cache_dtype"], "bf16")
        self.assertEqual(d["run"], {"clients": 2, "seqs": 2, "context": 40, "steps": 7,
                                    "warmup": 2, "layers": 2, "dtype": "bf16",
                                    "transport": "shm", "abort": False})
        req = d["requests"]
        self.assertEqual(req["begin_step"]["count"], 2 * 7)
        self.assertEqual(req["attend"]["count"], 2 * 7 * 2)
        self.assertEqual(req["all"]["count"], 2 * 7 * 4)
        for kind in req.values():
            self.assertTrue(0 < kind["p50_us"] <= kind["p90_us"] <= kind["p99_us"] <= kind["max_us"])
        self.assertGreater(d["throughput"]["wall_s"], 0)
        self.assertAlmostEqual(d["throughput"]["steps_per_s"] * d["throughput"]["wall_s"], 14,
                               places=6)
        self.assertNotIn("prefill", r.stderr)  # stderr is a pipe and no --progress

    def test_capacity_is_checked_before_anything_is_created(self) -> None:
        free_before = status()["blocks free"]
        # 4 x (200 + 50 + 30 tokens = 18 blocks) > 16 per sequence
        r = attnctl("bench", "--seqs", "4", "--context", "200", "--steps", "30")
        self.assertEqual(r.returncode, 1)
        self.assertIn("a sequence of 280 tokens (--context 200 + --warmup 50 + --steps 30) needs "
                      "18 blocks of 16 tokens; the daemon allows 16 per sequence", r.stderr)
        # 5 x 14 blocks > 64 free
        r = attnctl("bench", "--seqs", "5", "--context", "200", "--steps", "10", "--warmup", "0")
        self.assertEqual(r.returncode, 1)
        self.assertIn("1 client(s) x 5 seqs x 210 tokens need 70 blocks of 16 tokens; the "
                      "daemon has 64 free of 64", r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertEqual(status()["blocks free"], free_before)
        # what fits runs: 4 x 14 blocks
        r = attnctl("bench", "--seqs", "4", "--context", "200", "--steps", "10", "--warmup", "0")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_progress(self) -> None:
        args = ("bench", "--seqs", "2", "--context", "64", "--steps", "3", "--warmup", "0")
        r = attnctl(*args, "--progress")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("attnctl: bench: prefill 128 of 128 tokens (100%)", r.stderr)
        r = attnctl(*args)
        self.assertNotIn("prefill", r.stderr)
        # on a terminal: nothing for a prefill shorter than half a second
        master, slave = pty.openpty()
        try:
            r = attnctl(*args, stderr=slave)
            self.assertEqual(r.returncode, 0)
        finally:
            os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        os.close(master)
        self.assertNotIn(b"prefill", seen)


if __name__ == "__main__":
    unittest.main(verbosity=2)
