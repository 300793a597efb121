"""Ragged page pool: one free list for every virtual layer (l, g), exact reservation, segments."""

from .block_table import build_layer_tables, stack_chunk_writes
from .page_pool import PagePool
from .ragged_cache import Admission, ChunkWrite, PoolUsage, RaggedKVCache
from .request_pages import RequestPages
from .reservation import ReservationPlan, chunk_slot_counts, plan_reservation
from .segments import Segment, SegmentStore, assemble
from .spec import PoolError, PoolSpec, RequestTooLargeError

__all__ = ["Admission", "ChunkWrite", "PagePool", "PoolError", "PoolSpec", "PoolUsage", "RaggedKVCache",
           "RequestPages", "RequestTooLargeError", "ReservationPlan", "Segment", "SegmentStore", "assemble", "build_layer_tables", "stack_chunk_writes",
           "chunk_slot_counts", "plan_reservation"]
