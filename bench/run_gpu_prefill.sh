#!/usr/bin/env bash
# One device call for the sm90 core's prefill paths (paged, varlen, block-sparse): correctness
# against the cpu backend, the benchmarks with their mma.sync comparisons, the anchors, and
# compute-sanitizer, in one script (bench/RESULTS.md, "varlen and block-sparse prefill on the
# sm90 core").
#
# Build here, then stage the four binaries (stripped, packed) with this script beside them:
#   cmake -S . -B build-dev -DATTND_CUDA=ON \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-dev -j2 --target gpu_ops bench_ops gpu_paged bench_paged
#   bench/run_gpu_prefill.sh --stage build-dev ../main/build-prefill-dev
# and on the device (carry build-prefill-dev and .anchors):
#   BENCH_WORDS="varlen blocksparse sm80 varlen blocksparse" \
#   STEPS="ops pagedfull bench benchp anchors sanp sanitize" bash build-prefill-dev/go.sh
# Sanitizer logs are named 0*.log so that they come back first. PAGED_ARGS / OPS_ARGS: extra
# arguments of gpu_paged / gpu_ops in their steps (e.g. "--sm90-off 2048": 3 CTAs, each running
# many tiles in a row, the sm90 core's chained tiles on every case). Also: STEPS sdpa (cuDNN and FA2
# SDPA at the two prefill shapes alone, quicker than the full anchors) and ncu (a source-level
# warp-stall profile of the head-128 prefill kernel per NCU_SHAPES, "8x2048 1x8192", packed with
# its SASS into ncu<skip>.tar.xz: a call brings back only a few files; NCU_SKIP: the sm90 launches
# skipped first, 5 by default: the first timed launch of bench_paged's first variant; each
# variant makes 55 launches) and ncuab (every sm90 launch of `bench_paged --quick --off AB_OFFS`
# per NCU_SHAPES timed by ncu one at a time, caches flushed: the median of each mask's 30 timed
# launches). Both leave the card's clocks alone (--clock-control none), as the device machine's
# method asks: earlier rounds' A/Bs at ncu's fixed base clocks are not repeatable there. STEPS
# kernels: attnd's prefill kernel (paged per NCU_SHAPES, and varlen 8x2048) against cuDNN's and
# FA2's SDPA kernels, three launches each under ncu at the same clocks: the same-call SDPA anchors
# timed with do_bench move 10% with the card's state (bench/RESULTS.md, fifth H200 session);
# kattnd: attnd's kernels alone (paged with shuffled and with in-order block tables, varlen), for
# A/Bs between stagings.
if [[ ${1:-} == --stage ]]; then
    src=$2 dst=$3 tmp=$(mktemp -d)
    mkdir -p "$dst/devlib"
    for b in tests/gpu/gpu_ops tests/gpu/gpu_paged bench/bench_ops bench/bench_paged; do
        strip -o "$tmp/$(basename $b)" "$src/$b"
    done
    (cd "$tmp" && tar cf - gpu_ops gpu_paged bench_ops bench_paged) | xz -T2 -6 >"$dst/bins.tar.xz"
    /work/shared/tools/bundle-libs "$dst/devlib" "$tmp/gpu_ops" "$tmp/bench_ops"
    cp "$0" "$dst/go.sh"
    rm -rf "$tmp"
    du -sh "$dst"
    exit 0
fi
set -u
here=$(dirname "$0")

