#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: bash launch/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
.venv/bin/python launch/models.py smollm2 >/dev/null
export OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
