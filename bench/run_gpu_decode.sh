#!/usr/bin/env bash
# One device call for the decode tiles (issue 12): correctness against the cpu backend, the decode
# benchmark of several builds in alternating rounds, the decode anchors (the seed's decode and
# the copy ceiling of ../shared/anchors/bench_anchors.py) and compute-sanitizer, in one call.
#
# Build here, then stage: the binaries travel packed, with this script beside them.
#   cmake -S . -B build-dec -DATTND_CUDA=ON \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-dec -j2 --target gpu_paged bench_paged
#   bench/run_gpu_decode.sh --stage DIR build-dec/tests/gpu/gpu_paged build-dec/bench/bench_paged \
#       [other builds' binaries, named bench_paged_<name> / gpu_paged_<name>]
# DIR inside the checkout the device call sends (an ignored build-* folder); on the device, carry
# DIR and .anchors:
#   STEPS="smoke bench anchors full full80 sanitize" ROUNDS="new base new" bash DIR/run_gpu_decode.sh
# ROUNDS: bench_paged --only decode of the build named (new: bench_paged, else bench_paged_NAME);
# GP: the gpu_paged build the full grid and the sanitizers run (default gpu_paged); profile: ncu
# on $PROFILE_CASE (decode kernel and reduce). Logs go to $OUT (or /tmp/out).
set -u

if [[ ${1:-} == --stage ]]; then
    dst=$2 tmp=$(mktemp -d)
    shift 2
    mkdir -p "$dst"
    for b in "$@"; do strip -o "$tmp/$(basename "$b")" "$b"; done
    (cd "$tmp" && tar cf - *) | xz -T2 -6 >"$dst/bins.tar.xz"
    "$(dirname "$0")/../../shared/tools/bundle-libs" "$dst/devlib" "$tmp"/*
    cp "$0" "$dst/run_gpu_decode.sh"
    rm -rf "$tmp"
    du -sh "$dst"
    exit 0
fi

here=$(dirname "$0")
D=/tmp/attnd-dec-bin
mkdir -p $D && tar xJf "$here/bins.tar.xz" -C $D && cp -r "$here/devlib" $D/
export LD_LIBRARY_PATH=$D/devlib
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader
date -u +%FT%TZ
gp=$D/${GP:-gpu_paged}
for s in ${STEPS:-smoke bench anchors full full80 sanitize}; do
    t0=$(date +%s)
    case $s in
    smoke)
        echo "== smoke (reduced)"
        timeout 60 $gp --reduced --verbose >"$out/smoke.log" 2>&1
        rc=$?
        echo "rc=$rc"; grep -E "FAIL|gpu_paged:" "$out/smoke.log" | head -30
        [ $rc -ne 0 ] && { echo "smoke failed: stopping"; exit 0; } ;;
    bench)
        for r in ${ROUNDS:-new base new}; do
            b=$D/bench_paged; [ $r != new ] && b=$D/bench_paged_$r
            echo "== bench $r"
            timeout 45 $b --only decode 2>&1 | tee -a "$out/bench_$r.log" | grep -E "^(decode|\|)"
        done ;;
    anchors)
        # the decode part of the shared anchors and their copy ceiling, verbatim
        echo "== anchors (seed decode, copy ceiling)"
        a=.anchors/anchors/bench_anchors.py
        { sed -n '1,/^# prefill: paged/p' $a | grep -vE '^(mg|fa|bsp) = load'
          grep -E '^x = torch.randn\(1 << 30|ceiling d2d copy' $a
          sed -n '/^for r in res:/,$p' $a; } >"$out/decode_anchors.py"
        PYTHONPATH=$PWD/.anchors/anchors timeout 100 python3 "$out/decode_anchors.py" >"$out/anchors.log" 2>&1
        echo "rc=$?"; grep -E "^case=" "$out/anchors.log" ;;
    full)
        echo "== full grid ($gp)"
        timeout 110 $gp >"$out/full.log" 2>&1
        echo "rc=$?"; grep -E "FAIL|gpu_paged:" "$out/full.log" | head -20 ;;
    full80)
        echo "== full grid --core 80 ($gp)"
        timeout 90 $gp --core 80 >"$out/full80.log" 2>&1
        echo "rc=$?"; grep -E "FAIL|gpu_paged:" "$out/full80.log" | head -20 ;;
    sanitize)
        for tool in memcheck racecheck; do
            echo "== $tool (reduced, $gp)"
            timeout 100 compute-sanitizer --tool $tool --error-exitcode 99 $gp --reduced >"$out/san_$tool.log" 2>&1
            echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|gpu_paged:" "$out/san_$tool.log" | head -6
        done ;;
    profile)
        ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        echo "== ncu ${PROFILE_CASE:-decode-bf16-1x32768}"
        timeout 90 $ncu --clock-control none --kernel-name regex:"attnd_paged_(kernel|reduce)" --launch-skip 10 \
            --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
            --section MemoryWorkloadAnalysis $D/bench_paged --only ${PROFILE_CASE:-decode-bf16-1x32768} --quick \
            >"$out/ncu.txt" 2>&1
        grep -E "attnd_paged|Duration|DRAM Throughput|Issued Ipc|No Eligible|Eligible Warps|Warp Cycles Per Issued|Hit Rate" \
            "$out/ncu.txt" | head -30 ;;
    esac
    echo "($s: $(($(date +%s) - t0)) s)"
done
exit 0
