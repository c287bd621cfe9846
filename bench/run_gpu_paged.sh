#!/usr/bin/env bash
# One device call for the paged-attention kernels: correctness (full grid), compute-sanitizer
# memcheck + racecheck on the reduced grid, the benchmark, and the anchors in the same run.
#
# Build here (not on the device), then stage the binaries and their libraries:
#   cmake -S . -B build-cudapaged -DATTND_CUDA=ON \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-cudapaged -j2 --target gpu_paged bench_paged
#   bench/run_gpu_paged.sh --stage build-cudapaged build-cudapaged-dev
# and on the device (carry build-cudapaged-dev and .anchors):
#   bench/run_gpu_paged.sh build-cudapaged-dev [steps...]
# steps: test bench anchors sanitize (default), profile (ncu on $PROFILE_CASES, bench_paged --only
# keys). Logs go to $OUT (or ./gpu-paged-out).
set -uo pipefail

if [[ ${1:-} == --stage ]]; then
    src=$2 dst=$3
    mkdir -p "$dst"
    cp "$src/tests/gpu/gpu_paged" "$src/bench/bench_paged" "$dst/"
    strip -g "$dst/gpu_paged" "$dst/bench_paged"
    "$(dirname "$0")/../../shared/tools/bundle-libs" "$dst/devlib" "$dst/gpu_paged" "$dst/bench_paged"
    du -sh "$dst"
    exit 0
fi

bin=${1:?usage: run_gpu_paged.sh BINDIR [test] [sanitize] [bench] [anchors]}
shift
steps=${*:-test bench anchors sanitize}
out=${OUT:-gpu-paged-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/device.txt"

for step in $steps; do
    case $step in
    test)
        timeout 180 "$bin/gpu_paged" 2>&1 | tee "$out/gpu_paged.log" | grep -v '^ok ' | tail -40
        summary+=("full grid: $(grep '^gpu_paged: [0-9]' "$out/gpu_paged.log" | tail -1)")
        ;;
    sanitize)
        for tool in memcheck racecheck; do
            timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 99 "$bin/gpu_paged" --reduced \
                > "$out/sanitize_$tool.log" 2>&1
            rc=$?
            tail -4 "$out/sanitize_$tool.log"
            summary+=("$tool (reduced grid): rc=$rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log" | tail -1); $(grep '^gpu_paged: [0-9]' "$out/sanitize_$tool.log" | tail -1)")
        done
        ;;
    bench)
        timeout 150 "$bin/bench_paged" --sweep 2>&1 | tee "$out/bench.log"
        ;;
    profile)
        ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy"
        for c in ${PROFILE_CASES:-decode-bf16-1x32768 decode-fp8_e4m3-64x4096 prefill-1x8192}; do
            timeout 120 "$ncu" --clock-control none --kernel-name regex:attnd_paged --launch-skip 6 \
                --launch-count 2 $secs --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
                "$bin/bench_paged" --only "$c" --quick > "$out/ncu_$c.txt" 2>&1
            grep -E "attnd_paged|Duration|Throughput|Pipe|Registers|Achieved Occupancy|Issued Ipc|No Eligible|Stall|Shared" \
                "$out/ncu_$c.txt" | head -60
        done
        ;;
    anchors)
        timeout 240 python3 .anchors/anchors/bench_anchors.py 2>&1 | tee "$out/anchors.log" | tail -30
        ;;
    esac
done

echo "==== summary"
cat "$out/device.txt"
for s in "${summary[@]}"; do echo "$s"; done
[[ -f $out/bench.log ]] && sed -n '/^| case/,$p' "$out/bench.log"
[[ -f $out/anchors.log ]] && grep -E "^case=(decode|prefill|ceiling)" "$out/anchors.log"
exit 0
