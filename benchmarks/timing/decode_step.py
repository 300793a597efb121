"""Served decode step: Tangram against stock SGLang's default attention backend, same batch and context.

Every server runs at once (stock SGLang, then one per --profiles entry at --ratio, and with
--uniform-1 a uniform profile at ratio 1.0: Tangram's data plane with nothing compressed), the
same --max-total-tokens, --sleep-on-idle, but only one works at a time. A batch is --batch
real-text prompts of --context tokens sent together (one thread each), greedy, ignore_eos. Each
server first prefills them once (max_new_tokens 1), so later batches find their prompts in the
radix tree (prompts are --context + 1 tokens: Tangram's tree reuses whole compression chunks, so
a repeat extends one token on both). Then, per repetition and server in turn: the batch with max_new_tokens 1 (time T1:
the cached prefix, one extended token, one sampling step) and with max_new_tokens M + 1 (T2).
The decode step is (T2 - T1) / M: M steps of the whole batch at this context, prefill cancelled
out. Reported: the median step over repetitions and the median over repetitions of each
server's step over stock's in the same repetition (measured side by side, so the machine's
load of the moment is shared).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.timing.decode_step --profiles configs/smollm2-snapkv.yaml \\
        --ratio 0.25 --uniform-1
    # writes benchmarks/results/timing/decode_step.{json,md}; on a GPU host (bash launch/setup.sh there)
    # the same command times stock's default GPU backend against the Triton data plane
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

from benchmarks.common.client import generate
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import result_path
from benchmarks.common.stamp import stamp
from benchmarks.timing.prefill_cost import prompts, uniform_profile_file, write_report
from tangram_sglang.sglang.server_process import ServerProcess


def generate_exactly(url: str, ids: list[int], new_tokens: int) -> int:
    """Greedy /generate of ``new_tokens`` tokens (ignore_eos); raises if the server made another count."""
    out = generate(url, ids, new_tokens, ignore_eos=True)
    got = len(out.get("output_ids") or []) or int(out["meta_info"]["completion_tokens"])
    if got != new_tokens:
        raise RuntimeError(f"{url}: {got} tokens generated, {new_tokens} asked")
    return got


def batch_seconds(url: str, batch: list[list[int]], new_tokens: int) -> float:
    """Wall time of the whole batch sent at once."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(batch)) as pool:
        list(pool.map(lambda ids: generate_exactly(url, ids, new_tokens), batch))
    return time.perf_counter() - t0


def measure(model_path: str, servers: list[tuple[str, str | None, float | None]], batch, args) -> list[dict]:
    steps: list[list[float]] = [[] for _ in servers]
    with ExitStack() as stack:
        procs = []
        for i, (_, profile, ratio) in enumerate(servers):
            extra = ["--max-total-tokens", str(args.max_total_tokens), "--sleep-on-idle"]
            extra += ["--tangram-ratio", str(ratio)] if profile else []
            procs.append(stack.enter_context(ServerProcess(model_path, port=args.port + i, profile=profile,
                                                           extra_args=extra, start_timeout=900)))
        for proc in procs:
            batch_seconds(proc.url, batch, 1)   # prefill once: the prompts are in the tree from now on
        for rep in range(args.reps):
            for i, proc in enumerate(procs):
                t1 = batch_seconds(proc.url, batch, 1)
                t2 = batch_seconds(proc.url, batch, args.new_tokens + 1)
                steps[i].append((t2 - t1) / args.new_tokens)
            print(f"[decode_step] rep {rep + 1}/{args.reps}: " + ", ".join(
                f"{name} {s[-1] * 1e3:.1f} ms" for (name, _, _), s in zip(servers, steps)), flush=True)
    rows = []
    for (name, profile, ratio), s in zip(servers, steps):
        rows.append({"server": name, "profile": profile, "ratio": ratio, "step_ms": round(statistics.median(s) * 1e3, 2),
                     "steps_ms": [round(x * 1e3, 2) for x in s],
                     "vs_stock": round(statistics.median(a / b for a, b in zip(s, steps[0])), 3)})
    return rows


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (float32, one thread per server)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--profiles", nargs="*", default=[])
    ap.add_argument("--ratio", type=float, default=0.25)
    ap.add_argument("--uniform-1", action="store_true", help="also serve a uniform profile at ratio 1.0")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-total-tokens", type=int, default=None, help="default: the batch's tokens x 1.25")
    ap.add_argument("--port", type=int, default=31800)
    ap.add_argument("--out", default=result_path("timing", "decode_step"), help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    run_stamp = stamp(argv)
    from transformers import AutoTokenizer

    model_path = ensure_model(args.model)
    args.max_total_tokens = args.max_total_tokens or int(args.batch * (args.context + args.new_tokens + 2) * 1.25)
    # context + 1 tokens: a repeat finds the context's whole compression chunks in Tangram's tree (it
    # reuses whole chunks) and extends one token, as stock does: both then decode the batch together
    batch = prompts(AutoTokenizer.from_pretrained(model_path), args.batch, args.context + 1)[1:]
    servers = [("stock SGLang (full KV)", None, None)]
    if args.uniform_1:
        servers.append(("Tangram, uniform 1.0 (nothing compressed)", uniform_profile_file(model_path, 1.0), 1.0))
    servers += [(f"Tangram, {os.path.basename(p)} {args.ratio:g}", os.path.abspath(p), args.ratio)
                for p in args.profiles]
    rows = measure(model_path, servers, batch, args)
    result = {"model": args.model, "device": device_name(), "batch": args.batch, "context": args.context,
              "new_tokens": args.new_tokens, "reps": args.reps, "max_total_tokens": args.max_total_tokens,
              "rows": rows}
    lines = [f"{args.model} on {result['device']}: a batch of {args.batch} prompts of {args.context} tokens "
             f"(cached in the tree), {args.new_tokens} decode steps timed, {args.reps} repetitions, servers "
             f"side by side (one busy at a time), --max-total-tokens {args.max_total_tokens} each.", "",
             "| server | median ms per decode step | vs stock (median of per-repetition ratios) |", "|---|---|---|"]
    lines += [f"| {r['server']} | {r['step_ms']} | {r['vs_stock']} |" for r in rows]
    write_report(args.out, "Served decode step against stock SGLang", result, lines, run_stamp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
