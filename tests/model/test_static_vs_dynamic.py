"""Static budgets cover the dynamic method they freeze (paper Eq. 5, Figure 9's premise).

On held-out pilot samples, SmolLM2 runs through the dense oracle with the dynamic
selection (per-chunk global top-k over each layer's heads, paper Eq. 3). The share
of its chunk that head h of layer l keeps must, for most (sample, chunk, head),
stay within the shipped static budget b[l][h] = mu + alpha * sigma (the "alpha
margin"): the calibration's own held-out coverage is about 97%.
"""

import pathlib

import numpy as np
import pytest
import torch

from tangram_sglang.method.protection import NONE
from tangram_sglang.oracle.serving_reference import DynamicSelection, reference_run
from tangram_sglang.profile import load_profile

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ratio", [0.5, 0.25])
def test_static_budgets_cover_dynamic_retention(smollm2_path, ratio):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tangram_sglang.calibration.samples import SampleSpec, build_samples

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    samples = build_samples(tok, SampleSpec(count=2, min_tokens=1024, max_tokens=1024, seed=7), split="heldout")
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    profile = load_profile(str(REPO / "configs" / "smollm2-snapkv.yaml"))
    entry = profile.select(ratio)
    covered, total, shares = 0, 0, []
    for sample in samples:
        run = reference_run(model, entry, heads_per_group=1, method="snapkv", prompt_ids=list(sample.token_ids),
                            max_new_tokens=1, protection=NONE, selection=DynamicSelection(ratio))
        for layer, kept in enumerate(run.kept):
            for s, e in run.chunks:
                share = kept[:, s:e].float().mean(dim=1).numpy()  # [H]
                shares.append(share.mean())
                covered += int((share <= entry.budgets[layer] + 1e-9).sum())
                total += share.size
    assert abs(float(np.mean(shares)) - ratio) < 0.01  # the dynamic method keeps rho of every chunk
    assert covered / total >= 0.9, f"static budgets cover {covered}/{total} dynamic retentions"
