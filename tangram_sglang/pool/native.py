"""Optional native loops for the control plane's per-page work, loaded with ctypes.

A prefill chunk of an 8B model (32 layers x 8 groups) draws thousands of pages per request, each
written to the free list, the refcounts, the request's page table, the device table and the write
slots; numpy does that in a dozen passes of whole-array operations, about 40 ns a page in all.
native_src/control_plane.c does each step in one loop. Every function here has a numpy reference in
the package that tests compare it with (tests/unit/test_native_control_plane.py), and the package
uses the reference wherever the library is not built.

    python -c "from tangram_sglang.pool import native; native.build()"   # launch/setup.sh; needs cc

``TANGRAM_NATIVE=0`` keeps the numpy references (``enabled()`` False).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import weakref

import numpy as np

from tangram_sglang.pool.records import DecodeStep
from tangram_sglang.pool.spec import PoolError

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "native_src", "control_plane.c")
LIBRARY = os.path.join(_HERE, "_control_plane.so")
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "tg_draw": [_P, _I, _P, _P, ctypes.c_int32, _P, _P, _I, _I, _P, _I, _P],
    "tg_chunk_pages": [_P, _I, _I, _P, _I, _P, _P, ctypes.c_int32, _I, _P],
    "tg_chunk_slots": [_P, _P, _P, _I, _I, _I, _I, ctypes.c_int32, _P],
    "tg_new_columns": [_P, _I, _I, _P, _P, _I, _P, _P, _I, _I, _I, _P, _P, _P, _I],
    "tg_step_need": [_P, _P, _I, _P, _I, ctypes.c_int32, _P],
    "tg_release": [_P, _I, _P, _P, _P, _P, _I, _I, _I],
    "tg_decode": [_P, _I, _I, _P, _P, ctypes.c_int32, _P, _P, _P, _P, _P, _I, _I, _P, _I, _P, _P],
}


def _load():
    if os.environ.get("TANGRAM_NATIVE", "1") == "0" or not os.path.exists(LIBRARY):
        return None
    if os.path.getmtime(LIBRARY) < os.path.getmtime(SOURCE):
        return None   # built from an older source: the references, until setup builds it again
    lib = ctypes.CDLL(LIBRARY)
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int64
    return lib


_LIB = _load()


def enabled() -> bool:
    return _LIB is not None


def build() -> str:
    """Compile the library beside this module; returns its path."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc) found: the control plane keeps its numpy references")
    subprocess.run([cc, "-O3", "-shared", "-fPIC", "-std=c99", "-o", LIBRARY, SOURCE], check=True)
    return LIBRARY


_ADDRESSES: dict[int, tuple] = {}   # id(array) -> (weak reference, dtype, address): the pool's long-lived arrays


def _ptr(a: np.ndarray, dtype) -> int:
    """a's data address, for an array the caller holds through the call (never a temporary). The
    address of an array seen before comes from a cache (numpy's own lookup costs ~3 us, against a
    decode step's budget of tens): a weak reference, so a freed array's id reused is a miss."""
    hit = _ADDRESSES.get(id(a))
    if hit is not None and hit[0]() is a and hit[1] == dtype:
        return hit[2]
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise TypeError(f"native control plane: expected a C-contiguous {np.dtype(dtype)} array, got "
                        f"{a.dtype} (contiguous: {a.flags.c_contiguous})")
    if len(_ADDRESSES) > 256:
        for key in [k for k, (ref, _, _) in _ADDRESSES.items() if ref() is None]:
            del _ADDRESSES[key]
    _ADDRESSES[id(a)] = (weakref.ref(a), dtype, a.ctypes.data)
    return _ADDRESSES[id(a)][2]


def _ok(code: int, what: str) -> int:
    if code < 0:
        why = {-1: "not enough free pages", -3: "a page without a reference to drop (double free)"}
        raise PoolError(f"native {what}: {why.get(code, 'a bound was passed')} (nothing changed)")
    return code


def draw(pool, arena, slots: np.ndarray, need: np.ndarray) -> None:
    """pool.take(need.sum(), ...) handed out in (b, v) order and appended to the arena rows of slots:
    what draw_chunks' numpy path does. slots int64 [B], need int64 [B, V]. The caller takes the pages
    from the reservation (pool.reserved) and ensures the arena's capacity."""
    B, V = need.shape
    top = _LIB.tg_draw(_ptr(pool._free, np.int32), pool._num_free, _ptr(pool.refcount, np.int32),
                       _ptr(pool.fill, np.int32), pool.page_size, _ptr(arena.pages, np.int32),
                       _ptr(arena.npages, np.int32), V, arena.pages.shape[2], _ptr(slots, np.int64), B,
                       _ptr(need, np.int64))
    pool._num_free = _ok(top, "draw")


def chunk_pages(arena, slots: np.ndarray, lens: np.ndarray, counts: np.ndarray, page_size: int,
                width: int) -> np.ndarray:
    """chunk_draw.chunk_pages' pages, int32 [B, V, width] (lens int32 [B, V], counts int64 [B, V])."""
    B, V = counts.shape
    out = np.empty((B, V, width), np.int32)
    _ok(_LIB.tg_chunk_pages(_ptr(arena.pages, np.int32), V, arena.pages.shape[2], _ptr(slots, np.int64), B,
                            _ptr(lens, np.int32), _ptr(counts, np.int64), page_size, width,
                            _ptr(out, np.int32)), "chunk_pages")
    return out


