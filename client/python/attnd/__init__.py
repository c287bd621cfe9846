"""attnd: the Python client of the attnd attention daemon.

    import attnd
    with attnd.Client() as c:                       # $ATTND_URL, else ipc:///tmp/attnd.sock
        g = c.geometry                              # the daemon's Hello
        r = c.region(1 << 22)                       # POSIX shm, registered once
        q = r.array((5, g["num_q_heads"], g["head_size"]))
        ...
        c.create(1)
        with c.step([(1, 5)]) as step:              # EndStep (every layer once), or abort on raise
            for layer in range(g["num_layers"]):
                c.attend(step, layer, q, k, v, out=o)   # all by reference

numpy arrays (float32/float16, ml_dtypes bfloat16/float8_e4m3fn) and CPU torch tensors pass by
reference when they lie in a region (region.array / region.tensor), otherwise INLINE; torch CUDA
tensors pass by CUDA IPC once their buffer is registered (region_from_tensor, alloc, empty).
torch is imported only when a tensor is used. attnd.transformers runs HuggingFace models through
the daemon; attnd.config.from_hf writes a daemon config from a model config.
"""

from .client import DEFAULT_URL, Client, Step, choose_spin_us
from .dtypes import from_bf16, to_bf16
from .errors import AttndError
from .region import CudaRegion, Region, ShmRegion
from .stream import StreamChannel, StreamStep

__version__ = "0.1.0"
__all__ = ["Client", "Step", "Region", "ShmRegion", "CudaRegion", "AttndError", "DEFAULT_URL",
           "StreamChannel", "StreamStep", "choose_spin_us", "to_bf16", "from_bf16", "__version__"]
