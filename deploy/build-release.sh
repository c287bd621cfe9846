#!/usr/bin/env bash
# The container image's build step (deploy/Containerfile runs it in the CUDA devel image; the
# deploy_release_build test runs it here on the CPU): a Release build, `cmake --install` of it
# under OUT (prefix /usr: attnd, attnctl, libattnd-client .so and .a, the headers,
# attnd-client.pc, the CMake package, share/attnd), the image's config, the Debian/Ubuntu
# packages the binaries and the library need at run time in META/runtime-packages.txt, and a
# check that the image's default config is accepted.
#   usage: build-release.sh SOURCE_DIR BUILD_DIR OUT_DIR META_DIR [cmake args...]
set -euo pipefail
src=${1:?usage: build-release.sh SOURCE_DIR BUILD_DIR OUT_DIR META_DIR [cmake args...]}
build=${2:?} out=${3:?} meta=${4:?}
shift 4
# no test suites; warnings are not fatal: the image's compiler may differ from CI's
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
    -DATTND_TESTS=OFF -DATTND_WERROR=OFF "$@"
cmake --build "$build" -j"$(nproc)" --target attnd attnctl attnd-client attnd_client_static
[ "$out" != / ] || { echo "FAIL: OUT_DIR is /"; exit 1; }
rm -rf "$out" # only what cmake --install puts there goes into the image
DESTDIR="$out" cmake --install "$build"
install -D -m 0644 "$src/deploy/attnd.container.json" "$out/etc/attnd/attnd.json"
lib=$(find "$out/usr" -name 'libattnd-client.so' -print -quit)
for f in usr/bin/attnd usr/bin/attnctl usr/include/attnd/client.h usr/include/attnd/err.h \
    usr/include/attnd/dtype.h usr/include/attnd/npy.h; do
    [ -f "$out/$f" ] || { echo "FAIL: cmake --install put no $f in the image"; exit 1; }
done
if [ -z "$lib" ] || [ ! -f "${lib%.so}.a" ] || [ ! -f "$(dirname "$lib")/pkgconfig/attnd-client.pc" ] ||
    [ ! -f "$(dirname "$lib")/cmake/attnd/attnd-config.cmake" ]; then
    echo "FAIL: the client library, its .pc or its CMake package is missing under $out"
    exit 1
fi
echo "image files: $(cd "$out" && find . -type f | wc -l) under $out (client library in ${lib#"$out"})"
mkdir -p "$meta"
for dep in $(ldd "$out/usr/bin/attnd" "$out/usr/bin/attnctl" "$lib" | awk '/=> \// {print $3}' | sort -u); do
    p=$(readlink -f "$dep")
    { dpkg -S "$p" || dpkg -S "/usr$p" || dpkg -S "${p#/usr}"; } 2>/dev/null | head -1 | cut -d: -f1
done | sort -u >"$meta/runtime-packages.txt"
echo "runtime packages: $(tr '\n' ' ' <"$meta/runtime-packages.txt")"
grep -q '^libnng' "$meta/runtime-packages.txt" || { echo "FAIL: libnng is not among them"; exit 1; }
"$out/usr/bin/attnd" --version
"$out/usr/bin/attnd" --config "$out/etc/attnd/attnd.json" --check-config
