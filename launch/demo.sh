#!/usr/bin/env bash
# Set up (idempotent), serve SmolLM2-135M-Instruct with a Tangram profile, and
# hold a short multi-turn chat with it over the OpenAI API on 127.0.0.1.
#   bash launch/demo.sh [--turns N] [--profile P] [--model smollm2|qwen2.5-0.5b|DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
exec .venv/bin/python launch/chat.py "$@"