# ktimes LABEL FLOPS KERNEL_REGEX SKIP COMMAND...: three launches of the kernel under ncu (the
# card's clocks, caches flushed before each), in us, and the fastest as TFLOP/s
ktimes() {
    local label=$1 fl=$2 re=$3 skip=$4
    shift 4
    timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum -k "regex:$re" -s "$skip" \
        -c 3 --csv --page raw "$@" 2>/dev/null >/tmp/kt.csv
    python3 - /tmp/kt.csv "$label" "$fl" <<'PY'
import csv, io, sys
t = open(sys.argv[1]).read(); i = t.find('"ID"')
rows = list(csv.reader(io.StringIO(t[i:]))) if i >= 0 else []
us = []
if len(rows) > 2:
    k = rows[0].index("gpu__time_duration.sum")
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[rows[1][k]]
    us = [float(r[k].replace(",", "")) * scale for r in rows[2:]]
line = " ".join(f"{x:9.1f}" for x in us)
fig = f"{float(sys.argv[3]) / min(us) / 1e6:7.1f} TFLOP/s (fastest)" if us else "no launch profiled"
print(f"kernels {sys.argv[2]:24s} {line} us  {fig}")
PY
}
# kattnd: attnd's paged kernel per NCU_SHAPES (shuffled and in-order block tables; KOFF: its
# switches, bench_paged --off) and varlen 8x2048 under ktimes
kattnd() {
    for sh in ${NCU_SHAPES:-8x2048 1x8192}; do
        local b=${sh%x*} L=${sh#*x}
        local fl=$((4 * b * 32 * 128 * L * L / 2))
        ktimes "attnd paged $sh" $fl attnd_paged_sm90 5 $D/bench_paged --only prefill-$sh --off ${KOFF:-0}
        ktimes "attnd paged $sh in order" $fl attnd_paged_sm90 5 $D/bench_paged --in-order --only prefill-$sh --off ${KOFF:-0}
    done
    ktimes "attnd varlen 8x2048" $((4 * 8 * 32 * 128 * 2048 * 2048 / 2)) attnd_paged_sm90 3 $D/bench_ops varlen
}
# PF_BIN: the four binaries already unpacked there (builds of an A/B packed together), else the
# staging's own, unpacked once
D=${PF_BIN:-/tmp/pf-bin}
sum=$(md5sum <"$here/bins.tar.xz")
if [[ -z ${PF_BIN:-} && "$(cat $D/.sum 2>/dev/null)" != "$sum" ]]; then
    rm -rf $D && mkdir -p $D && tar xJf "$here/bins.tar.xz" -C $D && cp -r "$here/devlib" $D/ &&
        echo "$sum" >$D/.sum
fi
export LD_LIBRARY_PATH=$D/devlib
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
date -u +%FT%TZ
for s in ${STEPS:-ops paged bench benchp anchors}; do
    t0=$(date +%s)
    case $s in
    ops) echo "== gpu_ops ${OPS_ARGS:-}"; timeout 200 $D/gpu_ops --seed ${SEED:-7} ${OPS_ARGS:-} >"$out/ops.log" 2>&1; echo "rc=$?"
        grep -E "FAIL|gpu_ops:" "$out/ops.log" | head -30 ;;
    opsq) echo "== gpu_ops --quick ${OPS_ARGS:-}"; timeout 100 $D/gpu_ops --quick ${OPS_ARGS:-} >"$out/opsq.log" 2>&1; echo "rc=$?"
        grep -E "FAIL|gpu_ops:" "$out/opsq.log" | head -30 ;;
    ops80) echo "== gpu_ops --core 80"; timeout 120 $D/gpu_ops --core 80 --only varlen >"$out/ops80.log" 2>&1; echo "rc=$?"
        grep -E "FAIL|gpu_ops:" "$out/ops80.log" | head -10 ;;
    paged) echo "== gpu_paged --reduced ${PAGED_ARGS:-}"; timeout 120 $D/gpu_paged --reduced ${PAGED_ARGS:-} >"$out/paged.log" 2>&1; echo "rc=$?"
        grep -E "FAIL|gpu_paged:" "$out/paged.log" | head -20 ;;
    pagedfull) echo "== gpu_paged ${PAGED_ARGS:-}"; timeout 240 $D/gpu_paged ${PAGED_ARGS:-} >"$out/pagedfull.log" 2>&1; echo "rc=$?"
        grep -E "FAIL|gpu_paged:" "$out/pagedfull.log" | head -20 ;;
    bench) echo "== bench_ops"; timeout 150 $D/bench_ops ${BENCH_WORDS:-varlen blocksparse sm80 varlen blocksparse} 2>&1 | tee "$out/bench_ops.log" | grep -E "case=|bench_ops" ;;
    benchp) echo "== bench_paged prefill"; timeout 120 $D/bench_paged --only prefill 2>&1 | tee "$out/bench_paged.log" | grep -E "^prefill|bench_paged" ;;
    anchors) echo "== anchors"; OUT= timeout 200 python3 .anchors/anchors/bench_anchors.py >"$out/anchors.log" 2>&1
        grep -E "^case=(prefill|varlen|blocksparse|ceiling)" "$out/anchors.log" ;;
    sdpa) echo "== SDPA cuDNN / FA2 prefill (the anchors' prefill shapes alone)"; timeout 120 python3 - <<'PY' 2>&1 | tee "$out/sdpa.log"
