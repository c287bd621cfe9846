#!/usr/bin/env bash
# Install every Debian package attnd's build, tests and demo need. Safe to run twice.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git libuv1-dev libprotobuf-c-dev protobuf-c-compiler
      libnng-dev libjansson-dev libcriterion-dev python3 python3-numpy systemd
      libsystemd-dev python3-yaml clang libclang-rt-14-dev openssl python3-venv python3-cffi)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
echo "attnd: build dependencies present"
bash "$(dirname "$0")/setup_python.sh"
