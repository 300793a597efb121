#!/usr/bin/env bash
# Set up (idempotent) and run the test suite: bash launch/test.sh [pytest args]
#
# Without arguments, the whole suite in two lanes, one per core, each one test at a time:
#   lane A: the unit and soak tiers (no server, no weights), then the model tier (in-process engines);
#   lane B: the upstream tier (one shared server on its own port), then the model-tier files in LANE_B,
#           chosen so both lanes take about 11 minutes.
# Then the server tier alone (its checks race requests against each other, so it gets the machine to
# itself). Fails when any test fails. With arguments, one pytest run of them (`-m unit`: the fast tier).
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
LANE_B=(tests/model/test_serve_tp.py tests/model/test_decode_graph.py tests/model/test_calibration_cli.py
        tests/model/test_static_vs_dynamic.py tests/model/test_serving_reference.py)
lane_b_log=$(mktemp)
(
  b=0
  "${PYTEST[@]}" -m upstream --durations=10 || b=$?
  "${PYTEST[@]}" -m model --durations=10 "${LANE_B[@]}" || b=$?
  exit $b
) >"$lane_b_log" 2>&1 &
lane_b=$!
"${PYTEST[@]}" -m "unit or soak" --durations=10 || rc=$?
"${PYTEST[@]}" -m model --durations=15 "${LANE_B[@]/#/--ignore=}" || rc=$?
wait $lane_b || rc=$?
echo "== lane B: the upstream tier, then ${LANE_B[*]} (ran beside the unit and model tiers) =="
cat "$lane_b_log"
rm -f "$lane_b_log"
"${PYTEST[@]}" -m server --durations=15 || rc=$?
exit $rc
