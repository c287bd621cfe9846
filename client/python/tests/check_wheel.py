#!/usr/bin/env python3
"""CTest: build the wheel as `pip install ./client/python` would (scikit-build-core, the
library compiled into it), install it into a directory of its own and run the package's
client tests against the installed copy and its bundled library (nothing from the checkout)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)


def main() -> int:
    out = sys.argv[1]
    shutil.rmtree(out, ignore_errors=True)
    wheels, target = os.path.join(out, "dist"), os.path.join(out, "site")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "-q", "--no-build-isolation", "--no-deps", "-w", wheels,
                          PACKAGE], check=True)
    (wheel,) = glob.glob(os.path.join(wheels, "attnd-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "attnd/libattnd-client.so" in names, names
    print(f"{os.path.basename(wheel)}: {len(names)} files")
    subprocess.run(pip + ["install", "-q", "--no-deps", "--target", target, wheel], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("ATTND_CLIENT_LIB", "PYTHONPATH")}
    env.update(PYTHONPATH=target, ATTND_TEST_INSTALLED="1")
    probe = subprocess.run([sys.executable, "-c", "import attnd, attnd._lib as l; "
                            "print(attnd.__file__); print(next(l._candidates()))"],
                           env=env, capture_output=True, text=True, cwd=out, check=True)
    installed, lib = probe.stdout.split()
    assert installed.startswith(target) and lib.startswith(target), probe.stdout
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(HERE, "test_client.py")], env=env, cwd=out).returncode


if __name__ == "__main__":
    sys.exit(main())
