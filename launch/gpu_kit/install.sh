#!/usr/bin/env bash
# Install the GPU kit (built by launch/gpu_kit/build.py) on a machine with no network: no pip,
# no resolver; checks the archive's sha256, unpacks it, and sets the environment SGLang with the
# tangram_sglang plugin serves from. Either form works, from any directory:
#
#   source launch/gpu_kit/install.sh [SCRATCH]                      # exports into this shell
#   eval "$(bash launch/gpu_kit/install.sh --print-env [SCRATCH])"  # the same from a child
#
# Through the device tool, carry the two files .gpu_kit/kit.tar.xz and .gpu_kit/SHA256SUMS (not
# the folder .gpu_kit: its cache/ holds every wheel).
#
# SCRATCH  where the kit is unpacked (default /tmp/tangram_kit); a second run with the same kit
#          reuses the unpacked tree. Sourced from a script that has arguments, name SCRATCH:
#          bash hands a file sourced without arguments the caller's own.
# KIT_DIR  the folder holding kit.tar.xz and SHA256SUMS (default <repo root>/.gpu_kit).
# PYTHON   the interpreter to check (default python3): the kit's binary wheels are cp312.
#
# Exported: PYTHONPATH=<repo>/tangram_sglang/gpu_compat/shims:<SCRATCH>/site:<repo>[:old value],
# SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python (the kit drops the prebuilt Rust TreeCore),
# SGLANG_FORCE_FUSED_OP_BACKEND=torch, TANGRAM_GPU_KIT=<SCRATCH>/site.
# Progress goes to stderr, the export lines to stdout. A kit whose sha256 differs from
# SHA256SUMS, a missing kit or another Python is refused: status 1, nothing exported.

_tangram_kit_main() (
  set -euo pipefail
  local root kit_dir scratch py digest t0
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  [ "${1:-}" = "--print-env" ] && shift
  scratch=${1:-/tmp/tangram_kit}
  kit_dir=${KIT_DIR:-$root/.gpu_kit}
  py=${PYTHON:-python3}
  say() { echo "[gpu_kit] $*" >&2; }
  t0=$(date +%s.%N)

  for f in kit.tar.xz SHA256SUMS; do
    if [ ! -f "$kit_dir/$f" ]; then
      say "refused: $kit_dir/$f is missing (build it: python launch/gpu_kit/build.py)"
      return 1
    fi
  done
  if ! (cd "$kit_dir" && sha256sum --check --status SHA256SUMS); then
    say "refused: the sha256 of $kit_dir/kit.tar.xz does not match $kit_dir/SHA256SUMS"
    return 1
  fi
  digest=$(awk '$2 == "kit.tar.xz" || $2 == "*kit.tar.xz" {print $1}' "$kit_dir/SHA256SUMS")
  [ -n "$digest" ] || { say "refused: SHA256SUMS lists no kit.tar.xz"; return 1; }
  if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    say "refused: $py is not Python 3.12 ($("$py" -V 2>&1 || true)); the kit holds cp312 wheels"
    return 1
  fi

  if [ "$(cat "$scratch/site/.kit-sha256" 2>/dev/null || true)" = "$digest" ]; then
    say "kit ${digest:0:12} already unpacked in $scratch/site"
  else
    rm -rf "$scratch/site" "$scratch/partial"
    mkdir -p "$scratch/partial"
    tar -xJf "$kit_dir/kit.tar.xz" -C "$scratch/partial"
    mv "$scratch/partial/site" "$scratch/site"
    rmdir "$scratch/partial"
    # bytecode once, on every core: a dozen servers starting together would each compile SGLang otherwise
    "$py" -m compileall -q -j 0 "$scratch/site" >/dev/null 2>&1 || say "warning: compileall failed (servers compile on import)"
    echo "$digest" > "$scratch/site/.kit-sha256"
    say "unpacked kit ${digest:0:12} into $scratch/site ($(du -sm "$scratch/site" | cut -f1) MB)"
  fi
  # the control plane's native loops (tangram_sglang/pool/native.py); without a C compiler, numpy's
  if [ ! -f "$root/tangram_sglang/pool/_control_plane.so" ] && command -v cc >/dev/null 2>&1; then
    cc -O3 -shared -fPIC -std=c99 -o "$root/tangram_sglang/pool/_control_plane.so" \
      "$root/tangram_sglang/pool/native_src/control_plane.c" || say "warning: the native control plane did not build (numpy serves)"
  fi
  local shims=$root/tangram_sglang/gpu_compat/shims
  [ -d "$shims" ] || say "warning: $shims does not exist (no sgl_kernel stand-in)"
  printf 'export PYTHONPATH=%q\n' "$shims:$scratch/site:$root${PYTHONPATH:+:$PYTHONPATH}"
  printf 'export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python\n'
  printf 'export SGLANG_FORCE_FUSED_OP_BACKEND=torch\n'
  printf 'export TANGRAM_GPU_KIT=%q\n' "$scratch/site"
  say "ready in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
)

if [ "${BASH_SOURCE[0]}" != "$0" ]; then  # sourced: export into the caller's shell
  if _tangram_kit_env=$(_tangram_kit_main "$@"); then
    eval "$_tangram_kit_env"
    unset _tangram_kit_env
    unset -f _tangram_kit_main
  else
    unset _tangram_kit_env
    unset -f _tangram_kit_main
    return 1
  fi
else
  _tangram_kit_main "$@"
fi
