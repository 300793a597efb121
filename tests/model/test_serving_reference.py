"""The dense serving oracle: lossless at budget 1.0, per-head keep counts, the masking rule by hand."""

import math
import pathlib

import numpy as np
import pytest
import torch
from tiny_model import NEW_TOKENS

from tangram_sglang.method.budgets import keep_count
from tangram_sglang.method.chunks import split_tokens
from tangram_sglang.method.protection import NONE, Protection, chunk_protection
from tangram_sglang.oracle.serving_reference import (
    DynamicSelection,
    UniformSelection,
    allowed_keys,
    chunk_bounds,
    masked_attention,
    reference_generate,
    reference_run,
    top_positions,
)
from tangram_sglang.profile import ModelShape, load_profile
from tangram_sglang.profile.builder import make_entry
from tangram_sglang.profile.uniform import uniform_profile
from tangram_sglang.scorers.selection import per_head_topk_indices

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def uniform_entry(model, ratio):
    shape = ModelShape.from_hf_config(model.config)
    return uniform_profile(shape, [ratio], parallel_capacity=4).select(ratio)


def entry_with_budgets(budgets, heads_per_group):
    b = np.asarray(budgets, dtype=np.float64)
    return make_entry(0.5, b, b, np.zeros_like(b), heads_per_group=heads_per_group, grouping="adjacent",
                      parallel_capacity=4)


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    """(model, prompts, HF greedy outputs) of the tiny random Llama (2 layers, 2 KV heads, 4 q heads)."""
    path, prompts, hf = tiny_llama
    return load_model(path), prompts, hf


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    path = smollm2_path  # installed by launch/test.sh: a failure to install or convert fails the tests
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(path)(
        "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is")["input_ids"]
    return load_model(path), ids


def generate(model, entry, prompt, **kw):
    kw.setdefault("max_new_tokens", NEW_TOKENS)
    kw.setdefault("protection", NONE)  # compression mechanics; protection has its own tests
    return reference_generate(model, entry, heads_per_group=1, method=kw.pop("method", "snapkv"),
                              prompt_ids=prompt, **kw)


def assert_keep_counts(run, entry, protection=NONE):
    """Per layer, chunk and head: exactly max(keep_count(beta of its group, n), protected) kept;
    decode all kept."""
    prompt_len = run.chunks[-1][1]
    for layer, kept in enumerate(run.kept):
        for s, e in run.chunks:
            floor = sum(chunk_protection(protection, s, [e - s], prompt_len)[0])
            for g, group in enumerate(entry.groups[layer]):
                want = max(int(keep_count(entry.group_budget[layer, g], e - s)), floor)
                for h in group:
                    assert int(kept[h, s:e].sum()) == want, (layer, (s, e), h)
        assert bool(kept[:, prompt_len:].all())


# --- budget 1.0 is lossless ------------------------------------------------------------------

def test_full_budget_matches_hf_greedy_tiny(tiny):
    model, prompts, hf = tiny
    entry = uniform_entry(model, 1.0)
    for prompt, want in zip(prompts, hf):
        assert generate(model, entry, prompt, chunk_size=8) == want
    ragged = [1, 20, len(prompts[3]) - 21]  # uneven schedule, including a 1-token chunk
    assert generate(model, entry, prompts[3], chunk_tokens=ragged, method="keydiff") == hf[3]


def test_full_budget_matches_hf_greedy_smollm2(smollm2):
    model, ids = smollm2
    want = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    assert generate(model, uniform_entry(model, 1.0), ids, chunk_size=8, max_new_tokens=8) == want


# --- ratio < 1 -------------------------------------------------------------------------------

@pytest.mark.parametrize("heads_per_group", [1, 2])
def test_kept_counts_per_head_per_chunk(tiny, heads_per_group):
    model, prompts, _ = tiny
    entry = entry_with_budgets([[0.25, 0.6], [0.5, 0.3]], heads_per_group)
    run = reference_run(model, entry, heads_per_group=heads_per_group, method="keydiff", prompt_ids=prompts[3],
                        max_new_tokens=4, chunk_size=8, protection=NONE)
    assert run.chunks[-1] == (56, 57) and len(run.chunks) == 8
    assert_keep_counts(run, entry)
    assert all(state.tokens_seen == len(prompts[3]) for state in run.states)
    if heads_per_group == 2:  # same count per group, but each head picks its own tokens
        assert any(not torch.equal(kept[0, :56], kept[1, :56]) for kept in run.kept)


