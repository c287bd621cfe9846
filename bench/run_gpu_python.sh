#!/usr/bin/env bash
# The Python package on the GPU machine, in one call:
#   1. client/python/tests/test_transformers.py against the CUDA backend, model and tensors on
#      the GPU (Q/K/V/out by CUDA IPC): tokens equal to transformers' eager run;
#   2. bench_hf.py: a Llama-3-8B-shaped model (random bf16 weights) through attnd vs SDPA, for
#      32x2048 and 16x1024 prompts with 64 new tokens, without and then with NVIDIA MPS.
#
# Here (the build machine), stage a folder inside the checkout the device call carries:
#   nice cmake -S . -B build-cuda -DATTND_CUDA=ON -DATTND_TESTS=OFF \
#        -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   nice cmake --build build-cuda -j2 --target attnd attnd-client
#   bash bench/run_gpu_python.sh stage /work/main/build-py-dev
# On the device (carry build-py-dev):   bash build-py-dev/run_gpu_python.sh run [test|bench|all]
# Results: $OUT/bench_hf_{nomps,mps}.json, the test and daemon logs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

stage() {
  local dest=$1 root=${2:-$(cd "$here/.." && pwd)} build=${BUILD_CUDA:-$root/build-cuda}
  rm -rf "$dest" && mkdir -p "$dest/python" "$dest/wheels"
  cp "$build/daemon/attnd" "$dest/attnd"
  cp -r "$root/client/python/attnd" "$root/client/python/tests" "$dest/python/"
  cp "$build/client/libattnd-client.so" "$dest/python/attnd/libattnd-client.so"
  cp "$root/bench/bench_hf.py" "$root/bench/run_gpu_python.sh" "$dest/"
  /work/shared/tools/bundle-libs "$dest/devlib" "$dest/attnd" "$dest/python/attnd/libattnd-client.so"
  # the device cannot reach a registry: cffi (the binding) and pytest as wheels
  for v in 3.10 3.11 3.12 3.13; do
    python3 -m pip download -q --only-binary=:all: --python-version "$v" \
      --platform manylinux2014_x86_64 -d "$dest/wheels" cffi pycparser pytest
  done
  find "$dest" -name __pycache__ -prune -exec rm -rf {} +
  du -sh "$dest"
}

start_daemon() {  # config file, log -> pid in $daemon_pid
  "$dir/attnd" --config "$1" >"$2" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 200); do [ -S "$sock" ] && return 0; sleep 0.1; done
  cat "$2"; return 1
}

stop_daemon() {
  kill -TERM "$daemon_pid" && wait "$daemon_pid" || echo "attnd exited with $?"
}

run() {  # what: test, bench or all
  local what=${1:-all}
  dir=$here
  out=${OUT:-/tmp/attnd-gpu-python}
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$dir/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local deps=/tmp/attnd-pydeps
  python3 -c "import cffi, pytest" 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links "$dir/wheels" --target "$deps" cffi pycparser pytest
  export PYTHONPATH="$dir/python:$deps"
  export ATTND_CLIENT_LIB="$dir/python/attnd/libattnd-client.so" ATTND_DAEMON="$dir/attnd"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

  [ "$what" = bench ] || run_test
  [ "$what" = test ] || run_bench
}

run_test() {
  echo "== test_transformers.py on the CUDA backend, tensors on the GPU"
  ATTND_TEST_BACKEND=cuda ATTND_TEST_DEVICE=cuda timeout 300 \
    python3 -m pytest -q -p no:cacheprovider "$dir/python/tests/test_transformers.py" 2>&1 |
    tee "$out/test_transformers_cuda.log" | tail -15 || echo "test_transformers.py (cuda) failed"
}

run_bench() {
  sock=/tmp/attnd-bench-py.sock
  python3 - "$sock" >"$out/attnd_bench.json" <<'PY'
import json, sys
from transformers import LlamaConfig
from attnd.config import from_hf
cfg = from_hf(LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8, max_position_embeddings=8192),
              backend="cuda", num_blocks=4608, listen=f"ipc://{sys.argv[1]}")
cfg["limits"] = {"max_step_tokens": 65536, "max_seqs": 256}
cfg["log"] = {"level": "warn"}
json.dump(cfg, sys.stdout)
PY
  for mode in nomps mps; do
    if [ "$mode" = mps ]; then
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/attnd-mps CUDA_MPS_LOG_DIRECTORY=/tmp/attnd-mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d
    fi
    echo "== bench_hf.py, $mode"
    rm -f "$sock"
    start_daemon "$out/attnd_bench.json" "$out/attnd_$mode.log"
    timeout 240 python3 "$dir/bench_hf.py" --url "ipc://$sock" --label "$mode" \
      --json "$out/bench_hf_$mode.json" || echo "bench_hf.py ($mode) failed: $?"
    stop_daemon
    if [ "$mode" = mps ]; then
      echo quit | nvidia-cuda-mps-control || true
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  done
}

case "${1:-}" in
  stage) stage "${2:?destination folder}" "${3:-}" ;;
  run) run "${2:-all}" ;;
  *) echo "usage: $0 stage DEST [REPO] | run [test|bench|all]" >&2; exit 2 ;;
esac
