#!/usr/bin/env bash
# Makes (or reuses) the project's Python environment, .venv: torch, numpy, pytest and maturin
# from the package index, then builds and installs the conflux package from this checkout
# into it. Prints nothing on success but the install steps; safe to run again.
# torch from the default index brings its CUDA wheels (~3 GB): the first run takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CONFLUX_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "py-env: creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, numpy, pytest, maturin, setuptools" 2>/dev/null; then
  echo "py-env: installing torch, numpy, pytest, maturin, setuptools into $VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q torch numpy pytest maturin setuptools  # setuptools: the C++ backend's build
fi
# In-tree, without build isolation: maturin reuses this workspace's target/ incrementally.
echo "py-env: building and installing conflux (crates/conflux-py) into $VENV"
PATH="$(cd "$VENV" && pwd)/bin:$PATH" "$VENV/bin/pip" install -q --no-build-isolation --no-deps ./crates/conflux-py
# The torch backend in C++ (crates/conflux-py/csrc), compiled against this torch: about a
# minute on 2 cores, so only when its sources or torch changed since the last build.
STAMP="$VENV/.conflux-c10d"
WANT="$(cat crates/conflux-py/csrc/backend.cpp crates/conflux-py/csrc/conflux_c.h crates/conflux-py/csrc/setup.py | sha256sum | cut -c1-16) $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]] || ! "$VENV/bin/python" -c "import torch, conflux._c10d" 2>/dev/null; then
  echo "py-env: building the C++ torch backend (crates/conflux-py/csrc) against torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
  "$VENV/bin/pip" install -q --no-build-isolation --no-deps ./crates/conflux-py/csrc
  echo "$WANT" > "$STAMP"
fi
