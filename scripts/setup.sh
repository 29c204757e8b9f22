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
# torch through pip, which reads its own configuration (a local wheel folder, an index: where a CPU build is)
if .venv/bin/python -c "import torch" 2>/dev/null; then
  :  # keep the torch that is there
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
else
  # the CPU wheel: this pin is served as a CPU build where one is on hand; elsewhere PyPI's Linux
  # default is a multi-GB CUDA build, so point TORCH_INDEX_URL at a CPU wheel index to avoid it
  .venv/bin/python -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
# the project's ~190 packages through uv (42 s here, against 127 s through pip, the same versions); compiled to
# bytecode as pip does, or the test run's first processes (four xdist workers, their zygotes) each compile the
# stack at once; pip (upgraded first) when uv cannot be had or fails (a private index configured only for pip, say)
if .venv/bin/python -m pip install -q "uv==0.13.9" \
   && .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -c constraints.txt -e ".[test]"; then
  :
else
  echo "setup: uv could not install the project; installing it with pip instead" >&2
  .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
fi
rm -f .venv/.setup-*
touch "$STAMP"
echo "set-up done: $(.venv/bin/python -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)')"
