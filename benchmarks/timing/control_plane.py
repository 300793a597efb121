"""Control-plane benchmark: admission + allocation + release per request as L x G grows (paper 3.1.2, 4.2.3).

Workload per batch of B requests: N prompt tokens in chunks of C, D decode steps (batched over
the B requests), then release. Per virtual layer v the budget beta_v is drawn in [0.05, 1].

  tangram          RaggedKVCache, the served calls: admit (exact plan + reserve), prefill_chunks
                   (one draw per pass), per decode step (batched) the capacity check
                   reserve_decode_step and decode_step, release. Vectorized over V = L x G with numpy.
                   The pool outlives the batch, as in a server (sized by an untimed warm-up batch).
  tangram_tables   as a GPU serves it: the above plus the device block tables the attention side
                   reads, DeviceBlockTables (here on CPU) loaded / extended with each pass's pages
                   and updated every decode step (its torch ops are device work on a GPU); the
                   chunks drawn without host pages (host_pages=False: the device computes the
                   write slots from its tables).
  write_slots      the flat slot of every kept (token, virtual layer) of every chunk, as a CPU
                   serves them (chunk_slots_host on the host, from the pages `tangram` gathers); a
                   GPU computes the same on the device (DeviceBlockTables.chunk_slots). Per kept
                   slot, about L x G x the kept share times SGLang's per-token out_cache_loc; not
                   in the two columns above.
  compress_reclaim the same pool and block table, but no plan: each chunk allocates its
                   uncompressed length in every v, then, once compression is known, frees the
                   pages past the kept slots and truncates the table (compress-then-reclaim).
  per_v_loop       exact reservation like tangram, but a Python loop over the V virtual layers
                   for every allocation (the O(N_req x H / H_p) block table of paper 4.2.3).
  sglang_paged     SGLang 0.5.23's PagedTokenToKVPoolAllocator (page P, CPU tensors) for the
                   same tokens uncompressed, one slot per token for all layers (req_to_token
                   rows written as SGLang does). Runs when sglang imports; says so otherwise.

Times are host (CPU) microseconds per request, best of --repeat rounds that alternate the methods, measured in one run so the
columns compare; ratios are to `tangram`.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.timing.control_plane
    # -> benchmarks/results/timing/control_plane.{md,json}

``--decode-step`` measures one decode step of a running batch instead (B requests holding
--contexts tokens each), host microseconds per step:

  rebuild          the pool's decode_step + the block table [B, L, G, W] rebuilt on the host
                   (pool/block_table.py), the write slots read from it and both copied (the
                   serving path before DeviceBlockTables)
  host             the pool's decode_step: the pages the step opened (serving/block_tables.py),
                   the host's share of the served step now, O(B x V)
  device_tables    DeviceBlockTables.decode + seq_lens: one copy of the deltas, write slots and
                   lengths computed by torch ops (on a GPU these are device work; here on CPU);
                   attention reads the tables in place through the batch's rows
  sglang           SGLang's own per-step metadata on the host: PagedTokenToKVPoolAllocator
                   alloc_decode, the req_to_token write, seq_lens and kv_indptr

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.timing.control_plane --decode-step
    # -> benchmarks/results/timing/control_plane_decode.{md,json}
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.common.paths import RESULTS
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.method.budgets import keep_count
from tangram_sglang.pool import PagePool, PoolSpec, RaggedKVCache, RequestPages, build_layer_tables, plan_reservation
from tangram_sglang.pool.block_table import chunk_slots_host
from tangram_sglang.pool.request_pages import ragged_index


class TangramState:
    """A pool and device block tables that outlive one batch, as in a server: built once per
    configuration and sized by an untimed first batch (SGLang's allocator and req_to_token are
    likewise allocated before its timing starts)."""

    def __init__(self, beta, L, G, P, batch, chunks, decode):
        from tangram_sglang.serving.block_tables import DeviceBlockTables

        spec = PoolSpec(num_layers=L, num_groups=G, heads_per_group=1, head_dim=1, page_size=P,
                        num_pages=_pages(beta, P, batch, chunks, decode))
        self.cache = RaggedKVCache(spec, beta.reshape(L, G))
        self.tables = DeviceBlockTables(L, G, P, "cpu", rows=batch)


def run_tangram(state, batch, chunks, decode, tables=False):
    """(prefill phase, whole request, write slots) seconds for one batch: the pool's calls as a CPU
    serves them, the write slots of every chunk (chunk_slots_host) timed apart; with ``tables`` as a
    GPU serves them: the device tables' calls too (extend per pass, decode per step), the chunks
    drawn without host pages (the device computes the write slots from its tables:
    DeviceBlockTables.chunk_slots, device work), write slots 0."""
    cache, dev = state.cache, state.tables
    t0 = time.perf_counter()
    slots = 0.0
    rids = list(range(batch))
    for r in rids:
        cache.admit(r, chunk_tokens=chunks, decode_tokens=decode)
    for n in chunks:
        if tables:
            host = [cache.requests[r].pages for r in rids]
            npages, dead = np.stack([h.npages for h in host]), np.stack([h.dead for h in host])
        writes = cache.prefill_chunks(rids, [n] * batch, host_pages=not tables)   # as served: one draw per wave
        if tables:  # as served (serving/runtime.py extend_waves): rows == rids
            dev.extend(rids, rids, [cache.requests[r].pages for r in rids], npages, dead)
        else:
            ts = time.perf_counter()
            chunk_slots_host(writes)
            slots += time.perf_counter() - ts
    t1 = time.perf_counter()
    for _ in range(decode):
        if cache.reserve_decode_step(rids) != 0:
            raise AssertionError("the pool is sized for every decode step")
        step = cache.decode_step(rids)
        if tables:
            dev.decode(rids, step.opened, step.width)
    for r in rids:
        cache.release(r)
        if tables:
            dev.forget(r, r)
    t2 = time.perf_counter()
    return t1 - t0 - slots, t2 - t0 - slots, slots


def run_compress_reclaim(beta, L, G, P, batch, chunks, decode):
    V = L * G
    pool = PagePool(_pages(np.ones(V), P, batch, chunks, decode), P)
    t0 = time.perf_counter()
    reqs = [RequestPages(V, P) for _ in range(batch)]
    for n in chunks:
        kept = keep_count(beta, n)
        for r in reqs:
            need = r.pages_needed(r.lens + n)  # allocate the uncompressed chunk in every v
            r.append(need, pool.take(int(need.sum())))
            r.chunk_pages(np.full(V, n))
            new_lens = r.lens + kept  # compression known: reclaim the tail pages
            keep_pages = -(-new_lens // P)
            counts, ids = r.pages_from(keep_pages, r.npages)
            pool.decref(ids)
            rows, pos = ragged_index(counts)
            r.pages[rows, keep_pages[rows] + pos] = -1
            r.npages = keep_pages
            r.lens = new_lens
    t1 = time.perf_counter()
    ones = np.ones(V, np.int64)
    for _ in range(decode):
        for r in reqs:
            need = r.pages_needed(r.lens + 1)
            r.append(need, pool.take(int(need.sum())))
            r.next_slot_locs()
            r.advance(ones)
    for r in reqs:
        pool.decref(r.held())
    return t1 - t0, time.perf_counter() - t0


def run_per_v_loop(beta, L, G, P, batch, chunks, decode):
    V = L * G
    pool = PagePool(_pages(beta, P, batch, chunks, decode), P)
    t0 = time.perf_counter()
    reqs = []
    for _ in range(batch):
        plan = plan_reservation(beta, chunks, page_size=P, decode_tokens=decode)
        pool.reserve(plan.total_pages)
        reqs.append(([[] for _ in range(V)], [0] * V, plan))
    for c, n in enumerate(chunks):
        for pages, lens, plan in reqs:
            for v in range(V):
                new = lens[v] + int(plan.chunk_slots[c, v])
                k = -(-new // P) - len(pages[v])
                pages[v].extend(pool.take(k, from_reserved=k).tolist())
                _ = (pages[v][lens[v] // P : -(-new // P)], lens[v] % P)  # the chunk's (pages, offset)
                lens[v] = new
    t1 = time.perf_counter()
    for _ in range(decode):
        for pages, lens, plan in reqs:
            for v in range(V):
                if lens[v] % P == 0:
                    pages[v].extend(pool.take(1, from_reserved=1).tolist())
                _ = pages[v][lens[v] // P] * P + lens[v] % P
                lens[v] += 1
    for pages, lens, plan in reqs:
        pool.decref(np.concatenate([np.asarray(p, np.int64) for p in pages]))
    return t1 - t0, time.perf_counter() - t0


def _pages(beta, P, batch, chunks, decode):
    return int(plan_reservation(np.asarray(beta, float).ravel(), chunks, page_size=P, decode_tokens=decode).total_pages * batch + 1)


def load_sglang():
    try:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        import torch
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

        return torch, PagedTokenToKVPoolAllocator
    except Exception as exc:  # noqa: BLE001 - report whatever stops the import
        print(f"note: SGLang allocator not importable ({type(exc).__name__}: {exc}); its column is skipped")
        return None


def run_sglang(sg, P, batch, chunks, decode):
    torch, Alloc = sg
    total = sum(chunks) + decode
    alloc = Alloc(size=(-(-total // P) + 1) * P * batch, page_size=P, dtype=torch.float16, device="cpu",
                  kvcache=None, need_sort=False)
    req_to_token = torch.zeros((batch, total + 1), dtype=torch.int32)
    rows = torch.arange(batch)
    t0 = time.perf_counter()
    lens = torch.zeros(batch, dtype=torch.int64)
    for n in chunks:
        last = torch.where(lens > 0, req_to_token[rows, (lens - 1).clamp(min=0)].to(torch.int64), torch.full_like(lens, -1))
        seq = lens + n
        out = alloc.alloc_extend(lens, lens.clone(), seq, seq.clone(), last, batch * n)
        cols = lens[:, None] + torch.arange(n)[None, :]
        req_to_token[rows[:, None], cols] = out.view(batch, n).to(torch.int32)
        lens = seq
    t1 = time.perf_counter()
    for _ in range(decode):
        last = req_to_token[rows, lens - 1].to(torch.int64)
        seq = lens + 1
        out = alloc.alloc_decode(seq, seq.clone(), last)
        req_to_token[rows, lens] = out.to(torch.int32)
        lens = seq
    for b in range(batch):
        alloc.free(req_to_token[b, : int(lens[b])].to(torch.int64))
    return t1 - t0, time.perf_counter() - t0


def contexts_of(batch, context):
    """Per-request contexts: context minus a spread in [0, 512), so requests reach page boundaries
    at different steps (identical contexts would open every page of the batch in the same step)."""
    return [context - (i * 37) % 512 for i in range(batch)]


def decode_batch(beta, L, G, P, batch, context):
    """A pool holding batch prefilled requests (contexts_of), with room to decode."""
    plans = [[1024] * (c // 1024) + ([c % 1024] if c % 1024 else []) for c in contexts_of(batch, context)]
    spec = PoolSpec(num_layers=L, num_groups=G, heads_per_group=1, head_dim=1, page_size=P,
                    num_pages=_pages(beta, P, batch, plans[0], 512))
    cache = RaggedKVCache(spec, beta.reshape(L, G))
    rids = list(range(batch))
    for r, chunks in zip(rids, plans):
        cache.admit(r, chunk_tokens=chunks, decode_tokens=512)
        for n in chunks:
            cache.prefill_chunk(r, n)
    return cache, rids


def run_decode_steps(beta, L, G, P, batch, context, steps):
    """Per-step seconds, a list each: rebuild, host, device_tables, check."""
    import torch

    from tangram_sglang.pool.batch_memo import BatchMemo
    from tangram_sglang.serving.block_tables import DeviceBlockTables

    cache, rids = decode_batch(beta, L, G, P, batch, context)
    t_rebuild = []
    for _ in range(steps):
        t0 = time.perf_counter()
        cache.decode_step(rids)
        table, lens = build_layer_tables([cache.requests[r].pages for r in rids], L, G)
        s = lens.astype(np.int64) - 1                              # the slot this step writes
        locs = np.take_along_axis(table, (s // P)[..., None], axis=-1)[..., 0].astype(np.int64) * P + s % P
        torch.from_numpy(np.ascontiguousarray(table.transpose(1, 0, 2, 3)))
        torch.from_numpy(np.ascontiguousarray(lens.transpose(1, 0, 2)))
        torch.from_numpy(locs)
        t_rebuild.append(time.perf_counter() - t0)
    tables = DeviceBlockTables(L, G, P, "cpu", rows=batch)
    tables.load(rids, rids, [cache.requests[r].pages for r in rids])
    decode_rows = BatchMemo()   # the served path's row lookup (TangramServing.decode_metadata)
    resolve = list              # rows == rids here; called only when the batch changes
    t_host, t_dev, t_check = [], [], []
    for _ in range(steps):
        tc = time.perf_counter()  # SGLang's capacity check (AdmissionControl.ensure_decode_room, no tree)
        assert cache.reserve_decode_step(rids) == 0
        t_check.append(time.perf_counter() - tc)
        t0 = time.perf_counter()
        rows = decode_rows.get(rids, resolve)
        step = cache.decode_step(rids)
        t1 = time.perf_counter()
        rows_t, _ = tables.decode(rows, step.opened, step.width)
        tables.seq_lens(rows_t)
        t2 = time.perf_counter()
        t_host.append(t1 - t0)
        t_dev.append(t2 - t1)
    return t_rebuild, t_host, t_dev, t_check


def run_sglang_steps(sg, P, batch, context, steps):
    """SGLang's host metadata of one decode step (paged allocator, req_to_token, seq_lens, indptr)."""
    torch, Alloc = sg
    total = context + steps + 1
    alloc = Alloc(size=(-(-total // P) + 1) * P * batch, page_size=P, dtype=torch.float16, device="cpu",
                  kvcache=None, need_sort=False)
    req_to_token = torch.zeros((batch, total + 1), dtype=torch.int32)
    rows = torch.arange(batch)
    lens = torch.tensor(contexts_of(batch, context), dtype=torch.int64)
    out = alloc.alloc(batch * (-(-context // P)) * P)
    req_to_token[:, :context] = out.view(batch, -1)[:, :context].to(torch.int32)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        last = req_to_token[rows, lens - 1].to(torch.int64)
        seq = lens + 1
        loc = alloc.alloc_decode(seq, seq.clone(), last)
        req_to_token[rows, lens] = loc.to(torch.int32)
        seq_i32 = seq.to(torch.int32)
        indptr = torch.zeros(batch + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(seq_i32, 0)
        times.append(time.perf_counter() - t0)
        lens = seq
    return times


DECODE_ROUNDS = 4   # --decode-step: rounds alternating Tangram's steps and SGLang's


def decode_step_main(args, sg, run_stamp: dict):
    rng = np.random.default_rng(0)
    P, B = args.page_size, args.batch
    rows = []
    for L in args.layers:
        for G in args.groups:
            beta = rng.uniform(0.05, 1.0, L * G)
            for ctx in args.contexts:
                # alternate the two in rounds of steps / ROUNDS, each from a fresh batch: the host's pace
                # drifts within a run, and one block each would put the drift between the columns
                t = {k: [] for k in ("rebuild", "host", "dev", "check", "sglang")}
                for _ in range(DECODE_ROUNDS):
                    for k, v in zip(("rebuild", "host", "dev", "check"),
                                    run_decode_steps(beta, L, G, P, B, ctx, args.steps // DECODE_ROUNDS)):
                        t[k] += v
                    if sg is not None:
                        t["sglang"] += run_sglang_steps(sg, P, B, ctx, args.steps // DECODE_ROUNDS)
                rebuild, dev = min(t["rebuild"]), min(t["dev"])
                host, check = (min(t["host"]), float(np.median(t["host"]))), float(np.median(t["check"]))
                row = dict(L=L, G=G, context=ctx, rebuild=1e6 * rebuild, host=1e6 * host[0],
                           host_median=1e6 * host[1], device_tables=1e6 * dev, check_median=1e6 * check,
                           host_and_check_median=1e6 * (host[1] + check))
                if sg is not None:
                    best_s, median_s = min(t["sglang"]), float(np.median(t["sglang"]))
                    row["sglang"], row["sglang_median"] = 1e6 * best_s, 1e6 * median_s
                rows.append(row)
                print({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    cols = [c for c in ("rebuild", "host", "device_tables", "sglang", "host_median", "check_median",
                                  "host_and_check_median", "sglang_median") if c in rows[0]]
    lines = [f"Host microseconds per decode step (best of {args.steps} steps in {DECODE_ROUNDS} rounds alternating "
             f"Tangram's and SGLang's; `_median` columns: the median step), batch {B} (contexts spread over [context - 511, context] so pages open at different "
             f"steps), P={P}, budgets uniform in [0.05, 1]; in brackets: time / sglang (medians to SGLang's "
             "median). `host` is what the served step costs the host now (the batch's rows, the "
             "pool's pages for the step); `device_tables` is torch work that runs on the device on a GPU "
             "(timed here on CPU). `check` is the capacity check SGLang runs before every decode step "
             "(ensure_decode_room without a tree: one pass that finds the step's pages and reserves them); "
             "`host_and_check` is what the host pays per served step in all.", "",
             "| L | G | context | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    for r in rows:
        def cell(c):
            base = r.get("sglang_median" if c.endswith("_median") else "sglang")
            return f"{r[c]:.0f}" + (f" ({r[c] / base:.2f}x)" if base and not c.startswith("sglang") else "")
        cells = [cell(c) for c in cols]
        lines.append(f"| {r['L']} | {r['G']} | {r['context']} | " + " | ".join(cells) + " |")
    write_json(os.path.join(args.out, "control_plane_decode.json"), dict(args=vars(args), rows=rows), run_stamp)
    print(write_markdown(os.path.join(args.out, "control_plane_decode.md"), "Host control plane per decode step",
                         lines, run_stamp))


def best_alternating(fns: dict, repeat: int) -> dict:
    """{name: each returned time, the best of repeat runs}: after one untimed warm-up run of each,
    repeat rounds that run every method once in turn, so a slow spell of the host falls on all of
    them alike."""
    for fn in fns.values():
        fn()
    runs = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            runs[name].append(fn())
    return {name: tuple(min(r[i] for r in rs) for i in range(len(rs[0]))) for name, rs in runs.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[16, 32, 80])
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-loop", action="store_true", help="skip the per-v Python loop baseline")
    ap.add_argument("--decode-step", action="store_true", help="per decode step of a running batch (see above)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 32768], help="--decode-step: tokens per request")
    ap.add_argument("--steps", type=int, default=256, help="--decode-step: steps timed (best and median reported)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "timing"), help="folder of the results files")
    args = ap.parse_args(argv)
    run_stamp = stamp(argv)
    if args.decode_step:
        return decode_step_main(args, load_sglang(), run_stamp)
    chunks = [args.chunk] * (args.tokens // args.chunk) + ([args.tokens % args.chunk] if args.tokens % args.chunk else [])
    sg = load_sglang()
    rng = np.random.default_rng(0)
    P, B, D = args.page_size, args.batch, args.decode
    rows = []
    for L in args.layers:
        for G in args.groups:
            beta = rng.uniform(0.05, 1.0, L * G)
            state = TangramState(beta, L, G, P, B, chunks, D)
            fns = dict(tangram=lambda: run_tangram(state, B, chunks, D),
                       tangram_tables=lambda: run_tangram(state, B, chunks, D, tables=True),
                       compress_reclaim=lambda: run_compress_reclaim(beta, L, G, P, B, chunks, D))
            if not args.no_loop:
                fns["per_v_loop"] = lambda: run_per_v_loop(beta, L, G, P, B, chunks, D)
            if sg is not None:
                fns["sglang_paged"] = lambda: run_sglang(sg, P, B, chunks, D)
            times = {k: tuple(1e6 * t / B for t in v) for k, v in best_alternating(fns, args.repeat).items()}
            row = dict(L=L, G=G, V=L * G, **{k: v[:2] for k, v in times.items()})
            row["write_slots"] = (times["tangram"][2],) * 2
            rows.append(row)
            print({k: (tuple(round(x) for x in v) if isinstance(v, tuple) else v) for k, v in row.items()}, flush=True)
    cols = [c for c in ("tangram", "tangram_tables", "write_slots", "compress_reclaim", "per_v_loop", "sglang_paged")
            if c in rows[0]]
    lines = [f"Host microseconds per request (best of {args.repeat} alternating rounds); batch {B}, {args.tokens} prompt tokens in "
             f"chunks of {args.chunk}, {D} decode steps (batched), P={P}. In brackets: time / tangram.", ""]
    for phase, idx in (("Prefill phase: admission + allocation of every chunk", 0),
                       ("Whole request: admission + prefill + decode + release", 1)):
        lines += [f"### {phase}", "", "| L | G | V | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
        for r in rows:
            base = r["tangram"][idx]
            cells = [f"{r[c][idx]:.0f}" + ("" if c == "tangram" else f" ({r[c][idx] / base:.2f}x)") for c in cols]
            lines.append(f"| {r['L']} | {r['G']} | {r['V']} | " + " | ".join(cells) + " |")
        lines.append("")
    if sg is None:
        lines += ["", "sglang_paged: skipped, SGLang's allocator did not import here."]
    write_json(os.path.join(args.out, "control_plane.json"), dict(args=vars(args), rows=rows), run_stamp)
    print(write_markdown(os.path.join(args.out, "control_plane.md"), "Host control plane per request", lines,
                         run_stamp))


if __name__ == "__main__":
    main()
