#!/usr/bin/env bash
# The merged tree on the GPU machine in two calls: correctness (A) and figures (B).
#   A: gpu_paged (sm90 and --core 80 grids), gpu_ops, gpu_daemon_e2e, then under NVIDIA MPS the
#      Python package's CUDA tests (test_client, test_stream, test_transformers);
#   B: compute-sanitizer memcheck + racecheck (gpu_paged --reduced, gpu_ops varlen and
#      block-sparse), bench_paged (prefill and decode), bench_ops (varlen, block-sparse) and the
#      anchors (../shared/anchors copied to .anchors) in the same call.
#   Step "few" (not in A or B): the sanitizers on varlen and gpu_paged --reduced with the sm90
#      core on 3 CTAs (--sm90-off 2048), each CTA taking many work tiles; gpu_paged with 10240 (the
#      general instantiation, which chains them) too (varlen has no general instantiation).
# Here (the build machine):
#   cmake -S . -B build-final -DATTND_CUDA=ON \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-final -j2 --target attnd attnd-client gpu_paged gpu_ops gpu_daemon_e2e \
#         bench_paged bench_ops
#   bash bench/run_gpu_merged.sh stage build-final /work/main/build-merged-dev
# On the device (carry build-merged-dev, and .anchors for B):
#   bash build-merged-dev/run_gpu_merged.sh A      (or B; STEPS="e2e python ..." picks steps)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

stage() {
  local build=$1 dest=$2 root tmp
  root=$(cd "$here/.." && pwd)
  BUILD_CUDA=$build bash "$root/bench/run_gpu_python.sh" stage "$dest/py" "$root" >/dev/null
  rm -rf "$dest/py/attnd" "$dest/py/devlib" # the daemon travels packed below, its libraries too
  tmp=$(mktemp -d)
  for b in tests/gpu/gpu_paged tests/gpu/gpu_ops tests/gpu/gpu_daemon_e2e bench/bench_paged \
           bench/bench_ops daemon/attnd; do
    mkdir -p "$tmp/$(dirname "$b")" && strip -o "$tmp/$b" "$build/$b"
  done
  (cd "$tmp" && tar cf - .) | xz -T2 -6 >"$dest/bins.tar.xz"
  /work/shared/tools/bundle-libs "$dest/devlib" "$tmp/tests/gpu/gpu_daemon_e2e" "$tmp/bench/bench_ops" \
      "$tmp/daemon/attnd" "$dest/py/python/attnd/libattnd-client.so" >/dev/null
  cp "$0" "$dest/run_gpu_merged.sh"
  rm -rf "$tmp"
  du -sh "$dest"
}

step() {  # name, timeout, command...: run it, log to $out/<name>.log, print the summary lines
  local name=$1 t=$2 t0
  shift 2
  t0=$(date +%s)
  echo "== $name"
  timeout "$t" "$@" >"$out/$name.log" 2>&1
  echo "rc=$? ($(($(date +%s) - t0)) s)"
  grep -a -E "FAIL|^(gpu_paged|gpu_ops|gpu_daemon_e2e):|ERROR SUMMARY|RACECHECK SUMMARY" \
    "$out/$name.log" | head -12
}

mps() {  # on | off
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/attnd-mps CUDA_MPS_LOG_DIRECTORY=/tmp/attnd-mps-log
  if [ "$1" = on ]; then
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d
  else
    echo quit | nvidia-cuda-mps-control
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}

python_tests() {
  local py=$here/py deps=/tmp/attnd-pydeps
  python3 -c "import cffi, pytest" 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links "$py/wheels" --target "$deps" cffi pycparser pytest
  mps on
  echo "== python tests on the CUDA backend, under MPS"
  (export LD_LIBRARY_PATH=$here/devlib PYTHONPATH=$py/python:$deps ATTND_TEST_BACKEND=cuda \
     ATTND_TEST_DEVICE=cuda ATTND_CLIENT_LIB=$py/python/attnd/libattnd-client.so \
     ATTND_DAEMON=$D/daemon/attnd
   cd "$py/python/tests" && timeout 400 python3 -m pytest -q -p no:cacheprovider -rfs \
     "test_client.py::test_a_registered_cuda_tensor_goes_back_to_torch" \
     "test_client.py::test_registering_memory_that_is_not_cuda_fails_cleanly" \
     test_stream.py test_transformers.py 2>&1 | tee "$out/python.log" | tail -25)
  mps off
}

run() {
  local what=$1 D=/tmp/merged
  out=${OUT:-/tmp/out}
  mkdir -p "$out" "$D"
  [ -x $D/tests/gpu/gpu_paged ] || tar -xJf "$here/bins.tar.xz" -C $D
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
  date -u +%FT%TZ
  export LD_LIBRARY_PATH=$here/devlib
  for s in ${STEPS:-$([ "$what" = A ] && echo "$STEPS_A" || echo "$STEPS_B")}; do
    case $s in
    paged) step gpu_paged 240 $D/tests/gpu/gpu_paged ;;
    paged80) step gpu_paged_80 240 $D/tests/gpu/gpu_paged --core 80 ;;
    ops) step gpu_ops 200 $D/tests/gpu/gpu_ops ;;
    e2e) ATTND_BUILD_DIR=$D step gpu_daemon_e2e 200 $D/tests/gpu/gpu_daemon_e2e ;;
    python) (unset LD_LIBRARY_PATH; python_tests) ;;
    san) for tool in memcheck racecheck; do
        step "0_${tool}_paged" 150 compute-sanitizer --tool $tool --error-exitcode 99 \
          $D/tests/gpu/gpu_paged --reduced
        for op in varlen blocksparse; do
          step "0_${tool}_$op" 100 compute-sanitizer --tool $tool --error-exitcode 99 \
            $D/tests/gpu/gpu_ops --quick --only $op
        done
      done ;;
    few) # the sm90 core with 3 CTAs (--sm90-off 2048): every test case chains work tiles
      step 0_racecheck_varlen_few 120 compute-sanitizer --tool racecheck --error-exitcode 99 \
        $D/tests/gpu/gpu_ops --quick --only varlen --sm90-off 2048
      step 0_memcheck_varlen_few 120 compute-sanitizer --tool memcheck --error-exitcode 99 \
        $D/tests/gpu/gpu_ops --quick --only varlen --sm90-off 2048
      step gpu_paged_few 150 $D/tests/gpu/gpu_paged --reduced --sm90-off 2048
      # the general instantiation (8192) on 3 CTAs: the plain kernel never chains work tiles
      step gpu_paged_few_general 150 $D/tests/gpu/gpu_paged --reduced --sm90-off 10240 ;;
    bench) echo "== bench_paged"
      timeout 200 $D/bench/bench_paged 2>&1 | tee "$out/bench_paged.log" | grep -E "^(prefill|decode)"
      echo "== bench_ops varlen blocksparse"
      timeout 150 $D/bench/bench_ops varlen blocksparse 2>&1 | tee "$out/bench_ops.log" | grep -E "case=" ;;
    anchors) echo "== anchors"
      timeout 240 python3 .anchors/anchors/bench_anchors.py >"$out/anchors.log" 2>&1
      grep -E "^case=(prefill|varlen|blocksparse|ceiling|decode)" "$out/anchors.log" ;;
    esac
  done
}

STEPS_A="paged paged80 ops e2e python"
STEPS_B="san bench anchors"

case "${1:-}" in
  stage) stage "${2:?build folder}" "${3:?destination folder}" ;;
  A | B) run "$1" ;;
  *) echo "usage: $0 stage BUILD DEST | A | B" >&2; exit 2 ;;
esac
