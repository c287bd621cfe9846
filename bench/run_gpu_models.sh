#!/usr/bin/env bash
# One device call for issue 15 (real models): gpu_paged (sinks, the f32 cache, every option
# against the cpu backend), gpu_daemon_e2e (per-layer options through the daemon, the f32-cache
# daemon against a cpu daemon), and bench_paged before and after (the same source, built from
# the commit before the change and from this one: decode and prefill of a model without
# per-layer options, alternated A B A B). Logs in $OUT.
#
# Build here (not on the device), then stage:
#   cmake -S . -B build-dev -DATTND_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-dev -j2 --target attnd gpu_paged gpu_daemon_e2e bench_paged
#   (the same for the commit before, into BEFORE: git archive REV | tar -x -C SRC; cmake ...
#    --target bench_paged)
#   bench/run_gpu_models.sh --stage build-dev BEFORE/bench/bench_paged ../main/build-models-dev
# and on the device (carry build-models-dev):
#   bash build-models-dev/run_gpu_models.sh [steps...]
# steps (default: smoke e2e bench1 full bench2): smoke (gpu_paged --reduced), e2e
# (gpu_daemon_e2e), bench1 / bench2 (bench_paged before then after / after then before), full
# (gpu_paged's full grid); the later steps get what time is left of BUDGET_S.
set -u

if [[ ${1:-} == --stage ]]; then
    src=$2 before=$3 dst=$4 tmp=$(mktemp -d)
    mkdir -p "$dst" "$tmp/daemon"
    strip -o "$tmp/gpu_paged" "$src/tests/gpu/gpu_paged"
    strip -o "$tmp/gpu_daemon_e2e" "$src/tests/gpu/gpu_daemon_e2e"
    strip -o "$tmp/bench_paged" "$src/bench/bench_paged"
    strip -o "$tmp/bench_paged_before" "$before"
    strip -o "$tmp/daemon/attnd" "$src/daemon/attnd"
    (cd "$tmp" && tar cf - gpu_paged gpu_daemon_e2e bench_paged bench_paged_before daemon) |
        xz -T2 -6 >"$dst/bins.tar.xz"
    "$(dirname "$0")/../../shared/tools/bundle-libs" "$dst/devlib" "$tmp/gpu_paged" \
        "$tmp/gpu_daemon_e2e" "$tmp/daemon/attnd" "$tmp/bench_paged"
    cp "$0" "$dst/run_gpu_models.sh"
    rm -rf "$tmp"
    du -sh "$dst"
    exit 0
fi

here=$(dirname "$0")
D=/tmp/attnd-models-bin
mkdir -p $D && tar xJf "$here/bins.tar.xz" -C $D && cp -r "$here/devlib" $D/
export LD_LIBRARY_PATH=$D/devlib
export ATTND_BUILD_DIR=$D # gpu_daemon_e2e starts $ATTND_BUILD_DIR/daemon/attnd
out=${OUT:-/tmp/out}
mkdir -p "$out"
budget=${BUDGET_S:-560} # the whole command's seconds
left() { echo $((budget - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
date -u +%FT%TZ
for s in ${*:-smoke e2e bench1 full bench2}; do
    case $s in
    smoke)
        echo "== gpu_paged --reduced"
        timeout 90 $D/gpu_paged --reduced --seed 15 >"$out/smoke.log" 2>&1
        echo "rc=$?"
        grep -aE "FAIL|note|gpu_paged:" "$out/smoke.log" | head -30
        ;;
    e2e)
        echo "== gpu_daemon_e2e"
        timeout 240 $D/gpu_daemon_e2e >"$out/e2e.log" 2>&1
        echo "rc=$?"
        grep -aE "FAIL|Hello reports|f32 cache|worst|daemon vs cpu|gpu_daemon_e2e:" "$out/e2e.log" | head -30
        ;;
    bench1 | bench2)
        order="before after"
        [ $s = bench2 ] && order="after before"
        t=$((($(left) - 20) / 2))
        [ $t -gt 90 ] && t=90
        [ $t -lt 20 ] && { echo "== $s skipped"; continue; }
        for v in $order; do
            b=$D/bench_paged$([ $v = before ] && echo _before)
            echo "== bench_paged $v ($s, timeout ${t}s)" | tee -a "$out/bench.log"
            timeout $t $b 2>&1 | tee -a "$out/bench.log" | grep -E "^(prefill|decode)"
        done
        ;;
    full)
        t=$(($(left) - 110)) # leaves bench2 its time
        [ $t -lt 30 ] && { echo "== full grid skipped: ${t}s left"; continue; }
        echo "== gpu_paged full grid (timeout ${t}s)"
        timeout $t $D/gpu_paged --seed 16 --verbose >"$out/full.log" 2>&1
        echo "rc=$?"
        grep -aE "FAIL|gpu_paged:" "$out/full.log" | head -30
        grep -ac "^ok" "$out/full.log"
        ;;
    esac
done
date -u +%FT%TZ
