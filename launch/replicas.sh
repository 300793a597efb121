#!/usr/bin/env bash
# Set up (idempotent), start two Tangram servers behind sglang-router (cache-aware) on 127.0.0.1,
# chat through the router, keep serving until Ctrl-C.
#   bash launch/replicas.sh [--once] [--policy round_robin] [--model qwen2.5-0.5b] [--profile P]
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
exec .venv/bin/python launch/replicas.py "$@"
