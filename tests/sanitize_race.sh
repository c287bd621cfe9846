#!/usr/bin/env bash
# The data-trust suite (tests/test_data_trust.c: outputs overlapping inputs, index tensors and
# output regions flipped by a client thread while requests run, whole steps) against a daemon
# built with ASan + UBSan, in a build tree of its own: the daemon and that suite only (the
# suite's client side instrumented too). A sanitizer report ends the daemon (abort_on_error),
# which fails the suite: its requests lose their connection and its exit status is checked.
#   usage: sanitize_race.sh SOURCE_DIR BUILD_DIR [RACE_MS]
set -uo pipefail
src=${1:?usage: sanitize_race.sh SOURCE_DIR BUILD_DIR [RACE_MS]}
out=${2:?usage: sanitize_race.sh SOURCE_DIR BUILD_DIR [RACE_MS]}
export ATTND_RACE_MS=${3:-3000}
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
echo "sanitize_race: building attnd and test_data_trust with $san in $out"
if ! cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTND_CUDA=OFF \
    -DATTND_WERROR=OFF "-DCMAKE_C_FLAGS=$san" >"$out.configure.log" 2>&1; then
    cat "$out.configure.log"
    exit 1
fi
if ! cmake --build "$out" -j "$(nproc)" --target attnd test_data_trust >"$out.build.log" 2>&1; then
    tail -50 "$out.build.log"
    exit 1
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ATTND_BUILD_DIR="$out" "$out/tests/test_data_trust" --jobs 1
