#!/usr/bin/env bash
# Build the fuzz target with clang (its own build tree, everything instrumented with ASan, UBSan
# and libFuzzer's coverage) and fuzz the request path for SECONDS, starting from fuzz/corpus and
# fuzz/regressions. New inputs go to BUILD/corpus (never into the repository); a crash is saved
# under BUILD/artifacts/ and fails the run: copy it into fuzz/regressions/ with the fix, so that
# fuzz_replay keeps checking it.
#   usage: run.sh SOURCE_DIR BUILD_DIR [SECONDS]
# Exit 77 (skipped) only when clang is not installed.
set -uo pipefail
src=${1:?usage: run.sh SOURCE_DIR BUILD_DIR [SECONDS]}
out=${2:?usage: run.sh SOURCE_DIR BUILD_DIR [SECONDS]}
secs=${3:-60}
cc=$(command -v clang || command -v clang-14 || true)
if [ -z "$cc" ]; then
    echo "SKIP: clang not found (scripts/setup.sh installs clang and libclang-rt-14-dev)"
    exit 77
fi
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
echo "fuzz: building with $cc in $out"
if ! cmake -S "$src" -B "$out" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DATTND_CUDA=OFF -DATTND_TESTS=OFF -DATTND_FUZZ=ON -DATTND_WERROR=OFF \
    "-DCMAKE_C_FLAGS=$san -fno-omit-frame-pointer" >"$out.configure.log" 2>&1; then
    cat "$out.configure.log"
    exit 1
fi
if ! cmake --build "$out" -j "$(nproc)" --target fuzz_request >"$out.build.log" 2>&1; then
    tail -50 "$out.build.log"
    exit 1
fi
mkdir -p "$out/corpus" "$out/artifacts"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "fuzz: fuzzing for $secs s"
"$out/fuzz/fuzz_request" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/" \
    "$out/corpus" "$src/fuzz/corpus" "$src/fuzz/regressions" 2>"$out/fuzz.log"
rc=$?
grep -E "^#[0-9]+.*(DONE|pulse)|^stat::number_of_executed_units|^stat::peak_rss|^Done" "$out/fuzz.log" | tail -6
if [ $rc -ne 0 ]; then
    echo "FAIL: the fuzzer stopped with $rc; its log:"
    tail -80 "$out/fuzz.log"
    ls -l "$out/artifacts/"
    exit 1
fi
echo "fuzz: no crash in $secs s ($(ls "$out/corpus" | wc -l) new corpus inputs)"
echo "1 passed, 0 failed"
