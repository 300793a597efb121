"""Correctness of SGLang with a profile on the device: tiny random models, greedy tokens compared.

Per architecture, five servers side by side: stock SGLang; a 1.0 profile with decode graphs and
without; a compressing profile (SnapKV, 0.4, 48-token chunks) with and without. Checked, per server:
  - turn 1: 7 prompts (5 to 230 tokens) in one batch, 16 greedy tokens each;
  - turn 2: each prompt, its answer and 3 new tokens: read from the tree (cached tokens) and answered;
  - the pool's integrity check after each turn (TANGRAM_INTEGRITY_CHECK=1 runs it on /server_info).
Compared: the 1.0 profile against stock (both turns); graph replay against eager (both profiles);
stock against HF's greedy tokens and the compressing profile against the dense oracle
(tangram_sglang.oracle, HF float32 on the CPU; Llama only, where the oracle's model code applies).
The last two cross devices (GPU server, CPU reference), so a differing token there may be float
rounding: the stock row says how often the device alone moves a greedy token.
"""

from __future__ import annotations

import os

from benchmarks.common.client import call, get_json
from benchmarks.gpu.models import compressing_file, tiny_model, tiny_module, uniform_file
from benchmarks.gpu.servers import Fleet, Server

NEW_TOKENS = 16
SAMPLING = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
ARCHS = ("llama", "qwen3", "gemma3")


def prompts() -> list[list[int]]:
    """The tests' four short prompts and three longer ones that span several 48-token chunks."""
    import numpy as np

    short = [[1, 5, 9, 200, 31], [7, 8, 9, 10, 11, 12, 13, 14], [100], list(range(40, 97))]
    rng = np.random.default_rng(3)
    return short + [rng.integers(2, 500, n).tolist() for n in (150, 230, 97)]


def servers(arch: str, work: str, pool: int = 4096) -> list[Server]:
    model = tiny_model(arch, os.path.join(work, arch))
    one = uniform_file(model, 1.0, os.path.join(work, f"{arch}-1.0.yaml"))
    comp = compressing_file(model, 0.4, os.path.join(work, f"{arch}-0.4.yaml"))
    base = dict(model=model, pool_tokens=pool, dtype="float32", max_bs=8)
    return [Server(f"{arch}-stock", **base),
            Server(f"{arch}-t1.0", profile=one, **base), Server(f"{arch}-t1.0-eager", profile=one, graphs=False, **base),
            Server(f"{arch}-t0.4", profile=comp, **base), Server(f"{arch}-t0.4-eager", profile=comp, graphs=False, **base)]


def generate(url: str, batch: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """(output ids, cached tokens) of one batched greedy /generate."""
    status, out = call(url + "/generate", {"input_ids": batch, "sampling_params": SAMPLING}, timeout=300)
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {str(out)[:500]}")
    return [r["output_ids"] for r in out], [int(r["meta_info"].get("cached_tokens", 0)) for r in out]


def integrity(url: str) -> str | None:
    """The pool's integrity check ('ok' or what failed); None on stock."""
    state = get_json(url + "/server_info")["internal_states"][0]
    tangram = state.get("tangram")
    return None if tangram is None else tangram["pool_info"].get("integrity")


def serve_turns(url: str, batch: list[list[int]]) -> dict:
    """Both turns on one server: tokens, cached tokens, integrity after each."""
    out1, _ = generate(url, batch)
    ok1 = integrity(url)
    turn2 = [p + o + [5, 6, 7] for p, o in zip(batch, out1)]
    out2, cached = generate(url, turn2)
    return {"turn1": out1, "turn2": out2, "cached2": cached, "integrity": [ok1, integrity(url)], "turn2_prompts": turn2}


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """How many sequences match exactly, and the first differing position of each that does not."""
    same = [x == y for x, y in zip(a, b)]
    first = [next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
             for x, y, s in zip(a, b, same) if not s]
    return {"equal": sum(same), "of": len(same), "first_difference": first}


def references(arch: str, model_path: str, batch: list[list[int]], profile_path: str) -> dict:
    """HF greedy tokens and the dense oracle's (compressing profile), float32 on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    out = {"hf": tiny_module().hf_greedy(model, batch, NEW_TOKENS)}
    if arch == "llama":
        from tangram_sglang.oracle.serving_reference import reference_generate
        from tangram_sglang.profile import load_profile
        from tangram_sglang.scorers.profile_scorer import profile_scorer

        prof = load_profile(profile_path)
        out["oracle"] = [reference_generate(model, prof.select(), heads_per_group=1,
                                            method=profile_scorer(prof, profile_path), prompt_ids=p,
                                            max_new_tokens=NEW_TOKENS, chunk_size=48) for p in batch]
    return out


def check_arch(arch: str, fleet: Fleet, specs: list[Server]) -> dict:
    """Every comparison of one architecture's servers (missing servers reported, not raised)."""
    batch, up, runs, errors = prompts(), fleet.up(), {}, {}
    for spec in specs:
        if spec.name not in up:
            continue
        try:
            runs[spec.name] = serve_turns(up[spec.name].url, batch)
        except Exception as exc:
            errors[spec.name] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    row = {"arch": arch, "errors": errors, "integrity": {n: r["integrity"] for n, r in runs.items()},
           "cached_turn2": {n: sum(r["cached2"]) for n, r in runs.items()},
           "turn2_prompt_tokens": sum(len(p) for p in next(iter(runs.values()))["turn2_prompts"]) if runs else 0}
    pairs = {"t1.0 vs stock": ("t1.0", "stock"), "t1.0 eager vs stock": ("t1.0-eager", "stock"),
             "t1.0 graphs vs eager": ("t1.0", "t1.0-eager"), "t0.4 graphs vs eager": ("t0.4", "t0.4-eager")}
    for label, (a, b) in pairs.items():
        ra, rb = runs.get(f"{arch}-{a}"), runs.get(f"{arch}-{b}")
        if ra and rb:
            row[label] = {t: agreement(ra[t], rb[t]) for t in ("turn1", "turn2")}
    try:
        refs = references(arch, specs[0].model, batch, next(s.profile for s in specs if s.name.endswith("t0.4")))
        for name in ("stock", "t1.0"):
            if f"{arch}-{name}" in runs:
                row[f"{name} vs HF (CPU)"] = agreement(runs[f"{arch}-{name}"]["turn1"], refs["hf"])
        if "oracle" in refs and f"{arch}-t0.4" in runs:
            row["t0.4 vs oracle (CPU)"] = agreement(runs[f"{arch}-t0.4"]["turn1"], refs["oracle"])
    except Exception as exc:
        errors["references"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    return row


def run(work: str, log_dir: str, port: int, cuda: bool, archs=ARCHS, timeout: float = 300) -> dict:
    """All architectures' servers at once (tiny: they share the device easily), then the checks."""
    specs = {arch: servers(arch, work) for arch in archs}
    flat = [s for group in specs.values() for s in group]
    with Fleet(flat, port, log_dir, cuda) as fleet:
        ready = fleet.start(timeout)
        rows = [check_arch(arch, fleet, specs[arch]) for arch in archs]
    return {"ready_s": ready, "failed_to_start": fleet.failed, "archs": rows}