import torch, triton, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
for b, L in [(1, 8192), (8, 2048), (32, 2048)]:
    q = torch.randn(b, 32, L, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 8, L, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
        with sdpa_kernel(be):
            f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            f(); ms = triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")
        print(f"case=prefill sdpa-{name} b={b} L={L} | ms={ms:.4g} | TFLOPs={4*b*32*128*L*L/2/ms/1e9:.4g}")
PY
        ;;
    ncu) for sh in ${NCU_SHAPES:-8x2048}; do echo "== ncu prefill-$sh (skip ${NCU_SKIP:-5})"
            timeout 200 ncu --clock-control none --section SpeedOfLight --section SourceCounters --section WarpStateStats \
                --section SchedulerStats -k regex:attnd_paged_sm90 -s ${NCU_SKIP:-5} -c 1 -f -o "$out/ncu_$sh" \
                $D/bench_paged --only prefill-$sh >"$out/ncu_$sh.log" 2>&1; echo "rc=$?"
            ncu -i "$out/ncu_$sh.ncu-rep" --page details >"$out/ncu_${sh}_details.txt" 2>&1
            ncu -i "$out/ncu_$sh.ncu-rep" --page source --csv --print-source sass >"$out/ncu_${sh}_sass.csv" 2>&1
            grep -E "Duration|Issued Ipc|No Eligible|Warp Cycles Per Issued|Compute \(SM\)" "$out/ncu_${sh}_details.txt" | head -8
            mv "$out/ncu_$sh.ncu-rep" "$out/ncu_${sh}_details.txt" "$out/ncu_${sh}_sass.csv" /tmp/; done
        mkdir -p /tmp/cub && (cd /tmp/cub && cuobjdump -xelf all $D/bench_paged >/dev/null 2>&1)
        f=$(ls /tmp/cub/*paged_sm90_prefill_d128_bf16*.cubin | head -1); echo "cubin: $f"
        nvdisasm -gi -c "$f" >/tmp/sass_d128_paged.txt 2>&1
        (cd /tmp && tar cf - ncu_*_details.txt ncu_*_sass.csv sass_d128_paged.txt) | xz -T8 >"$out/ncu${NCU_SKIP:-5}.tar.xz"
        ls -la "$out/ncu${NCU_SKIP:-5}.tar.xz" ;;
    ncuab) for sh in ${NCU_SHAPES:-8x2048}; do echo "== ncu A/B prefill-$sh, masks ${AB_OFFS:-0,8192,16384}, the card's clocks"
            rm -f /tmp/ab_$sh.ncu-rep
            timeout 250 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:attnd_paged_sm90 -f -o /tmp/ab_$sh \
                $D/bench_paged --quick --only prefill-$sh --off ${AB_OFFS:-0,8192,16384} >"$out/ab_$sh.log" 2>&1; echo "rc=$?"
            ncu -i /tmp/ab_$sh.ncu-rep --csv --page raw --metrics gpu__time_duration.sum >"$out/ab_$sh.csv" 2>&1
            python3 - "$out/ab_$sh.csv" "${AB_OFFS:-0,8192,16384}" <<'PY'
import csv, statistics, sys
rows = list(csv.reader(open(sys.argv[1])))
h = next(i for i, r in enumerate(rows) if "gpu__time_duration.sum" in r)
col = rows[h].index("gpu__time_duration.sum")
unit = rows[h + 1][col]
t = [float(r[col].replace(",", "")) for r in rows[h + 2:] if len(r) > col and r[col]]
if unit == "ms": t, unit = [x * 1000 for x in t], "us"  # ms with one decimal hides 1% steps
offs = [int(x) for x in sys.argv[2].split(",")]
nv, per = len(offs), 15  # bench_paged --quick: 5 warm-up + 10 timed launches per variant run
print(f"launches {len(t)} (expected {3 * nv * per}), unit {unit}")
if len(t) != 3 * nv * per: sys.exit(1)
by = {v: [] for v in range(nv)}
for i in range(3 * nv):
    v = (i + i // nv) % nv
    by[v] += t[i * per + 5:(i + 1) * per]
base = statistics.median(by[0])
for v in range(nv):
    x = sorted(by[v]); m = statistics.median(x)
    print(f"ab off={offs[v]:<6} median {m:10.1f} {unit}  min {x[0]:10.1f}  p25 {x[len(x)//4]:10.1f}  p75 {x[3*len(x)//4]:10.1f}  vs off=0 {100*(m/base-1):+6.2f}%")
PY
        done ;;
    kernels) echo "== kernel for kernel at the card's clocks (ncu: one launch at a time, caches flushed)"
        cat >/tmp/sdpa_ncu.py <<'PY'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
b, L = map(int, sys.argv[1].split("x"))
q = torch.randn(b, 32, L, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, 8, L, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
be = SDPBackend.CUDNN_ATTENTION if sys.argv[2] == "cudnn" else SDPBackend.FLASH_ATTENTION
with sdpa_kernel(be):
    for _ in range(8): F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
torch.cuda.synchronize()
PY
        kattnd
        for sh in ${NCU_SHAPES:-8x2048 1x8192}; do
            b=${sh%x*} L=${sh#*x}; fl=$((4 * b * 32 * 128 * L * L / 2))
            ktimes "cudnn sdpa $sh" $fl '(?i)fprop' 4 python3 /tmp/sdpa_ncu.py $sh cudnn
            ktimes "fa2 sdpa $sh" $fl flash_fwd 4 python3 /tmp/sdpa_ncu.py $sh flash
        done ;;
    kattnd) echo "== attnd's kernels at the card's clocks (ncu, three launches each)"; kattnd ;;
    sanitize) for tool in memcheck racecheck; do for op in ${SAN_OPS:-varlen blocksparse}; do echo "== $tool gpu_ops --quick --only $op"
            timeout 100 compute-sanitizer --tool $tool --error-exitcode 99 $D/gpu_ops --quick --only $op ${OPS_ARGS:-} >"$out/0_${tool}_$op.log" 2>&1
            echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|gpu_ops:" "$out/0_${tool}_$op.log" | head -6; done; done ;;
    sanp) for tool in memcheck racecheck; do echo "== $tool gpu_paged --reduced"
            timeout 120 compute-sanitizer --tool $tool --error-exitcode 99 $D/gpu_paged --reduced ${PAGED_ARGS:-} >"$out/0p_$tool.log" 2>&1
            echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|gpu_paged:" "$out/0p_$tool.log" | head -6; done ;;
    esac
    echo "   ($s: $(( $(date +%s) - t0 )) s)"
done
exit 0
