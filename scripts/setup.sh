#!/usr/bin/env bash
# Create .venv (once) and install the project into it: torch first (the CPU wheel
# where there is no NVIDIA GPU, the default CUDA build where there is one), then
# the project with the versions it was tested with (constraints.txt), through uv.
#   bash scripts/setup.sh          # idempotent: a second run only checks
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
STAMP=.venv/.setup-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ -f "$STAMP" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# uv installs the packages: torch in 12 s and the project's ~190 packages in 42 s here, against 15 s and 127 s
# through pip, the same versions; compiled to bytecode as pip does, or the test run's first processes (four xdist
# workers, their zygotes) each compile the stack at once. pip when uv cannot be had or fails (a private index
# configured only for pip, say). A wheel folder pip is pointed at (PIP_FIND_LINKS) is uv's too.
UV=
.venv/bin/python -m pip install -q "uv==0.13.9" && UV=.venv/bin/uv
install() {
  if [ -n "$UV" ] && "$UV" pip install -q --compile-bytecode --python .venv/bin/python \
       ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} "$@"; then
    return 0
  fi
  echo "setup: uv could not install $*; installing it with pip instead" >&2
  .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q "$@"
}
if .venv/bin/python -c "import torch" 2>/dev/null; then
  :  # keep the torch that is there
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  install -c constraints.txt "torch==2.13.0"  # the default (CUDA) build
else
  # the CPU wheel: this pin is served as a CPU build where one is on hand; elsewhere PyPI's Linux
  # default is a multi-GB CUDA build, so point TORCH_INDEX_URL at a CPU wheel index to avoid it
  install -c constraints.txt "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
install -c constraints.txt -e ".[test]"
rm -f .venv/.setup-*
touch "$STAMP"
echo "set-up done: $(.venv/bin/python -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)')"
