#!/usr/bin/env bash
# Make the scratch venv the CPU rehearsal (launch/gpu_kit/rehearse.sh) serves from: Python 3.12
# holding what the GPU image holds (launch/gpu_kit/image.txt: torch 2.11.0, the CUDA build, which
# runs on a CPU, and the rest) and none of the kit's packages (launch/gpu_kit/wheels.txt), which
# the rehearsal must find in the kit alone. Needs the network (about 5 GB: torch's CUDA wheels).
#
#   bash launch/gpu_kit/rehearsal_env.sh [VENV] [PYTHON3.12]
#
# VENV defaults to /tmp/gpu_rehearsal (keep it out of the repo); TORCH_WHEEL may name a local
# torch-2.11.0 cp312 wheel to skip its download.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-/tmp/gpu_rehearsal}
PY312=${2:-/root/.pyenv/versions/3.12.1/bin/python3.12}
pins() { grep -v '^\s*#' "$1" | sed 's/#.*//; s/\s//g' | grep -v '^$'; }

[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 | grep -v 'is ignored' || true; }
pip install "${TORCH_WHEEL:-torch==2.11.0}" triton==3.6.0
pins launch/gpu_kit/image.txt | grep -v -E '^(torch|triton)==' > "$VENV/image-rest.txt"
pip install -c <(echo torch==2.11.0; echo triton==3.6.0) -r "$VENV/image-rest.txt"
# pip resolves some of the kit's packages for image packages (typer pulls pydantic); the image
# lacks them, so they go: the rehearsal must take them from the kit
kit=$(pins launch/gpu_kit/wheels.txt | cut -d= -f1 | tr '\n' ' ')
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip uninstall -y -q $kit 2>&1 | grep -v -E 'not installed|is ignored' || true
"$VENV/bin/python" -c 'import sys, torch, transformers, numpy as np
print("[rehearsal_env] python", sys.version.split()[0], "torch", torch.__version__,
      "transformers", transformers.__version__, "numpy", np.__version__)'
