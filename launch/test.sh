#!/usr/bin/env bash
# Set up (idempotent) and run the test suite: bash launch/test.sh [pytest args]
#
# Without arguments, the whole suite: the unit tier (no server, no weights) on both cores, then the
# tiers that load models and start servers one test at a time (an idle SGLang scheduler busy-polls a
# core). Fails when any test fails. With arguments, one pytest run of them (`-m unit`: the fast tier).
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
"${PYTEST[@]}" -m "not unit" --durations=25 || rc=$?
exit $rc
