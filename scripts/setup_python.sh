#!/usr/bin/env bash
# The Python environment of the package's tests (client/python/tests): a venv with torch (used
# on the CPU), transformers, pytest, cffi, ml_dtypes, numpy and scikit-build-core. It lives in
# $ATTND_VENV (default ~/.cache/attnd/venv) and is reused while its pins are unchanged, so only
# the first run downloads (~0.8 GB). client/CMakeLists.txt registers the Python tests when it
# finds it. ATTND_PYTHON_TESTS=0 skips it.
set -euo pipefail
[ "${ATTND_PYTHON_TESTS:-1}" = 0 ] && { echo "attnd: Python test venv skipped"; exit 0; }
venv=${ATTND_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/attnd/venv}
torch_pin=torch==2.11.0
# torch's pure-Python dependencies, then the rest (the device machine runs torch 2.11 and
# transformers 5.17 too)
pins=(filelock "typing-extensions>=4.10" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5"
      "numpy<3" transformers==5.17.0 "pytest>=7" "cffi>=1.15" "ml_dtypes>=0.4"
      "scikit-build-core>=0.10")
stamp="$venv/.attnd-pins"
want="$torch_pin ${pins[*]}"
py="$venv/bin/python"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
   "$py" -c "import torch, transformers, pytest, cffi, ml_dtypes" 2>/dev/null; then
  echo "attnd: Python test venv present ($venv)"
  exit 0
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv"
pip=("$py" -m pip install -q --disable-pip-version-check)
# PyPI's Linux torch wheel declares ~3 GB of CUDA libraries; importing it needs only the ones
# libtorch_cuda.so links. Where the system has the CUDA toolkit's libraries, three are missing;
# otherwise take torch with all its dependencies.
"${pip[@]}" --no-deps "$torch_pin"
"${pip[@]}" "${pins[@]}"
if ! "$py" -c "import torch" 2>/dev/null; then
  "${pip[@]}" --no-deps "nvidia-cufile==1.15.1.6.*" nvidia-cusparselt-cu13==0.8.0 \
    nvidia-nvshmem-cu13==3.4.5
fi
if ! "$py" -c "import torch" 2>/dev/null; then
  "${pip[@]}" "$torch_pin"
fi
"$py" -c "import torch, transformers; print('attnd: Python test venv: torch', torch.__version__, 'transformers', transformers.__version__)"
echo "$want" >"$stamp"
