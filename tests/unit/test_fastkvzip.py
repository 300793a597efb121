"""KVzip reference scores, the FastKVzip gate (contract, file, training), and its profile checks."""

import math
import types

import numpy as np
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from tangram_sglang.calibration.capture import hidden_inputs, register_capture_attention
from tangram_sglang.calibration.gate_training import gate_ranking, topk_recall, train_gates
from tangram_sglang.calibration.kvzip_teacher import chunk_scores, kvzip_sample
from tangram_sglang.calibration.samples import PilotSample
from tangram_sglang.profile import ProfileError
from tangram_sglang.scorers import ScorerState
from tangram_sglang.scorers.fastkvzip import FastKVzipScorer, GateShape, file_sha256, load_gates, new_gates, save_gates

SHAPE = GateShape(num_layers=2, hidden_size=32, num_kv_heads=2, group=2)


class _Tok:
    """Stands in for a tokenizer: the repeat instruction as fixed ids."""

    def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
        return [1, 2, 3, 4, 5, 6]


def tiny(impl, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM._from_config(cfg, attn_implementation=impl).eval()


@pytest.fixture(scope="module")
def model():
    return tiny(register_capture_attention())


def _sample(seed, n=96):
    ids = torch.randint(8, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return PilotSample(source="sharegpt", kind="conversation", label=str(seed), token_ids=tuple(ids))


# ---- KVzip scores ----------------------------------------------------------------------------

def test_chunk_scores_by_hand():
    # 1 KV head, 2 query heads; cache of 6 (chunk [4, 6)), 2 reconstruction tokens at 6, 7.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 2, 4, generator=g)
    k = torch.randn(1, 1, 8, 4, generator=g)
    got = chunk_scores(q, k, 4, 6)
    want = torch.zeros(1, 2)
    for head in range(2):
        for i in range(2):  # reconstruction token i sees sinks 0-3, chunk 4-5 and recon 6 .. 6 + i
            cols = [0, 1, 2, 3, 4, 5] + list(range(6, 7 + i))
            logits = torch.stack([q[0, head, i] @ k[0, 0, c] / 2.0 for c in cols])
            p = torch.softmax(logits, 0)
            want[0] = torch.maximum(want[0], p[4:6])
    torch.testing.assert_close(got, want)


def test_kvzip_sample_leaves_no_reconstruction_kv(model):
    sample = _sample(1, n=70)
    out = kvzip_sample(model, _Tok(), sample, chunk_size=32, gate_rows=66, ratios=(0.5,))
    assert out.chunks == [(0, 32), (32, 64), (64, 70)]
    assert len(out.scores) == 2 and out.scores[0].shape == (2, 70)
    assert ((out.scores[1] > 0) & (out.scores[1] <= 1)).all()
    # hidden states recorded in chunks 2 and 3 equal a plain prefill's: the reconstruction's KV was dropped
    seen = {}
    with torch.no_grad(), hidden_inputs(model, lambda l, x: seen.setdefault(l, x)):
        model(input_ids=torch.tensor([list(sample.token_ids)]), past_key_values=DynamicCache(config=model.config))
    for layer in range(2):
        torch.testing.assert_close(out.hidden[layer].float(), seen[layer][out.rows].half().float())
    np.testing.assert_allclose(out.retention[0].sum(axis=1), [1.0, 1.0], atol=2 / 70)


# ---- the gate --------------------------------------------------------------------------------

def test_gate_contract_and_errors():
    scorer = FastKVzipScorer(new_gates(SHAPE))
    n = 17
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(n, 4, 8, generator=g), torch.randn(n, 2, 8, generator=g), torch.randn(n, 2, 8, generator=g)
    hidden = torch.randn(n, 32, generator=g)
    state = ScorerState()
    layer = scorer.for_layer(1)
    assert layer.needs_hidden and scorer.for_layer(0) is not layer
    s = layer.score(q, k, v, state, hidden=hidden)
    assert s.shape == (2, n) and s.dtype == torch.float32 and (s <= 0).all() and torch.isfinite(s).all()
    assert state.tokens_seen == n
    # per token: a token's score does not depend on the others in its chunk
    torch.testing.assert_close(layer.score(q[5:9], k[5:9], v[5:9], None, hidden=hidden[5:9]), s[:, 5:9])
    with pytest.raises(ValueError, match="hidden"):
        layer.score(q, k, v, None)
    with pytest.raises(ValueError, match="for_layer"):
        scorer.score(q, k, v, None, hidden=hidden)
    with pytest.raises(ValueError, match="calibrate --method fastkvzip"):
        FastKVzipScorer()


def test_gate_file_round_trip_and_checks(tmp_path):
    gates = new_gates(SHAPE, seed=3)
    path = str(tmp_path / "g.gate.safetensors")
    sha = save_gates(gates, path)
    back = load_gates(path, sha)
    x = torch.randn(9, 32)
    for a, b in zip(gates, back):  # stored as int8 / float16, served as float32
        torch.testing.assert_close(a(x), b(x), rtol=1e-2, atol=1e-2)
    again = load_gates(str(tmp_path / "again.safetensors"), save_gates(back, str(tmp_path / "again.safetensors")))
    for a, b in zip(back, again):  # a second round trip is exact
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with open(path, "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(ValueError, match="g.gate.safetensors does not match"):
        load_gates(path, sha)
    with pytest.raises(ValueError, match="missing.safetensors does not exist"):
        load_gates(str(tmp_path / "missing.safetensors"))


def test_topk_recall_by_hand():
    truth = torch.tensor([[5.0, 4, 3, 2, 1, 0]])
    pred = torch.tensor([[5.0, 0, 4, 1, 2, 3]])
    # chunks [0, 4), [4, 6) at ratio 0.5: top 2 of 4 -> {0, 1} vs {0, 2}: 1 hit; top 1 of 2 -> {4} vs {5}: 0
    assert topk_recall(pred, truth, [(0, 4), (4, 6)], 0.5) == pytest.approx(1 / 3)
    assert topk_recall(truth, truth, [(0, 4), (4, 6)], 0.5) == 1.0


def test_gate_trained_on_a_tiny_model_beats_random_ranking(model):
    cal = [kvzip_sample(model, _Tok(), _sample(10 + i), chunk_size=32, gate_rows=90, seed=i) for i in range(8)]
    gates, losses = train_gates(cal, SHAPE, steps=150, progress=False)
    assert all(math.isfinite(x) for x in losses)
    held = [kvzip_sample(model, _Tok(), _sample(100 + i), chunk_size=32, gates=gates) for i in range(3)]
    report = gate_ranking([h.gate_scores for h in held], held, (0.25, 0.5))
    untrained = new_gates(SHAPE, seed=7)
    base = [kvzip_sample(model, _Tok(), _sample(100 + i), chunk_size=32, gates=untrained) for i in range(3)]
    random_report = gate_ranking([b.gate_scores for b in base], base, (0.25, 0.5))
    # a random model's KVzip scores are nearly flat (log std ~0.05): ranking is what can be learned
    assert report["spearman_mean"] > random_report["spearman_mean"] + 0.1
    assert report["topk_recall"]["0.25"] > max(0.25, random_report["topk_recall"]["0.25"]) + 0.1


# ---- profiles naming a gate file ---------------------------------------------------------------

def _gate_profile(tmp_path, weights="p.gate.safetensors", sha=None):
    """A profile for a 2-layer, 2-KV-head model served with the fastkvzip gates of SHAPE."""
    import dataclasses

    from tangram_sglang.profile import ModelShape
    from tangram_sglang.profile.uniform import uniform_profile

    shape = ModelShape(architecture="LlamaForCausalLM", num_layers=2, num_kv_heads=2, head_dim=8)
    prof = uniform_profile(shape, [0.5], parallel_capacity=8)
    real_sha = save_gates(new_gates(SHAPE, seed=4), str(tmp_path / "p.gate.safetensors"))
    meta = dataclasses.replace(prof.calibration, method="fastkvzip", weights=weights,
                               weights_sha256=real_sha if sha is None else sha)
    prof = dataclasses.replace(prof, calibration=meta)
    path = tmp_path / "p.yaml"
    prof.save(str(path))
    return str(path)


def test_profile_loads_its_gates(tmp_path):
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import profile_scorer

    path = _gate_profile(tmp_path)
    prof = load_profile(path)
    assert prof.calibration.weights == "p.gate.safetensors" and len(prof.calibration.weights_sha256) == 64
    scorer = profile_scorer(prof, path)
    assert isinstance(scorer, FastKVzipScorer) and len(scorer.gates) == 2


@pytest.mark.parametrize("weights,sha,message", [
    ("other.gate.safetensors", None, "other.gate.safetensors does not exist"),
    ("p.gate.safetensors", "0" * 64, "p.gate.safetensors does not match the recorded sha256"),
    ("", None, "needs a weights file"),
])
def test_launch_refuses_a_missing_or_altered_gate_file(tmp_path, weights, sha, message):
    from tangram_sglang.sglang.server_args import attach_profile, read_profile

    path = _gate_profile(tmp_path, weights=weights, sha=sha)
    with pytest.raises(ProfileError, match=message):
        attach_profile(types.SimpleNamespace(model_path=None), *read_profile(path), None)


def test_launch_refuses_a_gate_file_altered_after_calibration(tmp_path):
    from tangram_sglang.sglang.server_args import attach_profile, read_profile

    path = _gate_profile(tmp_path)
    server_args = types.SimpleNamespace(model_path=None)
    attach_profile(server_args, *read_profile(path), None)  # intact: accepted
    with open(tmp_path / "p.gate.safetensors", "ab") as f:
        f.write(b"x")
    with pytest.raises(ProfileError, match="p.gate.safetensors does not match"):
        attach_profile(server_args, *read_profile(path), None)


def test_xz_gate_file_loads_the_same_gates(tmp_path):
    """A shipped gate may be kept xz-compressed; its sha256 is the compressed file's."""
    import lzma

    plain = str(tmp_path / "g.gate.safetensors")
    save_gates(new_gates(SHAPE, seed=5), plain)
    packed = plain + ".xz"
    with open(plain, "rb") as src, lzma.open(packed, "wb") as dst:
        dst.write(src.read())
    a, b = load_gates(plain), load_gates(packed, file_sha256(packed))
    for ga, gb in zip(a, b, strict=True):
        for (k, x), (_, y) in zip(ga.state_dict().items(), gb.state_dict().items()):
            assert torch.equal(x, y), k
    with pytest.raises(ValueError, match="does not match"):
        load_gates(packed, file_sha256(plain))
