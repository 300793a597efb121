#!/usr/bin/env bash
# Set up (idempotent) and run the test suite: bash launch/test.sh [pytest args]
#
# Without arguments, the whole suite in two lanes, one per core, each one test at a time:
#   lane A: the unit and soak tiers (no server, no weights), then the model tier (in-process engines)
#           but for LANE_B's files, then the upstream tests stock SGLang fails, on a stock server (they
#           must fail there; tests/upstream/conftest.py);
#   lane B: the rest of the upstream tier (one shared server on its own port), then the server tier (real
#           servers on their own ports), then the model-tier files in LANE_B (chosen so the lanes take
#           about as long).
# The servers and engines the tests start sleep when idle (tests/served.py, IDLE_ARGS): a lane waiting on
# its server leaves the core to the other. (A third lane for the server tier was slower: its launches
# are CPU-bound too.) Lane A prints as it runs, lane B after it. Fails when any test fails. With
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
LANE_B=(tests/model/test_calibration_cli.py tests/model/test_static_vs_dynamic.py tests/model/test_serving_reference.py
        tests/model/test_decode_graph.py tests/model/test_serve_tp.py tests/model/test_hit_equals_recompute.py)
lane() {  # lane LOG ARGS... [| ARGS...]: one pytest run per "|"-separated argument list, in turn, into LOG
  local log=$1 status=0 args=()
  shift
  for a in "$@" "|"; do
    if [ "$a" = "|" ]; then "${PYTEST[@]}" "${args[@]}" >>"$log" 2>&1 || status=$?; args=(); else args+=("$a"); fi
  done
  return $status
}
lane_b_log=$(mktemp)
lane "$lane_b_log" -m "upstream and not on_stock" --durations=10 "|" -m server --durations=15 "|" -m model --durations=10 "${LANE_B[@]}" &
lane_b=$!
"${PYTEST[@]}" -m "unit or soak" --durations=10 || rc=$?
"${PYTEST[@]}" -m model --durations=15 "${LANE_B[@]/#/--ignore=}" || rc=$?
TANGRAM_UPSTREAM=stock "${PYTEST[@]}" -m on_stock -rxX || rc=$?
wait $lane_b || rc=$?
echo "== lane B: the upstream tier but its on_stock tests, the server tier, then ${LANE_B[*]} =="
cat "$lane_b_log"
rm -f "$lane_b_log"
exit $rc