def test_chunks_that_keep_everything_reproduce_full_attention(tiny):
    model, prompts, hf = tiny
    entry = uniform_entry(model, 0.5)
    prompt = prompts[1]
    # keep_count(0.5, 1) = 1: one-token chunks keep every token
    assert generate(model, entry, prompt, chunk_tokens=[1] * len(prompt)) == hf[1]
    # one chunk: nothing is compressed before the first token is chosen
    run = reference_run(model, entry, heads_per_group=1, method="snapkv", prompt_ids=prompt, max_new_tokens=1,
                        protection=NONE)
    full = model(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(run.prompt_logits, full, rtol=1e-4, atol=1e-4)
    assert run.tokens == hf[1][:1]



def fixed_chunks(prompt, size):
    """Explicit chunks of ``size`` (the oracle's legacy mode: the newest tokens of the prompt protected):
    these tests check selection mechanics chunk by chunk, not the served chunk rule."""
    return split_tokens(len(prompt), size)


def test_compression_changes_output_tiny(tiny):
    model, prompts, hf = tiny
    entry = uniform_entry(model, 0.25)
    outs = [generate(model, entry, p, chunk_size=8) for p in prompts]
    assert outs[2] == hf[2]  # a 1-token prompt has nothing to drop
    assert any(out != want for out, want in zip(outs, hf))


def test_smollm2_snapkv_profile_ratio_025(smollm2):
    model, ids = smollm2
    profile = load_profile(str(REPO / "configs" / "smollm2-snapkv.yaml"))
    entry = profile.select(0.25)
    run = reference_run(model, entry, heads_per_group=profile.heads_per_group, method="snapkv", prompt_ids=ids,
                        max_new_tokens=8, chunk_tokens=fixed_chunks(ids, 8), protection=NONE)
    assert_keep_counts(run, entry)
    full = generate(model, uniform_entry(model, 1.0), ids, chunk_size=8, max_new_tokens=8)
    assert run.tokens != full


def test_stop_token_ends_generation_and_is_returned(tiny):
    model, prompts, hf = tiny
    entry = uniform_entry(model, 1.0)
    stop = hf[0][2]
    out = generate(model, entry, prompts[0], stop_ids={stop})
    assert out == hf[0][: hf[0].index(stop) + 1]


# --- small pieces and the masking rule by hand ------------------------------------------------

def test_chunk_bounds():
    assert chunk_bounds(10, None, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(5, [2, 3]) == [(0, 2), (2, 5)]
    with pytest.raises(ValueError):
        chunk_bounds(5, [2, 2])
    with pytest.raises(ValueError):
        chunk_bounds(2, [2, 0])


def test_top_positions_tie_rule_matches_selection():
    row = torch.tensor([0.5, 0.9, 0.5, 0.5, float("-inf"), float("-inf")])
    assert top_positions(row, 3) == [1, 3, 2]
    assert top_positions(row, 6) == [1, 3, 2, 0, 5, 4]
    torch.manual_seed(0)
    scores = torch.randint(0, 4, (3, 12)).float()  # many ties
    for count in range(13):
        served = per_head_topk_indices(scores, count)
        assert [top_positions(scores[h], count) for h in range(3)] == [t.tolist() for t in served]


def test_allowed_keys_by_hand():
    kept = torch.tensor([[True, False, True], [False, False, False]])  # H = 2 heads, s = 3
    allowed = allowed_keys(kept, 2)
    assert allowed.shape == (2, 2, 5)
    assert allowed[0].tolist() == [[True, False, True, True, False], [True, False, True, True, True]]
    assert allowed[1].tolist() == [[False, False, False, True, False], [False, False, False, True, True]]


def test_masked_attention_row_is_softmax_over_allowed_keys():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)  # Hq = 4, H = 2
    allowed = allowed_keys(torch.tensor([[True, False, True], [False, True, True]]), 2)
    out = masked_attention(q, k, v, allowed)
    i, j = 1, 3  # last query, query head 3 -> KV head 1 sees keys 1, 2, 3, 4
    logits = torch.stack([q[i, j] @ k[p, 1] / math.sqrt(8) for p in (1, 2, 3, 4)])
    w = torch.exp(logits - logits.max())
    manual = sum(wp * v[p, 1] for wp, p in zip(w / w.sum(), (1, 2, 3, 4)))
    torch.testing.assert_close(out[i, j], manual)


def test_one_layer_model_last_row_by_hand(tmp_path):
    """1-layer Llama: the last prompt position's logits from a manual softmax over its allowed keys."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    prompt = [3, 9, 27, 17, 51, 42, 11, 5, 60, 8, 33, 2]
    entry = uniform_entry(model, 0.5)
    run = reference_run(model, entry, heads_per_group=1, method="keydiff", prompt_ids=prompt, max_new_tokens=1,
                        chunk_tokens=[5, 4, 3], protection=NONE)
    kept = run.kept[0]
    assert kept[:, :9].sum(dim=1).tolist() == [3 + 2, 3 + 2]  # ceil(.5*5) + ceil(.5*4) per head

    # Layer 0's q, k, v do not depend on the chunking: compute them for all positions at once.
    attn, n, d = model.model.layers[0].self_attn, len(prompt), 8
    with torch.no_grad():
        x = model.model.embed_tokens(torch.tensor(prompt))
        h = model.model.layers[0].input_layernorm(x)
        q = attn.q_proj(h).view(1, n, 4, d).transpose(1, 2)
        k = attn.k_proj(h).view(1, n, 2, d).transpose(1, 2)
        v = attn.v_proj(h).view(n, 2, d)
        cos, sin = model.model.rotary_emb(x[None], torch.arange(n)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        i, heads = n - 1, []
        for j in range(4):
            kv = j // 2
            keys = [p for p in range(9) if kept[kv, p]] + [9, 10, 11]  # kept earlier + causal in chunk
            logits = torch.stack([q[0, j, i] @ k[0, kv, p] / math.sqrt(d) for p in keys])
            w = torch.softmax(logits, dim=0)
            heads.append(sum(wp * v[p, kv] for wp, p in zip(w, keys)))
        y = x[i] + attn.o_proj(torch.cat(heads))
        y = y + model.model.layers[0].mlp(model.model.layers[0].post_attention_layernorm(y))
        want = model.lm_head(model.model.norm(y[None]))[0]
    torch.testing.assert_close(run.prompt_logits, want, rtol=1e-5, atol=1e-5)
    assert run.tokens == [int(want.argmax())]


def test_full_budget_matches_hf_greedy_tiny_qwen2():
    """Qwen2 (q/k/v biases) runs through the same layer loop."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(4)
    cfg = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    for layer in model.model.layers:  # random init leaves biases at zero; make them count
        torch.nn.init.normal_(layer.self_attn.q_proj.bias)
        torch.nn.init.normal_(layer.self_attn.k_proj.bias)
    prompt = list(range(3, 23))
    want = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8,
                          do_sample=False)[0, len(prompt):].tolist()
    assert generate(model, uniform_entry(model, 1.0), prompt, chunk_size=6, max_new_tokens=8) == want


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "gpt_oss"])
def test_full_budget_matches_hf_greedy_other_architectures(arch, tmp_path):
    """Qwen3 (q/k norms), Gemma 3 (sandwich norms, a RoPE per layer type, two layers attending to a
    24-token window that the 57-token prompt reaches past) and gpt-oss (a window layer, learned sinks,
    experts) run through the same layer loop."""
    from tiny_model import PROMPTS, build_tiny, hf_greedy

    model = build_tiny(arch, str(tmp_path))
    entry = uniform_entry(model, 1.0)
    for prompt, want in zip(PROMPTS, hf_greedy(model)):
        assert generate(model, entry, prompt, chunk_size=16) == want


