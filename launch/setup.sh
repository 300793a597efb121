#!/usr/bin/env bash
# One-time set-up of the project's environment in .venv (idempotent).
#
#   bash launch/setup.sh
#
# - No GPU visible: torch 2.13.0, the CPU wheel, installed first and pinned, so nothing
#   later lets pip pull CUDA torch; sglang 0.5.23 with --no-deps.
# - An NVIDIA GPU visible (nvidia-smi -L): sglang 0.5.23 with --no-deps, then the torch
#   and CUDA packages sglang itself pins (torch 2.14.1, flashinfer-python 0.7.2,
#   sglang-kernel 0.4.10, ..., read from its metadata by launch/gpu_pins.py).
# - Then, on both, sglang's other runtime deps from pinned lists, under the torch installed.
# - On a machine without a GPU build of sgl_kernel: the project's CPU stand-ins
#   (tangram_sglang/cpu_compat/) go on sys.path through one .pth file.
# - tangram_sglang itself, editable, and its control plane's native loops (a C file, built with cc).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TANGRAM_VENV:-.venv}
PY=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip, quiet; sglang's own metadata pins CUDA packages we deliberately leave out,
# so its resolver complaints about them are expected and filtered.
NOISE='is ignored: it is neither|^sglang 0\.5\.23 requires|dependency resolver does not currently'
pip() {
  local out
  out=$("$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1) || { echo "$out"; return 1; }
  echo "$out" | grep -v -E "$NOISE" || true
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then GPU=1; else GPU=0; fi
echo "[setup] gpu=$GPU venv=$VENV"
if [ "$GPU" = 1 ]; then
  pip install --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11
  "$VENV/bin/python" launch/gpu_pins.py > "$VENV/gpu-pins.txt"
  echo "[setup] sglang's GPU pins: $(tr '\n' ' ' < "$VENV/gpu-pins.txt" | cut -c1-200)"
  pip install -r "$VENV/gpu-pins.txt"
else
  pip install "torch==2.13.0"   # pip finds the local CPU wheel (find-links) first
  pip install --no-deps sglang==0.5.23 triton==3.8.0 apache-tvm-ffi==0.1.11
fi
TORCH_VER=$("$VENV/bin/python" -W ignore -c 'import torch; print(torch.__version__)')
echo "torch==$TORCH_VER" > "$VENV/torch-constraint.txt"
echo "[setup] torch $TORCH_VER"
pip install -c "$VENV/torch-constraint.txt" -r launch/requirements-cpu.txt -r launch/requirements-dev.txt
pip install --no-deps --no-build-isolation -e . 2>/dev/null || pip install --no-deps -e .
"$VENV/bin/python" -m tangram_sglang.cpu_compat.install
# the control plane's native loops (tangram_sglang/pool/native.py); without a C compiler, numpy's
"$VENV/bin/python" -c "from tangram_sglang.pool import native; print('[setup] native control plane:', native.build())" \
  || echo "[setup] no native control plane (no C compiler?): the numpy references serve"
echo "[setup] done: $("$VENV/bin/python" -c 'import sglang, torch; print("sglang", sglang.__version__, "torch", torch.__version__)')"
