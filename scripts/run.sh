#!/usr/bin/env bash
# Set up (first time only) and run a job: bash scripts/run.sh [hydra overrides]
# With no overrides: the default job (SFT + LoRA on a tiny model built locally, offline, on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-0}"
exec .venv/bin/python -m orchestrator.launch "$@"
