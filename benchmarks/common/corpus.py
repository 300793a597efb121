"""Real text for prompts: the repository's own docs, and the essays of the calibration package."""

from __future__ import annotations

import glob
import os

from benchmarks.common.paths import ROOT


def repo_texts(names) -> list[str]:
    """The texts of the repository files ``names`` (paths from the root) that exist."""
    out = []
    for name in names:
        path = os.path.join(ROOT, name)
        if os.path.exists(path):
            with open(path) as f:
                out.append(f.read())
    return out


def essay_texts(count: int = 8) -> list[str]:
    """The first ``count`` Paul Graham essays of the calibration data."""
    from tangram_sglang.calibration.datasets import essays_dir

    out = []
    for path in sorted(glob.glob(os.path.join(essays_dir(), "*.txt")))[:count]:
        with open(path) as f:
            out.append(f.read())
    return out


def essay_token_ids(tokenizer, min_tokens: int = 12000) -> list[int]:
    """~24K token ids of real English: eight essays joined by blank lines."""
    ids = tokenizer("\n\n".join(essay_texts()), add_special_tokens=False)["input_ids"]
    if len(ids) <= min_tokens:
        raise RuntimeError(f"the essays hold {len(ids)} tokens, fewer than {min_tokens}: is the calibration data "
                           "installed?")
    return ids


def distinct_prompts(tok, names, count: int, tokens: int) -> list[list[int]]:
    """count + 1 windows of ``tokens`` token ids over the texts of ``names``, sharing no prefix (the first is
    a warm-up). Short texts are extended by reversed copies of themselves."""
    ids = tok.encode("\n".join(repo_texts(names)))
    while len(ids) < tokens * (count + 1):
        ids = ids + ids[::-1]  # enough distinct material; reversed copies share no prefix with the original
    step = (len(ids) - tokens) // (count + 1)
    return [ids[i * step + 1:i * step + 1 + tokens] for i in range(count + 1)]