def test_window_layers_keep_everything_and_model_scope_spans_full_layers(tmp_path):
    """Gemma 3 with the dynamic method of model scope: the window layers keep every position, the
    one full-attention layer keeps the global top share of its heads' scores."""
    from tiny_model import build_tiny

    model = build_tiny("gemma3", str(tmp_path))
    prompt = list(range(3, 83))
    run = reference_run(model, uniform_entry(model, 1.0), heads_per_group=1, method="snapkv", prompt_ids=prompt,
                        max_new_tokens=4, chunk_size=40, selection=DynamicSelection(0.25, "model"),
                        protection=NONE)
    assert bool(run.kept[0].all()) and bool(run.kept[2].all())
    for s, e in run.chunks:
        assert int(run.kept[1][:, s:e].sum()) == math.ceil(0.25 * 2 * (e - s))


# --- protected tokens and the benchmark's selection policies ----------------------------------

def test_sinks_and_newest_are_kept_by_every_head(tiny):
    model, prompts, _ = tiny
    entry = entry_with_budgets([[0.1, 0.2], [0.15, 0.1]], 1)
    prot = Protection(sinks=3, newest=10)
    run = reference_run(model, entry, heads_per_group=1, method="keydiff", prompt_ids=prompts[3],
                        max_new_tokens=2, chunk_tokens=fixed_chunks(prompts[3], 8), protection=prot)
    n = len(prompts[3])
    for kept in run.kept:
        assert bool(kept[:, :3].all()) and bool(kept[:, n - 10:n].all())
    assert_keep_counts(run, entry, prot)


