#!/usr/bin/env bash
# Stream channels on the GPU machine (issue 16), in one call, under NVIDIA MPS:
#   1. client/python/tests/test_stream.py against the CUDA daemon (torch CUDA tensors, torch
#      streams, a decode step captured in a CUDA graph and replayed, the Generator's tokens and
#      logits identical through a channel and through Client.attend, a timeout);
#   2. bench/stream_gpu.py e2e: two workers, one killed mid-step; the survivor bit-identical to
#      a solo run, the daemon up, every block back;
#   3. bench/stream_gpu.py overhead: the decode-step per-layer cost of the handoff (32 layers,
#      32 q / 8 kv heads, head 128, bf16; 32 x 2048 and 8 x 512);
#   4. bench/bench_hf.py: the Llama-3-8B-shaped model, SDPA (DynamicCache; StaticCache eager and
#      with the decode step captured in a CUDA graph) vs attnd (Attend), attnd over a stream
#      channel, and the channel with the decode step captured in a CUDA graph; $REPEAT (3)
#      alternated repeats, medians; BENCH_ARGS adds bench_hf options (e.g. --impl X --impl Y);
#      PIN=1 runs the daemon on cores 8-11 and the bench on cores 2-5 (taskset).
#   5. bench/sdpa_decode.py: one layer in process (SDPA, its cache write, attnd's worker copies)
#      at $LAYER_SHAPES (decode B:CTX, prefill pB:CTX; default: both at 32x2048 and 16x1024);
#   6. client/python/tests/test_transformers.py and test_rotary.py against the CUDA daemon.
# STEPS (default "1 4 2 3") picks and orders them. With BEFORE=path/to/an/older/attnd (and
# BEFORE_CLIENT=its libattnd-client.so) at stage time, OVERHEAD_RUNS="attnd attnd-before attnd
# attnd-before" alternates the two in step 3 (the worker on the matching client library).
#
# Here (the build machine):
#   nice cmake -S . -B build-cuda -DATTND_CUDA=ON -DATTND_TESTS=OFF \
#        -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   nice cmake --build build-cuda -j2 --target attnd attnd-client
#   bash bench/run_gpu_stream.sh stage /work/main/build-stream-dev
# On the device (carry build-stream-dev):   bash build-stream-dev/run_gpu_stream.sh run
# Results in $OUT/stream_results.tar.xz: test_stream_cuda.log, stream_e2e.json,
# stream_overhead_*.json, bench_hf_mps.json, bench_hf.log and the daemons' logs.
# WHEELS: a folder with the cffi and pycparser wheels (cp312 manylinux) the device lacks.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

