#!/usr/bin/env bash
# Check the systemd units: `systemd-analyze verify` must pass with no message at all, the
# offline security exposure must stay at or under 2.0 ("OK"), and the sysusers entry must create
# the attnd user and group. The units' ExecStart names /usr/bin/attnd, which verify needs to
# exist: copies are checked with it rewritten to the binary given.
#   usage: verify-units.sh ATTND_BINARY [DEPLOY_DIR]
# Exit 77 (skipped) only when systemd-analyze is absent.
set -uo pipefail
bin=${1:?usage: verify-units.sh ATTND_BINARY [DEPLOY_DIR]}
src=$(cd "${2:-$(dirname "$0")}" && pwd)
if ! command -v systemd-analyze >/dev/null; then
    echo "SKIP: systemd-analyze not found (scripts/setup.sh installs the systemd package)"
    exit 77
fi
[ -x "$bin" ] || { echo "FAIL: $bin is not an executable"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for u in attnd.service attnd@.service; do
    grep -q '^ExecStart=/usr/bin/attnd ' "$src/$u" || { echo "FAIL: $u: ExecStart is not /usr/bin/attnd"; fail=1; }
    sed "s#/usr/bin/attnd#$bin#g" "$src/$u" >"$tmp/$u"
done

# 1. verify: the plain unit and an instance of the template; any output is a finding
out=$(cd "$tmp" && systemd-analyze verify --man=no "$tmp/attnd.service" "$tmp/attnd@0.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
    echo "FAIL: systemd-analyze verify (rc=$rc):"
    echo "$out"
    fail=1
else
    echo "ok: systemd-analyze verify attnd.service attnd@0.service"
fi

# 2. what the issue asks of the units, as directives
for u in attnd.service attnd@.service; do
    for want in '^Type=notify$' '^WatchdogSec=' '^Restart=on-failure$' '^NoNewPrivileges=yes$' \
        '^ProtectSystem=strict$' '^User=attnd$' '^RuntimeDirectory=attnd' '^ExecReload=/bin/kill -HUP \$MAINPID$'; do
        grep -q "$want" "$tmp/$u" || { echo "FAIL: $u lacks $want"; fail=1; }
    done
done
grep -q '^ExecStart=.* --config /etc/attnd/attnd-%i.json$' "$tmp/attnd@.service" ||
    { echo "FAIL: attnd@.service does not read /etc/attnd/attnd-%i.json"; fail=1; }

# 3. exposure (systemd-analyze security, offline): 2.0 or less
if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
    for u in attnd.service attnd@0.service; do
        out=$(cd "$tmp" && systemd-analyze security --offline=yes --threshold=20 "$tmp/$u" 2>&1)
        rc=$?
        level=$(echo "$out" | grep -o 'Overall exposure level for [^:]*: [0-9.]*' | awk '{print $NF}')
        if [ $rc -ne 0 ]; then
            echo "FAIL: $u exposure ${level:-?} is above 2.0:"
            echo "$out" | grep '✗'
            fail=1
        else
            echo "ok: $u exposure $level"
        fi
    done
else
    echo "note: this systemd-analyze has no --offline security check"
fi

# 4. sysusers: the user and group appear in an empty root
if command -v systemd-sysusers >/dev/null; then
    mkdir -p "$tmp/root/etc"
    : >"$tmp/root/etc/passwd"
    : >"$tmp/root/etc/group"
    if systemd-sysusers --root="$tmp/root" "$src/attnd.sysusers.conf" >"$tmp/sysusers.log" 2>&1 &&
        grep -q '^attnd:x:[0-9]*:[0-9]*:attnd attention daemon:/:/usr/sbin/nologin$' "$tmp/root/etc/passwd" &&
        grep -q '^attnd:x:' "$tmp/root/etc/group"; then
        echo "ok: attnd.sysusers.conf creates the attnd user and group"
    else
        echo "FAIL: attnd.sysusers.conf:"
        cat "$tmp/sysusers.log" "$tmp/root/etc/passwd" "$tmp/root/etc/group"
        fail=1
    fi
fi
# 5. the MPS control daemon's unit (nvidia-mps.service): verified with the NVIDIA tools stood in
# for by /bin/true; attnd's units join it through the same pipe directory
sed -e 's#/usr/bin/nvidia-cuda-mps-control#/bin/true#g' -e 's#/usr/bin/nvidia-smi#/bin/true#g' \
    "$src/nvidia-mps.service" >"$tmp/nvidia-mps.service"
out=$(cd "$tmp" && systemd-analyze verify --man=no "$tmp/nvidia-mps.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
    echo "FAIL: systemd-analyze verify nvidia-mps.service (rc=$rc):"
    echo "$out"
    fail=1
else
    echo "ok: systemd-analyze verify nvidia-mps.service"
fi
for want in '^ExecStart=/usr/bin/nvidia-cuda-mps-control -f$' '^RuntimeDirectory=nvidia-mps$' \
    '^Environment=CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps$' '^ExecStop=.*echo quit'; do
    grep -q "$want" "$src/nvidia-mps.service" || { echo "FAIL: nvidia-mps.service lacks $want"; fail=1; }
done
for u in attnd.service attnd@.service; do
    for want in '^Environment=CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps$' '^Wants=nvidia-mps.service$' \
        '^After=.*nvidia-mps.service'; do
        grep -q "$want" "$src/$u" || { echo "FAIL: $u lacks $want"; fail=1; }
    done
done
exit $fail
