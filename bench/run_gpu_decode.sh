#!/usr/bin/env bash
# One device call for the decode work of issue 12: correctness of a candidate build GP (gpu_paged
# full grid, --core 80 and compute-sanitizer memcheck / racecheck on --reduced, run side by side
# as separate processes, with full / memcheck / racecheck of each build in PAR_MORE: "par"; or one
# by one: full, full80, sanitize; gpu_daemon_e2e alone: "e2e"), then, alone on the GPU,
# bench_paged --only decode of several builds in alternating rounds ("bench"; a round NAMEab adds
# --ab: the split merged by tickets vs the reduce kernel), segment sweeps of the builds in SWEEP
# (cases SWEEP_ONLY), the decode anchors (the seed's decode cases and the copy ceiling of
# ../shared/anchors/bench_anchors.py) and ncu of each BUILD:CASE in PROF ("profile": speed of
# light, warp states with every stall reason, occupancy, instruction and memory statistics, SM
# active cycles min / avg / max; PROF_EXTRA: more ncu arguments, e.g. "--section PmSampling" for
# DRAM throughput and warps over the kernel's duration, not yet run); a per-CTA timeline of the
# cases in TL_ONLY from build TL (one built with -DATTND_DECODE_TIMELINE: "timeline", CSVs in
# logs.tgz); ncu source counters with the stall samples of every SASS instruction of each
# BUILD:CASE in SRCPROF ("srcprof", CSVs in logs.tgz). Prints a summary last and leaves all.txt
# and logs.tgz in $OUT (a call returns only a few files).
# Stage here (bench_paged_NAME of each build, gpu_paged_NAME where the build has it; e2e/ from
# the first build that has gpu_daemon_e2e):
#   bash bench/run_gpu_decode.sh --stage DEST fold=build-d base=build-base
# DEST an ignored build-* folder of the checkout the device call sends; there, carrying DEST
# and .anchors (fourth round, call 2):
#   STEPS="smoke par e2e bench sweep profile anchors" GP=fold ROUNDS="fold m32 c3 fold m32 c3" \
#       SWEEP="c3 fold" SWEEP_ONLY=decode-bf16-1x32768 \
#       PROF="fold:decode-bf16-1x32768 fold:decode-fp8_e4m3-64x4096" bash DEST/run_gpu_decode.sh
# gpu_daemon_e2e is a verdict alone or beside other GPU processes since it synchronises after
# poisoning its outputs (09347bf); before that, "par" with e2e beside it could read NaN.
set -u

