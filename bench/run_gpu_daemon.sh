#!/usr/bin/env bash
# One device call for the daemon on the GPU: the end-to-end test (tests/gpu/gpu_daemon_e2e.c)
# and the end-to-end benchmark (bench/bench_e2e.c), logs in $OUT.
#
# Build here (not on the device), then stage the binaries and their libraries:
#   cmake -S . -B build-gpud -DATTND_CUDA=ON \
#         -DATTND_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
#   cmake --build build-gpud -j2 --target attnd gpu_daemon_e2e bench_e2e
#   bench/run_gpu_daemon.sh --stage build-gpud build-gpud-dev
# and on the device (carry build-gpud-dev):
#   bench/run_gpu_daemon.sh build-gpud-dev [test] [anchors] [bench [bench args...]]
# (anchors: carry .anchors too, made by: mkdir -p .anchors && cp -r ../shared/anchors
#  ../shared/seeds .anchors/)
set -uo pipefail

if [[ ${1:-} == --stage ]]; then
    src=$2 dst=$3
    mkdir -p "$dst/daemon"
    cp "$src/daemon/attnd" "$dst/daemon/"
    cp "$src/tests/gpu/gpu_daemon_e2e" "$src/bench/bench_e2e" "$dst/"
    strip -g "$dst/daemon/attnd" "$dst/gpu_daemon_e2e" "$dst/bench_e2e"
    "$(dirname "$0")/../../shared/tools/bundle-libs" "$dst/devlib" "$dst/daemon/attnd" \
        "$dst/gpu_daemon_e2e" "$dst/bench_e2e"
    du -sh "$dst"
    exit 0
fi

bin=${1:?usage: run_gpu_daemon.sh BINDIR [test] [bench [args...]]}
shift
out=${OUT:-gpu-daemon-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ATTND_BUILD_DIR="$bin" # daemon_proc runs $ATTND_BUILD_DIR/daemon/attnd
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(test bench)

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader |
    tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/device.txt"
summary=()
i=0
while [[ $i -lt ${#steps[@]} ]]; do
    step=${steps[$i]}
    i=$((i + 1))
    case $step in
    test)
        timeout 280 "$bin/gpu_daemon_e2e" >"$out/gpu_daemon_e2e.log" 2>&1
        summary+=("test rc=$? $(grep -a 'gpu_daemon_e2e:' "$out/gpu_daemon_e2e.log" | tail -1)")
        grep -a -E 'FAIL|^daemon:|^device:|worst|step   0|step 100' "$out/gpu_daemon_e2e.log" | head -40
        ;;
    anchors)
        # the seed's Triton op on the same per-layer work (carry .anchors: anchors/ + seeds/)
        SEEDS_DIR=.anchors/seeds PYTHONUNBUFFERED=1 timeout 200 python3 bench/anchors_e2e.py \
            2>&1 | grep -v Warning | tee "$out/anchors_e2e.log"
        summary+=("anchors rc=${PIPESTATUS[0]}")
        ;;
    bench)
        args=()
        while [[ $i -lt ${#steps[@]} && ${steps[$i]} == --* ]]; do
            args+=("${steps[$i]}" "${steps[$((i + 1))]}")
            i=$((i + 2))
        done
        log="$out/bench_e2e.$i.log"
        echo "command: bench_e2e ${args[*]}" >"$log"
        timeout 200 "$bin/bench_e2e" "${args[@]}" >>"$log" 2>&1
        summary+=("bench rc=$?")
        cat "$log"
        ;;
    esac
done
printf '%s\n' "${summary[@]}"
