#!/usr/bin/env bash
# The merged tree on the GPU in two calls: the suites + the Python package test (A), the
# real-model bench (B). Stage here: build-gpud (attnd gpu_daemon_e2e gpu_paged gpu_ops
# attnd-client, sm_90a) packed as build-carry/main.tar.xz, `run_gpu_python.sh stage` packed as
# build-carry/py.tar.xz; carry build-carry.
set -uo pipefail
cd "$(dirname "$0")/.."
W=/tmp/w; mkdir -p $W/main
[ -x $W/main/gpu_paged ] || tar -xJf build-carry/main.tar.xz -C $W/main
[ -d /tmp/stgpy ] || tar -xJf build-carry/py.tar.xz -C /tmp
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader; date -u +%FT%TZ
if [[ ${1:-A} == A ]]; then
  export LD_LIBRARY_PATH=$W/main/devlib
  timeout 120 $W/main/gpu_paged > $OUT/gpu_paged.log 2>&1; echo "gpu_paged rc=$? $(grep '^gpu_paged: [0-9]' $OUT/gpu_paged.log | tail -1)"
  timeout 100 $W/main/gpu_ops > $OUT/gpu_ops.log 2>&1; echo "gpu_ops rc=$? $(grep 'gpu_ops:' $OUT/gpu_ops.log | tail -1)"
  ATTND_BUILD_DIR=$W/main timeout 200 $W/main/gpu_daemon_e2e > $OUT/gpu_daemon_e2e.log 2>&1; echo "gpu_daemon_e2e rc=$? $(grep -a 'gpu_daemon_e2e:' $OUT/gpu_daemon_e2e.log | tail -1)"
  grep -a -h -E 'FAIL|indices|flip' $OUT/gpu_daemon_e2e.log | head -20
  unset LD_LIBRARY_PATH
  OUT=$OUT bash /tmp/stgpy/run_gpu_python.sh run test 2>&1 | tail -25
else
  OUT=$OUT bash /tmp/stgpy/run_gpu_python.sh run bench 2>&1 | tail -40
fi