stage() {
  local dest=$1 root build tmp
  root=${2:-$(cd "$here/.." && pwd)}
  build=${BUILD_CUDA:-$root/build-cuda}
  tmp=$(mktemp -d)
  mkdir -p "$tmp/s/python" "$tmp/s/wheels"
  cp "$build/daemon/attnd" "$tmp/s/attnd"
  [ -n "${BEFORE:-}" ] && cp "$BEFORE" "$tmp/s/attnd-before"
  cp -r "$root/client/python/attnd" "$root/client/python/tests" "$tmp/s/python/"
  cp -L "$build/client/libattnd-client.so" "$tmp/s/python/attnd/libattnd-client.so"
  [ -n "${BEFORE_CLIENT:-}" ] && cp -L "$BEFORE_CLIENT" "$tmp/s/python/attnd/libattnd-client-before.so"
  cp "$root/bench/bench_hf.py" "$root/bench/stream_gpu.py" "$root/bench/sdpa_decode.py" "$tmp/s/"
  /work/shared/tools/bundle-libs "$tmp/s/devlib" "$tmp/s/attnd" "$tmp/s/python/attnd/libattnd-client.so"
  strip "$tmp/s"/attnd*
  cp "${WHEELS:-/work/main/build-py-dev/wheels}"/*.whl "$tmp/s/wheels/"
  find "$tmp/s" -name __pycache__ -prune -exec rm -rf {} +
  rm -rf "$dest" && mkdir -p "$dest"
  tar -cJf "$dest/stream.tar.xz" -C "$tmp" s
  cp "$0" "$dest/run_gpu_stream.sh"
  rm -rf "$tmp"
  du -sh "$dest"
}

daemon_config() {  # geometry layers, blocks, socket -> JSON on stdout
  python3 - "$@" <<'PY'
import json, sys
from transformers import LlamaConfig
from attnd.config import from_hf
cfg = from_hf(LlamaConfig(hidden_size=4096, num_hidden_layers=int(sys.argv[1]),
                          num_attention_heads=32, num_key_value_heads=8,
                          max_position_embeddings=8192),
              backend="cuda", num_blocks=int(sys.argv[2]), listen=f"ipc://{sys.argv[3]}")
cfg["limits"] = {"max_step_tokens": 65536, "max_seqs": 256, "reclaim_timeout_ms": 200,
                 "max_regions": 64}
cfg["log"] = {"level": "info", "stats_interval_s": 0}
json.dump(cfg, sys.stdout)
PY
}

start_daemon() {  # config, log [binary] -> $daemon_pid
  rm -f "$sock"
  $PIN_DAEMON "${3:-$dir/attnd}" --config "$1" >"$2" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 300); do [ -S "$sock" ] && return 0; sleep 0.1; done
  cat "$2"; return 1
}

stop_daemon() {  # SIGTERM, at most 15 s, then SIGKILL
  kill -TERM "$daemon_pid" 2>/dev/null
  for _ in $(seq 150); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$daemon_pid" 2>/dev/null; then
    echo "attnd did not exit in 15 s: SIGKILL"; kill -KILL "$daemon_pid"
  fi
  wait "$daemon_pid"; echo "attnd exit status $?"
}

step_1() {
  echo "== 1. test_stream.py, CUDA daemon, MPS"
  ATTND_TEST_BACKEND=cuda ATTND_TEST_LOG_DIR="$out" ATTND_TEST_LOG_LEVEL=info timeout 100 \
    python3 -m pytest -v -rA --tb=short -p no:cacheprovider -o faulthandler_timeout=30 \
    "$dir/python/tests/test_stream.py" >"$out/test_stream_cuda.log" 2>&1
  echo "rc=$?"; grep -E "PASSED|FAILED|ERROR|SKIPPED|Error|assert|passed|failed" \
    "$out/test_stream_cuda.log" | head -30
}

step_6() {
  echo "== 6. test_transformers.py and test_rotary.py, CUDA daemon, MPS"
  ATTND_TEST_BACKEND=cuda ATTND_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -rfs \
    -p no:cacheprovider "$dir/python/tests/test_transformers.py" "$dir/python/tests/test_rotary.py" \
    >"$out/test_transformers_cuda.log" 2>&1
  echo "rc=$?"; tail -6 "$out/test_transformers_cuda.log"
}

step_4() {
  echo "== 4. bench_hf.py, MPS, ${REPEAT:-3} alternated repeats after a warm-up round"
  start_daemon "$out/attnd_bench.json" "$out/attnd_bench.log" || return 1
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv \
    -lms 500 >"$out/clocks.csv" 2>&1 &
  local smi=$!
  PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-240}" $PIN_BENCH python3 "$dir/bench_hf.py" --url "ipc://$sock" \
    --label mps --repeat "${REPEAT:-3}" --json "$out/bench_hf_mps.json" ${BENCH_ARGS:-} \
    >"$out/bench_hf.log" 2>&1
  echo "rc=$?"; grep -E "^median|error|Error" "$out/bench_hf.log" | cut -c1-400
  kill "$smi" 2>/dev/null
  stop_daemon
  grep -a -E "event=stream_release|device_failed|level=error" "$out/attnd_bench.log" | head -5
}

step_2() {
  echo "== 2. e2e: two workers, one killed mid-step"
  start_daemon "$out/attnd_stream.json" "$out/attnd_e2e.log" || return 1
  timeout 60 python3 -X faulthandler "$dir/stream_gpu.py" e2e --url "ipc://$sock" \
    --log "$out/attnd_e2e.log" --json "$out/stream_e2e.json"
  echo "rc=$?"
  stop_daemon
  grep -a -E "event=mps|event=stream|event=device_failed|level=error" "$out/attnd_e2e.log" | head -8
}

step_3() {  # OVERHEAD_RUNS: the daemons, in order (attnd-before: the one staged with BEFORE)
  echo "== 3. per-layer overhead"
  local runs=${OVERHEAD_RUNS:-attnd} k=0
  for bin in $runs; do
    k=$((k + 1))
    start_daemon "$out/attnd_stream.json" "$out/attnd_overhead.log" "$dir/$bin" || return 1
    local lib=$dir/python/attnd/libattnd-client.so
    [ "$bin" = attnd-before ] && [ -f "${lib%.so}-before.so" ] && lib=${lib%.so}-before.so
    ATTND_CLIENT_LIB=$lib timeout 60 python3 -X faulthandler "$dir/stream_gpu.py" overhead --url "ipc://$sock" \
      --reps "${OVERHEAD_REPS:-20}" --json "$out/stream_overhead_${k}_$bin.json" >/dev/null
    echo "$bin rc=$?"
    python3 - "$out/stream_overhead_${k}_$bin.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    u = r["us_per_layer"]
    print(f'  {r["batch"]}x{r["ctx"]}: presignalled {u["presignalled"]} serial {u["serial"]} '
          f'serial_gemm {u["serial_gemm"]} gemm {u["gemm_only"]} graph {u["graph_gemm"]} | '
          f'handoff {r["handoff_overhead_us_per_layer"]} eager-over '
          f'{r["overhead_over_kernels_and_gemm_us_per_layer"]} graph-over '
          f'{r["graph_overhead_us_per_layer"]}')
PY
    stop_daemon
  done
  grep -a -E "event=stream|event=device_failed|level=error" "$out/attnd_overhead.log" | head -5
}

step_5() {
  echo "== 5. one layer in process: sdpa_decode.py ${LAYER_SHAPES:=32:2048 16:1024 p32:2048 p16:1024}"
  timeout 120 python3 "$dir/sdpa_decode.py" $LAYER_SHAPES 2>&1 | tee "$out/sdpa_layer.log" | grep -E "^case|Error"
}

run() {
  dir=/tmp/attnd-stream/s
  out=/tmp/attnd-stream-out  # packed into $OUT/stream_results.tar.xz at the end (one file)
  rm -rf "$out"; mkdir -p "$out" /tmp/attnd-stream
  [ -x "$dir/attnd" ] || tar -xJf "$here/stream.tar.xz" -C /tmp/attnd-stream
  export LD_LIBRARY_PATH="$dir/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local deps=/tmp/attnd-pydeps
  python3 -c "import cffi" 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links "$dir/wheels" --target "$deps" cffi pycparser
  export PYTHONPATH="$dir/python:$deps"
  export ATTND_CLIENT_LIB="$dir/python/attnd/libattnd-client.so" ATTND_DAEMON="$dir/attnd"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
  date -u +%FT%TZ
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/attnd-mps CUDA_MPS_LOG_DIRECTORY=/tmp/attnd-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "MPS control daemon started"

  # PIN=1: the daemon and the bench each on cores of their own (host-bound eager runs)
  PIN_DAEMON= PIN_BENCH=
  [ -n "${PIN:-}" ] && PIN_DAEMON="taskset -c 8-11" PIN_BENCH="taskset -c 2-5"
  sock=/tmp/attnd-stream.sock
  daemon_config 32 6144 "$sock" >"$out/attnd_stream.json"
  daemon_config 32 4608 "$sock" >"$out/attnd_bench.json"
  for step in ${STEPS:-1 4 2 3}; do "step_$step"; done
  echo quit | nvidia-cuda-mps-control
  date -u +%FT%TZ
  [ -n "${OUT:-}" ] && tar -cJf "$OUT/stream_results.tar.xz" -C "$out" .
}

case "${1:-}" in
  stage) stage "${2:?destination folder}" "${3:-}" ;;
  run) run ;;
  *) echo "usage: $0 stage DEST [REPO] | run" >&2; exit 2 ;;
esac
