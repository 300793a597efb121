#!/usr/bin/env bash
# Set up (idempotent) and run the test suite: bash launch/test.sh [pytest args]
#
# Without arguments, the whole suite on both cores: the unit tier (no server, no weights), then the tiers
# that load models and start servers, one test file per worker at a time (a file's servers keep their
# fixed ports; the upstream tier's files share one server, so they run on one worker: tests/conftest.py).
# Fails when any test fails. With arguments, one pytest run of them (`-m unit`: the fast tier).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
.venv/bin/python launch/models.py smollm2 >/dev/null
export OMP_NUM_THREADS=1
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
  exec "${PYTEST[@]}" --durations=15 "$@"
fi
rc=0
"${PYTEST[@]}" -m unit -n 2 --durations=10 || rc=$?
"${PYTEST[@]}" -m "not unit" -n 2 --dist loadgroup --durations=25 || rc=$?
exit $rc
