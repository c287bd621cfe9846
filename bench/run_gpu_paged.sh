#!/usr/bin/env bash
# One device call for the paged-attention kernels: correctness against the cpu backend (sm90 and
# sm80 prefill cores), compute-sanitizer memcheck + racecheck on the reduced grid, the benchmark,
# and the anchors in the same run.
#
# Build here (not on the device), then stage the binaries (packed: three static-cudart programs
# with every kernel exceed what a call carries) with this script beside them:
#   cmake -S . -B build-dev -DATTND_CUDA=ON \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-dev -j2 --target gpu_paged bench_paged gpu_ops
#   bench/run_gpu_paged.sh --stage build-dev ../main/build-hopper-dev
# and on the device (carry build-hopper-dev and .anchors):
#   STEPS="smoke bench full full80 ops anchors sanitize" bash build-hopper-dev/run_gpu_paged.sh
# steps: smoke (reduced grid; stops the call on a failure), full / full80 (full grid, default /
# sm80 prefill core), ops (gpu_ops), bench / benchp (bench_paged / its prefill cases, with
# nvidia-smi clocks and power sampled), anchors, sanitize, profile (ncu on $PROFILE_CASES, keys
# of bench_paged --only). Logs go to $OUT (or /tmp/out).
set -u

if [[ ${1:-} == --stage ]]; then
    src=$2 dst=$3 tmp=$(mktemp -d)
    mkdir -p "$dst/devlib"
    for b in tests/gpu/gpu_paged bench/bench_paged tests/gpu/gpu_ops; do
        strip -o "$tmp/$(basename $b)" "$src/$b"
    done
    (cd "$tmp" && tar cf - gpu_paged bench_paged gpu_ops) | xz -T2 -6 >"$dst/bins.tar.xz"
    "$(dirname "$0")/../../shared/tools/bundle-libs" "$dst/devlib" "$tmp/gpu_paged" "$tmp/bench_paged"
    cp "$0" "$dst/run_gpu_paged.sh"
    rm -rf "$tmp"
    du -sh "$dst"
    exit 0
fi

here=$(dirname "$0")
D=/tmp/attnd-paged-bin
mkdir -p $D && tar xJf "$here/bins.tar.xz" -C $D && cp -r "$here/devlib" $D/
export LD_LIBRARY_PATH=$D/devlib
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
date -u +%FT%TZ
for s in ${STEPS:-smoke bench full full80 anchors sanitize}; do
    case $s in
    smoke)
        echo "== smoke (reduced)"
        timeout 90 $D/gpu_paged --reduced --verbose >"$out/smoke.log" 2>&1
        rc=$?
        echo "rc=$rc"
        grep -E "FAIL|note|gpu_paged:" "$out/smoke.log" | head -40
        if [ $rc -ne 0 ]; then
            echo "smoke failed: stopping"
            exit 0
        fi
        ;;
    bench | benchp)
        echo "== bench"
        nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
            --format=csv -lms 250 >"$out/smi.csv" 2>&1 &
        smi=$!
        only=""
        [ $s = benchp ] && only="--only prefill"
        timeout 200 $D/bench_paged $only 2>&1 | tee "$out/bench.log" | grep -E "^(prefill|decode)|bench_paged"
        kill $smi
        awk -F, 'NR>1 {print $2, $3, $4, $5}' "$out/smi.csv" | sort | uniq -c | sort -rn | head -12
        ;;
    full)
        echo "== full grid (default core)"
        timeout 240 $D/gpu_paged >"$out/full.log" 2>&1
        echo "rc=$?"
        grep -E "FAIL|gpu_paged:" "$out/full.log" | head -30
        ;;
    full80)
        echo "== full grid (sm80 prefill core)"
        timeout 240 $D/gpu_paged --core 80 >"$out/full80.log" 2>&1
        echo "rc=$?"
        grep -E "FAIL|gpu_paged:" "$out/full80.log" | head -20
        ;;
    ops)
        echo "== gpu_ops"
        timeout 240 $D/gpu_ops >"$out/gpu_ops.log" 2>&1
        echo "rc=$?"
        grep -E "FAIL|gpu_ops:" "$out/gpu_ops.log" | head -20
        ;;
    profile)
        ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        for c in ${PROFILE_CASES:-prefill-1x8192 prefill-8x2048}; do
            echo "== ncu $c"
            timeout 200 $ncu --clock-control none --kernel-name regex:sm90 --launch-skip 3 --launch-count 1 \
                --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
                --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters \
                $D/bench_paged --only $c --quick >"$out/ncu_$c.txt" 2>&1
            grep -E "Duration|Throughput|Issued Ipc|No Eligible|Eligible Warps|Hit Rate|Stall|pipeline" \
                "$out/ncu_$c.txt" | head -40
        done
        ;;
    anchors)
        echo "== anchors"
        timeout 240 python3 .anchors/anchors/bench_anchors.py >"$out/anchors.log" 2>&1
        grep -E "^case=(prefill|ceiling|decode)" "$out/anchors.log"
        ;;
    sanitize)
        for tool in memcheck racecheck; do
            echo "== $tool"
            timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 $D/gpu_paged --reduced \
                >"$out/san_$tool.log" 2>&1
            echo "rc=$?"
            grep -E "ERROR SUMMARY|RACECHECK SUMMARY|gpu_paged:" "$out/san_$tool.log" | head -8
        done
        ;;
    esac
done
exit 0
