#!/usr/bin/env bash
# A/B of several bench_paged builds in one device call: each build runs each case (a
# `bench_paged --only` key: prefill-8x2048, decode-fp8_e4m3-64x4096, ...; prefill cases run
# their default kernel alone, `--off 0`, three rounds of 50 launches per invocation), the builds'
# order rotated every round so that drift and clocks favour none; the median of each build's
# figures per case last. A build differs only in what its kernels were compiled with (a source
# switch, a change under test): separate binaries, because a variant's code compiled in but
# switched off at run time still moves the figure (bench/RESULTS.md, fifth round).
#
# Here: one folder per build holding its stripped bench_paged, packed with `tar cJf
# DIR/bins.tar.xz base v1 ...` (static binaries of ~40 MB each: a call carries 64 MiB), and
# DIR/devlib from bundle-libs (or LD_LIBRARY_PATH set by the caller). On the device (carry DIR):
#   AB_BUILDS="base v1" AB_CASES="prefill-8x2048 decode-fp8_e4m3-64x4096" bash DIR/run_gpu_ab.sh DIR
# Output: one line per run (build, case, bench_paged's line), then
# "ab <case> <build> median <ms> ms <figure> (n runs, range)".
set -uo pipefail
dir=${1:?folder of the builds}
builds=(${AB_BUILDS:?builds to compare})
cases=${AB_CASES:-prefill-8x2048 prefill-1x8192}
rounds=${AB_ROUNDS:-3}
out=${OUT:-/tmp/out}
mkdir -p "$out"
bins=/tmp/ab-bins
rm -rf "$bins" && mkdir -p "$bins" && tar xJf "$dir/bins.tar.xz" -C "$bins" || exit 1
[ -d "$dir/devlib" ] && export LD_LIBRARY_PATH=$dir/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=$out/ab.log
: >"$log"
n=${#builds[@]}
for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < n; i++)); do
        b=${builds[$(((i + r) % n))]}
        for c in $cases; do
            extra=()
            [[ $c == prefill-* ]] && extra=(--off 0)
            timeout 120 "$bins/$b/bench_paged" --only "$c" "${extra[@]}" 2>&1 |
                grep -E "^(prefill|decode)" | sed "s/^/$b $c /" | tee -a "$log"
        done
    done
done
python3 - "$log" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if "ms" in f:
        i = f.index("ms")
        runs[(f[1], f[0])].append((float(f[i - 1]), float(f[i + 1]), f[i + 2]))
for (case, build), v in sorted(runs.items()):
    ms = statistics.median(x[0] for x in v)
    fig = statistics.median(x[1] for x in v)
    print(f"ab {case:26s} {build:8s} median {ms:8.4f} ms {fig:8.1f} {v[0][2]}  "
          f"({len(v)} runs, {min(x[1] for x in v):.1f}-{max(x[1] for x in v):.1f})")
PY
