#!/usr/bin/env bash
# Rewrite the config-reference table of docs/configuration.md from the schemas (after adding or changing a config key):
#   bash scripts/readme_config_reference.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" scripts/config_reference.py > .cache/config-reference.md
"$PY" - <<'PYEOF'
import re
from pathlib import Path
readme = Path("docs/configuration.md")
text = readme.read_text()
table = Path(".cache/config-reference.md").read_text()
start = text.index("| key | type | default | meaning |", text.index("## Config reference"))
end = text.index("\n\n", start)
readme.write_text(text[:start] + table.rstrip("\n") + text[end:])
PYEOF
