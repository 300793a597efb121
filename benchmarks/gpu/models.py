"""Models and profiles of the GPU run: tiny random models built where the run happens (no weights
travel), the paper models' configs under ``--load-format dummy``, and the profiles served on them."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

import numpy as np

from benchmarks.common.paths import ROOT
from tangram_sglang.profile import ModelShape, load_profile
from tangram_sglang.profile.builder import make_entry
from tangram_sglang.profile.uniform import uniform_profile

CONFIGS = os.path.join(ROOT, "configs", "models")
REFERENCE = os.path.join(ROOT, "configs", "reference")


def tiny_module():
    """tests/tiny_model.py: the tests' tiny random models and their HF greedy tokens."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import tiny_model
    finally:
        sys.path.pop(0)
    return tiny_model


def tiny_model(arch: str, path: str) -> str:
    """A tiny random model of ``arch`` (llama, qwen3, gemma3) saved in float32 at ``path`` (tests/tiny_model.py)."""
    tm = tiny_module()
    if not os.path.exists(os.path.join(path, "config.json")):
        tm.build_tiny_llama(path) if arch == "llama" else tm.build_tiny(arch, path)
    return path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def kit_tokenizer() -> str:
    """The tokenizer the GPU kit carries (``$TANGRAM_GPU_KIT/_tokenizers/smollm2``, launch/gpu_kit/build.py),
    else the converted SmolLM2 of this machine's cache (launch/models.py)."""
    kit = os.environ.get("TANGRAM_GPU_KIT")
    if kit and os.path.exists(os.path.join(kit, "_tokenizers", "smollm2", "tokenizer.json")):
        return os.path.join(kit, "_tokenizers", "smollm2")
    from benchmarks.common.models import ensure_model

    return ensure_model("smollm2")


def tokenizer_vocab(tokenizer: str) -> tuple[int, dict[str, int]]:
    """(vocabulary size, special-token ids by role) of a tokenizer folder, read from its JSON files."""
    with open(os.path.join(tokenizer, "tokenizer.json")) as f:
        tok = json.load(f)
    ids = dict(tok["model"]["vocab"]) | {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    with open(os.path.join(tokenizer, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    roles = {role: ids[cfg[f"{role}_token"]] for role in ("bos", "eos", "pad") if cfg.get(f"{role}_token") in ids}
    return max(ids.values()) + 1, roles


def dummy_model(config: str, path: str, tokenizer: str | None = None, **overrides) -> str:
    """A folder for ``--load-format dummy``: ``config`` (a configs/models name or a config.json path) with
    ``overrides``; with ``tokenizer``, its files too and the config's vocabulary and special ids made
    the tokenizer's (the model keeps every shape the KV cache and attention see)."""
    src = config if config.endswith(".json") else os.path.join(CONFIGS, config, "config.json")
    with open(src) as f:
        cfg = json.load(f) | overrides
    if tokenizer:
        vocab, special = tokenizer_vocab(tokenizer)
        cfg.update(vocab_size=vocab, **{f"{role}_token_id": i for role, i in special.items()})
        for name in TOKENIZER_FILES:
            if os.path.exists(os.path.join(tokenizer, name)):
                os.makedirs(path, exist_ok=True)
                shutil.copy(os.path.join(tokenizer, name), os.path.join(path, name))
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def uniform_file(model_path: str, ratio: float, out: str, heads_per_group: int = 1,
                 parallel_capacity: int = 8, chunk_size: int | None = None) -> str:
    """A uniform profile at ``ratio`` (1.0: Tangram's data plane with nothing compressed)."""
    prof = uniform_profile(ModelShape.from_model_path(model_path), [ratio], heads_per_group=heads_per_group,
                           parallel_capacity=parallel_capacity)
    if chunk_size:
        prof = dataclasses.replace(prof, calibration=dataclasses.replace(prof.calibration, chunk_size=chunk_size))
    prof.save(out)
    return out


def compressing_file(model_path: str, ratio: float, out: str, chunk: int = 48, seed: int = 0) -> str:
    """A non-uniform SnapKV profile for a tiny model: each full-attention head keeps a random share in
    [ratio, 2 ratio] (window layers keep every token), one head per group, compression chunks of ``chunk``."""
    shape = ModelShape.from_model_path(model_path)
    prof = uniform_profile(shape, [ratio], parallel_capacity=8)
    rng = np.random.default_rng(seed)
    budgets = rng.uniform(ratio, min(1.0, 2 * ratio), size=(shape.num_layers, shape.num_kv_heads))
    budgets[np.asarray(shape.windows) > 0] = 1.0
    entry = make_entry(ratio, budgets, budgets, np.zeros_like(budgets), heads_per_group=1,
                       grouping="budget_aware", parallel_capacity=8)
    meta = dataclasses.replace(prof.calibration, method="snapkv", chunk_size=chunk)
    dataclasses.replace(prof, calibration=meta, entries=(entry,), default_ratio=ratio).save(out)
    return out


def reference_file(name: str, out: str, chunk_size: int) -> str:
    """``configs/reference/<name>.yaml`` with its compression chunk set to ``chunk_size``: the authors'
    32,768-token chunk would leave every prompt of the run a partial chunk the tree cannot reuse."""
    prof = load_profile(os.path.join(REFERENCE, f"{name}.yaml"))
    meta = dataclasses.replace(prof.calibration, chunk_size=chunk_size)
    dataclasses.replace(prof, calibration=meta).save(out)
    return out
