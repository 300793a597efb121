"""Ragged page pool: one free list for every virtual layer (l, g), exact reservation, segments."""

from tangram_sglang.pool.block_table import build_layer_tables, stack_chunk_writes
from tangram_sglang.pool.page_pool import PagePool
from tangram_sglang.pool.ragged_cache import RaggedKVCache
from tangram_sglang.pool.records import Admission, ChunkWrite, PoolUsage
from tangram_sglang.pool.request_pages import RequestPages
from tangram_sglang.pool.reservation import ReservationPlan, chunk_slot_counts, plan_reservation
from tangram_sglang.pool.segments import Segment, SegmentStore, assemble
from tangram_sglang.pool.spec import PoolError, PoolSpec, RequestTooLargeError

__all__ = ["Admission", "ChunkWrite", "PagePool", "PoolError", "PoolSpec", "PoolUsage", "RaggedKVCache",
           "RequestPages", "RequestTooLargeError", "ReservationPlan", "Segment", "SegmentStore", "assemble", "build_layer_tables", "stack_chunk_writes",
           "chunk_slot_counts", "plan_reservation"]
