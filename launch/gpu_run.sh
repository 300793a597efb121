#!/usr/bin/env bash
# The one command of a lent GPU machine (the device tool; its image has Python 3.12, torch, Triton, nvcc,
# no SGLang, no network): install the GPU kit, then SGLang with and without a profile, served.
#
#   bash launch/gpu_run.sh [benchmarks.gpu.run arguments]     # e.g. --budget-s 300 --stages correctness speed
#
# Build the kit here first (python launch/gpu_kit/build.py) and carry .gpu_kit/kit.tar.xz and
# .gpu_kit/SHA256SUMS with the call. Results and the servers' logs go to $OUT (default /tmp/gpu-out):
# gpu_served_<device>.json / .md (copy them into benchmarks/results/serving/), logs.tar.gz, run.log.
# TANGRAM_COMMIT names the commit sent (no .git travels).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
source launch/gpu_kit/install.sh /tmp/tangram_kit || exit 1   # an explicit argument: a sourced file sees ours otherwise
# the sgl_kernel stand-in (tangram_sglang/gpu_compat) carries no sglang-kernel metadata to check
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader || true
python3 -m benchmarks.gpu.run --out "$OUT" "$@" 2>&1 | tee "$OUT/run.log"
