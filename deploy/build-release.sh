#!/usr/bin/env bash
# The container image's build step (deploy/Containerfile runs it in the CUDA devel image; the
# deploy_release_build test runs it here on the CPU): a Release build of attnd and attnctl, the
# files of the image under OUT, the Debian/Ubuntu packages the binaries need at run time in
# META/runtime-packages.txt, and a check that the image's default config is accepted.
#   usage: build-release.sh SOURCE_DIR BUILD_DIR OUT_DIR META_DIR [cmake args...]
set -euo pipefail
src=${1:?usage: build-release.sh SOURCE_DIR BUILD_DIR OUT_DIR META_DIR [cmake args...]}
build=${2:?} out=${3:?} meta=${4:?}
shift 4
# no test suites; warnings are not fatal: the image's compiler may differ from CI's
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTND_TESTS=OFF -DATTND_WERROR=OFF "$@"
cmake --build "$build" -j"$(nproc)" --target attnd attnctl
install -D -m 0755 "$build/daemon/attnd" "$out/usr/bin/attnd"
install -D -m 0755 "$build/client/attnctl" "$out/usr/bin/attnctl"
install -D -m 0644 "$src/deploy/attnd.container.json" "$out/etc/attnd/attnd.json"
mkdir -p "$meta"
for lib in $(ldd "$out/usr/bin/attnd" "$out/usr/bin/attnctl" | awk '/=> \// {print $3}' | sort -u); do
    p=$(readlink -f "$lib")
    { dpkg -S "$p" || dpkg -S "/usr$p" || dpkg -S "${p#/usr}"; } 2>/dev/null | head -1 | cut -d: -f1
done | sort -u >"$meta/runtime-packages.txt"
echo "runtime packages: $(tr '\n' ' ' <"$meta/runtime-packages.txt")"
grep -q '^libnng' "$meta/runtime-packages.txt" || { echo "FAIL: libnng is not among them"; exit 1; }
"$out/usr/bin/attnd" --version
"$out/usr/bin/attnd" --config "$out/etc/attnd/attnd.json" --check-config
