#!/usr/bin/env bash
# Set up (idempotent) and run the test suite: bash launch/test.sh [pytest args]
#
# Without arguments, the whole suite in three lanes at once, each one test at a time:
#   lane A: the unit and soak tiers (no server, no weights), then the model tier (in-process engines);
#   lane B: the upstream tier (one shared server on its own port), then the model-tier files in LANE_B;
#   lane S: the server tier (real servers on their own ports).
# The servers and engines the tests start sleep when idle (tests/served.py, IDLE_ARGS), so a lane that
# waits on a server leaves its core to the others: three lanes keep two cores busy. Lane A prints as it
# runs, the other two after it. Fails when any test fails. With arguments, one pytest run of them
# (`-m unit`: the fast tier).
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
lane() {  # lane LOG ARGS... [| ARGS...]: one pytest run per "|"-separated argument list, in turn, into LOG
  local log=$1 status=0 args=()
  shift
  for a in "$@" "|"; do
    if [ "$a" = "|" ]; then "${PYTEST[@]}" "${args[@]}" >>"$log" 2>&1 || status=$?; args=(); else args+=("$a"); fi
  done
  return $status
}
lane_b_log=$(mktemp)
lane_s_log=$(mktemp)
lane "$lane_b_log" -m upstream --durations=10 "|" -m model --durations=10 "${LANE_B[@]}" &
lane_b=$!
lane "$lane_s_log" -m server --durations=15 &
lane_s=$!
"${PYTEST[@]}" -m "unit or soak" --durations=10 || rc=$?
"${PYTEST[@]}" -m model --durations=15 "${LANE_B[@]/#/--ignore=}" || rc=$?
wait $lane_b || rc=$?
echo "== lane B: the upstream tier, then ${LANE_B[*]} =="
cat "$lane_b_log"
wait $lane_s || rc=$?
echo "== lane S: the server tier =="
cat "$lane_s_log"
rm -f "$lane_b_log" "$lane_s_log"
exit $rc