def test_newest_of_every_turn_are_protected(tiny):
    """A multi-turn prompt: each turn's request protected its own newest tokens when it was served."""
    model, prompts, _ = tiny
    entry = entry_with_budgets([[0.1, 0.2], [0.15, 0.1]], 1)
    prot = Protection(sinks=0, newest=4)
    ids = prompts[3]
    run = reference_run(model, entry, heads_per_group=1, method="keydiff", prompt_ids=ids, max_new_tokens=1,
                        chunk_tokens=[8, 12, 8, len(ids) - 28], turn_ends=[20], protection=prot)
    for kept in run.kept:
        assert bool(kept[:, 16:20].all()) and bool(kept[:, len(ids) - 4:].all())


def test_chunk_protection_runs():
    p = Protection(sinks=4, newest=64)
    assert chunk_protection(p, 0, [512, 88], 600) == [(4, 0), (0, 64)]
    assert chunk_protection(p, 520, [80], 600) == [(0, 64)]
    assert chunk_protection(p, 0, [2, 30, 40], 72) == [(2, 0), (2, 24), (0, 40)]  # newest from 8
    assert chunk_protection(Protection(4, 10), 0, [6], 6) == [(4, 2)]  # overlap counted once
    with pytest.raises(ValueError):
        Protection(sinks=-1)


def test_dynamic_selection_is_a_global_topk_per_chunk(tiny):
    model, prompts, _ = tiny
    entry = uniform_entry(model, 1.0)
    run = reference_run(model, entry, heads_per_group=1, method="keydiff", prompt_ids=prompts[3], max_new_tokens=1,
                        chunk_tokens=fixed_chunks(prompts[3], 8), protection=NONE, selection=DynamicSelection(0.3))
    heads = run.kept[0].shape[0]
    for kept in run.kept:
        for s, e in run.chunks:
            assert int(kept[:, s:e].sum()) == int(keep_count(0.3, heads * (e - s)))
    counts = {tuple(k[:, s:e].sum(1).tolist()) for k in run.kept for s, e in run.chunks[:-1]}
    assert len(counts) > 1  # heads share a layer's budget unevenly, differently per chunk


def test_dynamic_model_scope_is_a_global_topk_over_all_layers(tiny):
    model, prompts, _ = tiny
    entry = uniform_entry(model, 1.0)
    run = reference_run(model, entry, heads_per_group=1, method="keydiff", prompt_ids=prompts[3], max_new_tokens=1,
                        chunk_tokens=fixed_chunks(prompts[3], 8), protection=NONE,
                        selection=DynamicSelection(0.3, scope="model"))
    layers, heads = len(run.kept), run.kept[0].shape[0]
    for s, e in run.chunks:
        assert sum(int(kept[:, s:e].sum()) for kept in run.kept) == int(keep_count(0.3, layers * heads * (e - s)))
    per_layer = {tuple(int(k[:, s:e].sum()) for k in run.kept) for s, e in run.chunks[:-1]}
    assert any(len(set(c)) > 1 for c in per_layer)  # layers no longer keep the same share
    with pytest.raises(ValueError, match="scope"):
        DynamicSelection(0.3, scope="head")


def test_dynamic_model_scope_keeps_protected_tokens(tiny):
    model, prompts, _ = tiny
    entry = uniform_entry(model, 1.0)
    prot = Protection(sinks=2, newest=3)
    run = reference_run(model, entry, heads_per_group=1, method="keydiff", prompt_ids=prompts[3], max_new_tokens=1,
                        chunk_tokens=fixed_chunks(prompts[3], 8), protection=prot,
                        selection=DynamicSelection(0.1, scope="model"))
    n = len(prompts[3])
    for kept in run.kept:
        assert kept[:, :2].all() and kept[:, n - 3:n].all()


def test_uniform_selection_keeps_the_same_count_per_head(tiny):
    model, prompts, _ = tiny
    entry = uniform_entry(model, 1.0)
    run = reference_run(model, entry, heads_per_group=1, method="keydiff", prompt_ids=prompts[3], max_new_tokens=1,
                        chunk_size=8, protection=NONE, selection=UniformSelection(0.3))
    for kept in run.kept:
        for s, e in run.chunks:
            assert kept[:, s:e].sum(1).tolist() == [int(keep_count(0.3, e - s))] * kept.shape[0]