def chunk_slots(pages: np.ndarray, offset: np.ndarray, counts: np.ndarray, page_size: int) -> list[np.ndarray]:
    """block_table.chunk_slots_reference: pages int32 [B, L, G, W], offset / counts [B, L, G] -> per
    layer int64 [sum over (b, g) of counts[b, l, g]], in (b, g, j) order."""
    B, L, G, W = pages.shape
    # named, so the converted arrays live through the call (a temporary's memory is freed at once)
    pages, offset = np.ascontiguousarray(pages, np.int32), np.ascontiguousarray(offset, np.int64)
    counts = np.ascontiguousarray(counts, np.int64)
    per_layer = counts.sum(axis=(0, 2))
    out = np.empty(int(per_layer.sum()), np.int64)
    _ok(_LIB.tg_chunk_slots(_ptr(pages, np.int32), _ptr(offset, np.int64), _ptr(counts, np.int64),
                            B, L, G, W, page_size, _ptr(out, np.int64)), "chunk_slots")
    return np.split(out, np.cumsum(per_layer)[:-1])


def new_columns(arena, slots: np.ndarray, rows: np.ndarray, first: np.ndarray, npages: np.ndarray,
                table_shape, table: np.ndarray | None = None, zero_to: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """DeviceBlockTables' new entries: (flat index int64, page id int32) into a table of table_shape
    [L, R, G, W] for columns [first, npages) (int64 / int32 [K, V]) of the arena rows of slots; or,
    given the table itself (int32, host memory), written into it in place, columns [npages, zero_to)
    zeroed (returns None)."""
    L, R, G, W = table_shape
    K, V = first.shape
    n = 0 if table is not None else int(np.maximum(npages - first, 0).sum())
    at, val = np.empty(n, np.int64), np.empty(n, np.int32)
    if table is not None and tuple(table.shape) != (L, R, G, W):
        raise ValueError(f"table of shape {table.shape}, expected {(L, R, G, W)}")
    _ok(_LIB.tg_new_columns(_ptr(arena.pages, np.int32), V, arena.pages.shape[2], _ptr(slots, np.int64),
                            _ptr(rows, np.int64), K, _ptr(first, np.int64), _ptr(npages, np.int32), G, R, W,
                            _ptr(at, np.int64), _ptr(val, np.int32),
                            None if table is None else _ptr(table, np.int32), zero_to), "new_columns")
    return None if table is not None else (at, val)


def step_need(arena, slots: np.ndarray, page_size: int) -> np.ndarray:
    """RaggedKVCache.reserve_decode_step's pages to reserve: flat arena indices slot * V + v (int64, in
    (b, v) order) where the next step opens a page and the reservation is used up."""
    V = arena.num_virtual
    need_at = np.empty(len(slots) * V, np.int64)
    n = _LIB.tg_step_need(_ptr(arena.lens, np.int32), _ptr(arena.reserved_left, np.int32), V,
                          _ptr(slots, np.int64), len(slots), page_size, _ptr(need_at, np.int64))
    return need_at[:n]


def decode(pool, arena, slots: np.ndarray) -> DecodeStep | None:
    """RaggedKVCache.decode_step for a pool without window layers: the same pages, in the same places,
    the same DecodeStep; None (nothing changed) when the pages beyond the reservations are not free."""
    V, B, P = arena.num_virtual, len(slots), pool.page_size
    opened, out = _scratch("opened", B * V * 3), _scratch("out", 2)
    for _ in range(2):   # a second try after growing the arena, when a row is at its capacity
        top = _LIB.tg_decode(_ptr(pool._free, np.int32), pool._num_free, pool.available, _ptr(pool.refcount, np.int32),
                             _ptr(pool.fill, np.int32), P, _ptr(arena.pages, np.int32), _ptr(arena.npages, np.int32),
                             _ptr(arena.lens, np.int32), _ptr(arena.taken, np.int32),
                             _ptr(arena.reserved_left, np.int32), V, arena.pages.shape[2], _ptr(slots, np.int64), B,
                             _ptr(opened, np.int64), _ptr(out, np.int64))
        if top != -2:
            break
        arena.ensure_capacity(arena.pages.shape[2] + 1)
    if top == -1:
        return None
    n = pool._num_free - _ok(top, "decode")
    pool._num_free, pool.reserved = top, pool.reserved - int(out[0])
    return DecodeStep(opened=opened[: 3 * n].reshape(n, 3).copy(), width=max(1, -(-int(out[1]) // P)))


_SCRATCH: dict[str, np.ndarray] = {}


def _scratch(name: str, size: int) -> np.ndarray:
    """A reused int64 buffer of at least size entries (a fresh one per decode step costs a page fault
    per 4 KiB), the same array while it is large enough (its address stays cached)."""
    buf = _SCRATCH.get(name)
    if buf is None or buf.size < size:
        buf = _SCRATCH[name] = np.empty(max(size, 2 * (0 if buf is None else buf.size)), np.int64)
    return buf


def release(pool, arena, slot: int) -> None:
    """pool.decref(held) of the request at arena slot: its live pages lose a reference, those at 0
    go back on the free list in the same order; the slot's columns become -1 (free_slot's clearing)."""
    top = _LIB.tg_release(_ptr(pool._free, np.int32), pool._num_free, _ptr(pool.refcount, np.int32),
                          _ptr(pool.fill, np.int32), _ptr(arena.pages, np.int32), _ptr(arena.npages, np.int32),
                          arena.num_virtual, arena.pages.shape[2], int(slot))
    pool._num_free = _ok(top, "release")
