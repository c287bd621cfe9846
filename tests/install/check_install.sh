#!/usr/bin/env bash
# CTest install_consumer: `cmake --install` the build tree into a temporary prefix, then build a
# small C program (consumer/main.c) against what was installed, and only that: once through
# pkg-config (shared, and static with `pkg-config --static`), once through find_package(attnd)
# (attnd::client, attnd::client_static). Every program runs against the installed daemon.
#   usage: check_install.sh BUILD_DIR WORK_DIR CC CMAKE PKG_CONFIG [GENERATOR]
set -euo pipefail
build=${1:?usage: check_install.sh BUILD_DIR WORK_DIR CC CMAKE PKG_CONFIG [GENERATOR]}
work=${2:?} cc=${3:?} cmake=${4:?} pkgconfig=${5:?} generator=${6:-Unix Makefiles}
here=$(cd "$(dirname "$0")" && pwd)
prefix=$work/prefix
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
for f in bin/attnd bin/attnctl include/attnd/client.h include/attnd/npy.h include/attnd/err.h \
    include/attnd/dtype.h share/attnd/attnd.schema.json share/attnd/attnd.json \
    share/attnd/examples/llama-3-8b.json; do
    [ -f "$prefix/$f" ] || fail "$f was not installed"
done
pc=$(find "$prefix" -name attnd-client.pc)
[ -n "$pc" ] || fail "attnd-client.pc was not installed"
libdir=$(cd "$(dirname "$pc")/.." && pwd)
for f in libattnd-client.so libattnd-client.a cmake/attnd/attnd-config.cmake \
    cmake/attnd/attnd-config-version.cmake cmake/attnd/attnd-targets.cmake; do
    [ -e "$libdir/$f" ] || fail "lib/$f was not installed"
done
echo "ok: installed into $prefix (libdir $libdir)"
for conf in "$prefix"/share/attnd/attnd.json "$prefix"/share/attnd/examples/*.json; do
    "$prefix/bin/attnd" --config "$conf" --check-config >/dev/null ||
        fail "the installed attnd refuses $conf"
done
echo "ok: the installed attnd accepts the installed configs (share/attnd)"

# every public header compiles on its own, from the prefix alone
for h in client npy err dtype; do
    echo "#include <attnd/$h.h>" | "$cc" -std=c11 -Wall -Wextra -Werror -fsyntax-only \
        -I"$prefix/include" -x c - || fail "attnd/$h.h does not compile alone"
done
echo "ok: attnd/{client,npy,err,dtype}.h compile alone"

# the installed daemon, on a geometry consumer/main.c checks (f16 cache: v holds small integers, so out == v exactly)
sock=$(mktemp -u /tmp/attnd-install-XXXXXX.sock)
export ATTND_URL=ipc://$sock
cat >"$work/attnd.json" <<JSON
{"backend": "cpu", "threads": 1, "server": {"listen": "$ATTND_URL"},
 "geometry": {"num_layers": 2, "num_q_heads": 4, "num_kv_heads": 1, "head_size": 32,
              "block_size": 16, "cache_dtype": "f16", "num_blocks": 64, "max_blocks_per_seq": 16},
 "log": {"level": "warn", "stats_interval_s": 0}}
JSON
"$prefix/bin/attnd" --config "$work/attnd.json" >"$work/attnd.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -f "$sock"' EXIT
for _ in $(seq 100); do
    "$prefix/bin/attnctl" -t 1000 status >/dev/null 2>&1 && break
    kill -0 $daemon 2>/dev/null || { cat "$work/attnd.log"; fail "the installed attnd exited"; }
    sleep 0.2
done
"$prefix/bin/attnctl" status >/dev/null || { cat "$work/attnd.log"; fail "attnctl status"; }
echo "ok: the installed attnd serves $ATTND_URL (installed attnctl status)"

# run PROGRAM: the error helpers and a client alone, then one step through the daemon
run() {
    "$1" || fail "$1"
    "$1" --connect || fail "$1 --connect"
}
needs_lib() { readelf -d "$1" | grep -q 'NEEDED.*libattnd-client\.so'; }

# pkg-config, shared and static (the .a named explicitly: the .so sits beside it)
export PKG_CONFIG_PATH=$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
cflags=$("$pkgconfig" --cflags attnd-client)
libs=$("$pkgconfig" --libs attnd-client)
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $cflags "$here/consumer/main.c" -o "$work/pc_shared" \
    $libs -Wl,-rpath,"$libdir"
needs_lib "$work/pc_shared" || fail "pc_shared does not load libattnd-client.so"
run "$work/pc_shared"
static_libs=$("$pkgconfig" --static --libs attnd-client | sed 's/-lattnd-client\b/-l:libattnd-client.a/')
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $cflags "$here/consumer/main.c" -o "$work/pc_static" \
    $static_libs
needs_lib "$work/pc_static" && fail "pc_static loads libattnd-client.so"
run "$work/pc_static"
echo "ok: pkg-config: shared ($libs) and static ($static_libs)"

# find_package(attnd)
"$cmake" -S "$here/consumer" -B "$work/cmake" -G "$generator" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" || { cat "$work/cmake.log"; fail "configure"; }
"$cmake" --build "$work/cmake" >>"$work/cmake.log" || { cat "$work/cmake.log"; fail "build"; }
needs_lib "$work/cmake/consumer_shared" || fail "consumer_shared does not load libattnd-client.so"
needs_lib "$work/cmake/consumer_static" && fail "consumer_static loads libattnd-client.so"
run "$work/cmake/consumer_shared"
run "$work/cmake/consumer_static"
[ "$(cat "$work/cmake/attnd-path.txt")" = "$prefix/bin/attnd" ] ||
    fail "attnd::attnd is $(cat "$work/cmake/attnd-path.txt"), not $prefix/bin/attnd"
echo "ok: find_package(attnd): attnd::client, attnd::client_static, attnd::attnd"

kill -TERM $daemon
wait $daemon || fail "the installed attnd exited $? on SIGTERM"
trap 'rm -f "$sock"' EXIT
echo "all install checks passed"
