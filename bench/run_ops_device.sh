#!/usr/bin/env bash
# One device call for issue 5 (merge / varlen / block-sparse / linear): correctness against the
# CPU backend, attnd timings, the seeds' anchors in the same call, then compute-sanitizer.
#
# Build here first (never on the device):
#   cmake -S . -B build-cudaops -DATTND_CUDA=ON \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-cudaops -j2 --target gpu_ops bench_ops
#   mkdir -p build-cudaops/dev && cp build-cudaops/tests/gpu/gpu_ops build-cudaops/bench/bench_ops build-cudaops/dev/
#   ../shared/tools/bundle-libs build-cudaops/dev/lib build-cudaops/dev/gpu_ops build-cudaops/dev/bench_ops
# then run with carry ["build-cudaops/dev", ".anchors"]:  bash bench/run_ops_device.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=build-cudaops/dev
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
STEPS=${STEPS:-"test bench anchors sanitize"}

date -u +%FT%TZ | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$OUT/device.txt"
for s in $STEPS; do
  case $s in
  test)
    echo "== gpu_ops"
    timeout 240 $D/gpu_ops ${GPU_OPS_ARGS:-} >"$OUT/gpu_ops.log" 2>&1
    echo "rc=$?"; grep -E "FAIL|gpu_ops:" "$OUT/gpu_ops.log" | head -40 ;;
  bench)
    echo "== bench_ops"
    timeout 150 $D/bench_ops 2>&1 | tee "$OUT/bench_ops.log" ;;
  old)
    # the previous FA core (one K and one V buffer, 64-key tiles), for comparison in the same call:
    # gpu_ops_old / bench_ops_old built from the previous varlen_kernel.cuh (one-off, RESULTS.md)
    echo "== gpu_ops_old (previous FA core)"
    timeout 200 $D/gpu_ops_old --only varlen >"$OUT/gpu_ops_old.log" 2>&1
    echo "rc=$?"; grep -E "FAIL|gpu_ops:" "$OUT/gpu_ops_old.log" | head -10
    timeout 100 $D/bench_ops_old varlen blocksparse 2>&1 | tee "$OUT/bench_ops_old.log" ;;
  anchors)
    echo "== anchors_ops.py"
    OUT= PYTHONUNBUFFERED=1 SEEDS_DIR=.anchors/seeds timeout 300 python3 bench/anchors_ops.py 2>&1 |
      grep -v Warning | tee "$OUT/anchors_ops.log" ;;
  sanitize)
    echo "== compute-sanitizer memcheck (gpu_ops --quick)"
    timeout 240 "$SAN" --tool memcheck --leak-check no --error-exitcode 3 $D/gpu_ops --quick \
      >"$OUT/sanitizer.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|gpu_ops:|FAIL" "$OUT/sanitizer.log" | head -20 ;;
  racecheck)
    echo "== compute-sanitizer racecheck (gpu_ops --quick)"
    timeout 150 "$SAN" --tool racecheck --error-exitcode 3 $D/gpu_ops --quick ${RACE_ARGS:-} \
      >"$OUT/racecheck.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|gpu_ops:|FAIL" "$OUT/racecheck.log" | head -20 ;;
  esac
done