if [[ ${1:-} == --stage ]]; then
    dst=$2 tmp=$(mktemp -d)
    shift 2
    mkdir -p "$dst"
    for nb in "$@"; do # NAME=BUILD_DIR
        name=${nb%%=*} build=${nb#*=}
        strip -o "$tmp/bench_paged_$name" "$build/bench/bench_paged"
        [ -f "$build/tests/gpu/gpu_paged" ] && strip -o "$tmp/gpu_paged_$name" "$build/tests/gpu/gpu_paged"
        [ -d "$tmp/e2e" ] || [ ! -f "$build/tests/gpu/gpu_daemon_e2e" ] && continue
        mkdir -p "$tmp/e2e/daemon" "$tmp/e2e/tests/gpu"
        strip -o "$tmp/e2e/daemon/attnd" "$build/daemon/attnd"
        strip -o "$tmp/e2e/tests/gpu/gpu_daemon_e2e" "$build/tests/gpu/gpu_daemon_e2e"
    done
    (cd "$tmp" && tar cf - .) | xz -T2 -6 >"$dst/bins.tar.xz"
    /work/shared/tools/bundle-libs "$dst/devlib" "$tmp"/*_* "$tmp/e2e/daemon/attnd" \
        "$tmp/e2e/tests/gpu/gpu_daemon_e2e" >/dev/null
    cp "$0" "$dst/run_gpu_decode.sh"
    rm -rf "$tmp"
    du -sh "$dst"
    exit 0
fi
here=$(dirname "$0")
D=/tmp/attnd-dec3
mkdir -p $D && tar xJf "$here/bins.tar.xz" -C $D && cp -r "$here/devlib" $D/
export LD_LIBRARY_PATH=$D/devlib
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
date -u +%FT%TZ
gp=$D/gpu_paged_${GP:-c2}
T0=$(date +%s)
for s in ${STEPS:-smoke par bench sweep anchors e2e}; do
    t0=$(date +%s)
    case $s in
    smoke)
        echo "== smoke (reduced, $gp)"
        timeout 60 $gp --reduced >"$out/smoke.log" 2>&1
        rc=$?; echo "rc=$rc"; grep -E "FAIL|gpu_paged:" "$out/smoke.log" | head -20
        [ $rc -ne 0 ] && { echo "smoke failed: stopping"; exit 0; } ;;
    smokes)
        # SMOKES: more builds' gpu_paged --reduced, side by side (a failing one is named, not fatal)
        for m in ${SMOKES:-}; do
            timeout 60 $D/gpu_paged_$m --reduced >"$out/smoke_$m.log" 2>&1 &
        done
        wait
        for m in ${SMOKES:-}; do
            echo "-- smoke $m"; grep -aE "FAIL|^gpu_paged:" "$out/smoke_$m.log" | head -8
        done ;;
    timeline)
        for c in ${TL_ONLY:-decode-bf16-1x32768}; do
            echo "== timeline $c (bench_paged_${TL:-tl})"
            TIMELINE_DIR=$out timeout 45 $D/bench_paged_${TL:-tl} --only $c --quick >"$out/tl_$c.log" 2>&1
            echo "rc=$?"; grep -A6 -E "^decode|timeline" "$out/tl_$c.log" | head -9
        done ;;
    srcprof)
        ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        for bc in ${SRCPROF:-}; do
            b=${bc%%:*} c=${bc#*:}
            echo "== ncu source counters $c (bench_paged_$b)"
            timeout 90 $ncu --clock-control none --kernel-name regex:"attnd_paged_kernel" --launch-skip 10 \
                --launch-count 1 --section SourceCounters --section WarpStateStats -f -o "$out/src_${b}_$c" \
                $D/bench_paged_$b --only $c --quick >"$out/src_${b}_$c.log" 2>&1
            echo "rc=$?"
            timeout 60 $ncu --import "$out/src_${b}_$c.ncu-rep" --page source --csv --print-source sass \
                >"$out/src_${b}_$c.csv" 2>&1
            echo "rc=$? $(wc -l <"$out/src_${b}_$c.csv") lines"
            rm -f "$out/src_${b}_$c.ncu-rep"
        done ;;
    full)
        echo "== full grid ($gp)"
        timeout 100 $gp >"$out/full.log" 2>&1
        echo "rc=$?"; grep -E "FAIL|gpu_paged:" "$out/full.log" | head -20 ;;
    full80)
        echo "== full grid --core 80 ($gp)"
        timeout 90 $gp --core 80 >"$out/full80.log" 2>&1
        echo "rc=$?"; grep -E "FAIL|gpu_paged:" "$out/full80.log" | head -20 ;;
    par)
        # correctness in parallel (separate processes on the one GPU; timings come later, alone):
        # $gp full, full80, memcheck, racecheck; each build of PAR_MORE full, memcheck, racecheck;
        # each of PAR_FULL its full grid
        echo "== parallel: full, full80, memcheck, racecheck ($gp; ${PAR_MORE:-} without full80)"
        logs="full full80 san_memcheck san_racecheck"
        timeout 150 $gp >"$out/full.log" 2>&1 &
        timeout 150 $gp --core 80 >"$out/full80.log" 2>&1 &
        timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 $gp --reduced >"$out/san_memcheck.log" 2>&1 &
        timeout 150 compute-sanitizer --tool racecheck --error-exitcode 99 $gp --reduced >"$out/san_racecheck.log" 2>&1 &
        for m in ${PAR_FULL:-}; do # PAR_FULL: more builds' full grid only
            timeout 150 $D/gpu_paged_$m >"$out/full_$m.log" 2>&1 &
            logs="$logs full_$m"
        done
        for m in ${PAR_MORE:-}; do
            g2=$D/gpu_paged_$m
            timeout 150 $g2 >"$out/full_$m.log" 2>&1 &
            timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 $g2 --reduced >"$out/san_memcheck_$m.log" 2>&1 &
            timeout 150 compute-sanitizer --tool racecheck --error-exitcode 99 $g2 --reduced >"$out/san_racecheck_$m.log" 2>&1 &
            logs="$logs full_$m san_memcheck_$m san_racecheck_$m"
        done
        wait
        for f in $logs; do
            echo "-- $f"; grep -aE "FAIL|^gpu_paged:|^gpu_daemon_e2e:|ERROR SUMMARY|RACECHECK SUMMARY" "$out/$f.log" | head -8
        done ;;
    sanitize)
        for tool in memcheck racecheck; do
            echo "== $tool (reduced, $gp)"
            timeout 80 compute-sanitizer --tool $tool --error-exitcode 99 $gp --reduced >"$out/san_$tool.log" 2>&1
            echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|gpu_paged:" "$out/san_$tool.log" | head -6
        done ;;
    bench)
        for r in ${ROUNDS:-base c2ab c2 base c2}; do
            args="--only decode"; b=$D/bench_paged_$r
            case $r in *ab) b=$D/bench_paged_${r%ab}; args="--only decode --ab" ;; esac
            echo "== bench $r"
            timeout 45 $b $args >>"$out/bench_$r.log" 2>&1
            grep -E "^(decode|    ab)|fp8 / bf16" "$out/bench_$r.log" | tail -22 | sed 's/ (sets=.)//' 
        done ;;
    sweep)
        # SWEEP_ONLY: one or more case substrings, each swept on its own
        for b in ${SWEEP:-c2}; do
            for c in ${SWEEP_ONLY:-decode-bf16}; do
                echo "== sweep (bench_paged_$b --sweep, $c)"
                timeout 60 $D/bench_paged_$b --only $c --sweep --quick >>"$out/sweep_$b.log" 2>&1
                echo "rc=$?"; grep -E "^decode|sweep" "$out/sweep_$b.log" | tail -16
            done
        done ;;
    anchors)
        echo "== anchors (seed decode, copy ceiling)"
        a=.anchors/anchors/bench_anchors.py
        { sed -n '1,/^# prefill: paged/p' $a | grep -vE '^(mg|fa|bsp) = load'
          grep -E '^x = torch.randn\(1 << 30|ceiling d2d copy' $a
          sed -n '/^for r in res:/,$p' $a; } >"$out/decode_anchors.py"
        PYTHONPATH=$PWD/.anchors/anchors timeout 100 python3 "$out/decode_anchors.py" >"$out/anchors.log" 2>&1
        echo "rc=$?"; grep -E "^case=" "$out/anchors.log" ;;
    e2e)
        echo "== gpu_daemon_e2e (e2e/, alone)"
        ATTND_BUILD_DIR=$D/e2e timeout 60 $D/e2e/tests/gpu/gpu_daemon_e2e >"$out/e2e.log" 2>&1
        echo "rc=$?"; grep -aE "FAIL|^gpu_daemon_e2e:" "$out/e2e.log" | head -10 ;;
    profile)
        # PROF: "BUILD:CASE ..." (one launch of each, after 10)
        ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        stalls=""
        for r in long_scoreboard barrier membar short_scoreboard wait math_pipe_throttle lg_throttle \
            mio_throttle no_instruction branch_resolving dispatch_stall drain sleeping selected \
            not_selected imc_miss tex_throttle misc; do
            stalls="$stalls${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
        done
        for bc in ${PROF:-b2:decode-bf16-1x32768}; do
            b=${bc%%:*} c=${bc#*:}
            echo "== ncu $c (bench_paged_$b)"
            timeout 90 $ncu --clock-control none --kernel-name regex:"attnd_paged_(kernel|reduce)" --launch-skip 10 \
                --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
                --section LaunchStats --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis \
                --metrics "$stalls,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,gpc__cycles_elapsed.max" \
                ${PROF_EXTRA:-} \
                $D/bench_paged_$b --only $c --quick >"$out/ncu_${b}_$c.txt" 2>&1
            grep -E "attnd_paged|Duration|DRAM Throughput|No Eligible|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |Achieved Occupancy|Registers Per|sm__cycles_active|gpc__cycles" \
                "$out/ncu_${b}_$c.txt" | head -24
            grep -E "issue_stalled" "$out/ncu_${b}_$c.txt" | sort -k3 -g -r | head -8
        done ;;
    esac
    echo "($s: $(($(date +%s) - t0)) s, total $(($(date +%s) - T0)) s)"
done 2>&1 | tee "$out/all.txt"
echo "==== SUMMARY"
grep -aE "^== |^-- |^rc=|FAIL|gpu_paged:|gpu_daemon_e2e:|ERROR SUMMARY|RACECHECK SUMMARY|^case=" "$out/all.txt" | head -60
(cd "$out" && tar czf logs.tgz *.log *.txt *.csv 2>/dev/null && rm -f *.log *.csv decode_anchors.py anchors.json)
exit 0
