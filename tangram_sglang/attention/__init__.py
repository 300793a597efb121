"""Attention over ragged head groups: decode, chunk prefill, fused compression.

Re-exports the torch data plane only; the Triton and CUDA kernels live in
``triton_decode`` and ``cuda_ext`` and are imported by name where wanted.
"""

from tangram_sglang.attention.compression import compress_and_write, group_keep_counts, select_kept
from tangram_sglang.attention.kv_write import slot_locs, write_decode_kv, write_kept_kv
from tangram_sglang.attention.layer_meta import LayerMeta, build_layer_meta, build_layer_metas
from tangram_sglang.attention.prefill_reference import ragged_prefill_chunk_torch
from tangram_sglang.attention.reference import ragged_decode_torch
from tangram_sglang.attention.split_row import SplitRow, make_split_row, make_split_rows, uniform_split_row

__all__ = [
    "LayerMeta", "SplitRow", "build_layer_meta", "build_layer_metas", "compress_and_write",
    "group_keep_counts", "make_split_row", "make_split_rows", "ragged_decode_torch",
    "ragged_prefill_chunk_torch", "select_kept", "slot_locs", "uniform_split_row",
    "write_decode_kv", "write_kept_kv",
]
