#!/usr/bin/env bash
# Set up (first time only), start the services the tests need, run the test suite.
#   bash scripts/test.sh [pytest args]
# The S3 server (moto) and the MLflow server are started by the tests themselves
# on 127.0.0.1; a single-node Slurm cluster is started here (needs root and apt),
# Debian's chromium is installed when missing (root and apt too), and a service
# that cannot start fails the run rather than skipping tests.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache
# apt (Slurm, then Chromium: one apt at a time) and SkyPilot's venv are set up while pip sets up .venv
services() {
  if [ "${ORCH_SKIP_SLURM:-0}" != 1 ]; then
    bash .ci/slurm-up.sh || { echo "FATAL: the Slurm test cluster could not start (see above)." >&2; return 1; }
  fi
  # headless Chromium renders the MLflow UI for the browser test (tests/helpers/browser.py); Debian's package
  if ! command -v chromium >/dev/null 2>&1; then
    echo "installing chromium (apt) for the MLflow UI test"
    # the package lists Slurm's install just used first; a fresh apt-get update only if they do not have it
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
      || { echo "FATAL: could not install chromium with apt-get (needed by tests/e2e/test_final_weights_e2e.py)." >&2; return 1; }
    chromium --version >/dev/null 2>&1 || { echo "FATAL: chromium was installed but does not start." >&2; return 1; }
  fi
}
services > .cache/services.log 2>&1 &
SERVICES_PID=$!
# SkyPilot's own parser checks the generated task YAML; it pins an older click than
# this project's stack needs, so it gets a venv of its own
SKY_PID=
if [ ! -x .venv-skypilot/bin/python ] || ! .venv-skypilot/bin/python -c "import sky" 2>/dev/null; then
  { "${PYTHON:-python3.11}" -m venv .venv-skypilot && .venv-skypilot/bin/python -m pip install -q "uv==0.13.9" \
      && .venv-skypilot/bin/uv pip install -q --python .venv-skypilot/bin/python "skypilot==0.14.1"; } \
    > .cache/skypilot-venv.log 2>&1 &
  SKY_PID=$!
fi
bash scripts/setup.sh
export ORCH_CACHE_DIR="${ORCH_CACHE_DIR:-$PWD/.cache/test-models}"
# the tiny model is built before the tests start, not by the first tests
.venv/bin/python scripts/warm_caches.py > .cache/warm_caches.log 2>&1 &
WARM_PID=$!
if ! wait "$SERVICES_PID"; then
  cat .cache/services.log >&2
  exit 1
fi
cat .cache/services.log
if [ -n "$SKY_PID" ] && ! wait "$SKY_PID"; then
  cat .cache/skypilot-venv.log >&2
  echo "FATAL: could not install skypilot==0.14.1 into .venv-skypilot (needed by the SkyPilot render tests)." >&2
  exit 1
fi
wait "$WARM_PID" || true
cat .cache/warm_caches.log
echo "set-up and services ready after ${SECONDS} s"
# Four workers on two cores: a test waiting on a job (an outage, a heartbeat timeout, Slurm's scheduler) leaves
# its core to the others (each job's torch uses one thread, see tests/helpers/jobs.py), and with four the cores
# stay busy (96% of both in a run here, against 164% of 200 with three); tests that share a service that cannot
# take two at once (the one-node Slurm) are one xdist_group. The 25 slowest tests are listed at the end.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${ORCH_TEST_WORKERS:-4}" --dist loadgroup --durations=25 "$@"
