"""Attention over ragged head groups: decode, chunk prefill, fused compression.

Re-exports the torch data plane only; the Triton and CUDA kernels live in
``triton_decode`` and ``cuda_ext`` and are imported by name where wanted.
"""

from .compression import compress_and_write, group_keep_counts, select_kept
from .kv_write import slot_locs, write_decode_kv, write_kept_kv
from .layer_meta import LayerMeta, build_layer_meta, build_layer_metas
from .prefill_reference import ragged_prefill_chunk_torch
from .reference import ragged_decode_torch
from .split_row import SplitRow, make_split_row, make_split_rows, uniform_split_row

__all__ = [
    "LayerMeta", "SplitRow", "build_layer_meta", "build_layer_metas", "compress_and_write",
    "group_keep_counts", "make_split_row", "make_split_rows", "ragged_decode_torch",
    "ragged_prefill_chunk_torch", "select_kept", "slot_locs", "uniform_split_row",
    "write_decode_kv", "write_kept_kv",
]
