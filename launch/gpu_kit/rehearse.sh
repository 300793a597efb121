#!/usr/bin/env bash
# CPU rehearsal of the GPU kit: serve from the kit alone, as the borrowed GPU machine will.
#
#   bash launch/gpu_kit/rehearsal_env.sh     # once: the scratch venv that stands in for the image
#   python launch/gpu_kit/build.py           # the kit (.gpu_kit/kit.tar.xz)
#   bash launch/gpu_kit/rehearse.sh [PYTHON] # default /tmp/gpu_rehearsal/bin/python
#
# Installs the kit exactly as the GPU machine does (launch/gpu_kit/install.sh: PYTHONPATH, no
# pip), then launch/gpu_kit/rehearse.py serves a tiny random Llama with stock SGLang and with a
# ratio-1.0 tangram profile and checks both give the same greedy tokens over two turns.
# What differs from the GPU path: the CPU sgl_kernel stand-in (tangram_sglang/cpu_compat/shims)
# goes first on PYTHONPATH, ahead of the GPU one; SGLANG_USE_CPU_ENGINE=1; and the servers run
# --dtype float32 on the CPU engine (torch_native attention, no CUDA graphs, no Triton kernels).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-/tmp/gpu_rehearsal/bin/python}
t0=$(date +%s)
eval "$(PYTHON=$PY bash launch/gpu_kit/install.sh --print-env /tmp/tangram_kit_rehearsal)"
# the CPU sgl_kernel stand-in alone (not cpu_compat's torchvision: the kit's real one is rehearsed)
shims=/tmp/tangram_kit_rehearsal/cpu_shims
mkdir -p "$shims" && ln -sfn "$PWD/tangram_sglang/cpu_compat/shims/sgl_kernel" "$shims/sgl_kernel"
export PYTHONPATH=$shims:$PYTHONPATH SGLANG_USE_CPU_ENGINE=1 TANGRAM_INTEGRITY_CHECK=1
echo "[rehearse] PYTHONPATH=$PYTHONPATH"
"$PY" launch/gpu_kit/rehearse.py "${@:2}"
echo "[rehearse] done in $(( $(date +%s) - t0 )) s"
