#!/usr/bin/env bash
# Set up (idempotent) and run the test suite: bash launch/test.sh [pytest args]
#
# Without arguments, the whole suite: the unit tier (no server, no weights) on both cores; then the
# upstream tier (one shared server on its own port) beside the model tier (in-process engines, no fixed
# port), each one test at a time; then the server and soak tiers alone (their checks race requests
# against each other, so they get the machine to themselves). Fails when any test fails. With
# arguments, one pytest run of them (`-m unit`: the fast tier).
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
upstream_log=$(mktemp)
"${PYTEST[@]}" -m upstream --durations=10 >"$upstream_log" 2>&1 &
upstream=$!
"${PYTEST[@]}" -m model --durations=15 || rc=$?
wait $upstream || rc=$?
echo "== upstream tier (ran beside the model tier) =="
cat "$upstream_log"
rm -f "$upstream_log"
"${PYTEST[@]}" -m "server or soak" --durations=15 || rc=$?
exit $rc
