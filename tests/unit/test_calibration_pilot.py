"""The capture hook and the pilot runner on a tiny random Llama (no weights needed)."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from tangram_sglang.calibrate import main as calibrate_main
from tangram_sglang.calibration.capture import attention_modules, capturing, register_capture_attention
from tangram_sglang.calibration.pilot import PilotConfig, run_sample
from tangram_sglang.calibration.samples import PilotSample
from tangram_sglang.scorers import get_scorer


def tiny(impl):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM._from_config(cfg, attn_implementation=impl).eval()


@pytest.fixture(scope="module")
def model():
    return tiny(register_capture_attention())


def test_capture_sees_post_rope_chunks_and_matches_sdpa(model):
    ref = tiny("sdpa")
    ref.load_state_dict(model.state_dict())
    ids = torch.randint(0, 64, (1, 11), generator=torch.Generator().manual_seed(1))
    seen = []
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), capturing(model, lambda l, q, k, v: seen.append((l, q.shape, k.shape))):
        for s in range(0, 11, 4):
            out = model(input_ids=ids[:, s:s + 4], past_key_values=cache, use_cache=True)
        full = ref(input_ids=ids).logits
    torch.testing.assert_close(out.logits[0, -1], full[0, -1], rtol=1e-4, atol=1e-5)
    assert seen[:2] == [(0, (1, 4, 4, 8), (1, 2, 4, 8)), (1, (1, 4, 4, 8), (1, 2, 4, 8))]
    assert seen[-1] == (1, (1, 4, 3, 8), (1, 2, 11, 8))  # last chunk: 3 queries, whole cache of keys
    assert [m.layer_idx for m in attention_modules(model)] == [0, 1]
    assert all(getattr(m, "_tangram_capture") is None for m in attention_modules(model))


def test_capturing_requires_the_capture_implementation():
    with pytest.raises(ValueError, match="tangram_capture"):
        with capturing(tiny("sdpa"), print):
            pass


def test_pilot_uniform_retention_by_hand(model):
    # 10 tokens in chunks 4, 4, 2; H = 2, uniform scores (ties: later position, then higher head).
    # rho 0.5 keeps n per chunk -> n/2 per head -> 0.5 each.
    # rho 0.25 keeps 2, 2, 1 -> [1,1], [1,1], [0,1] -> retention [0.2, 0.3].
    sample = PilotSample(source="needle", kind="passkey", label="x", token_ids=tuple(range(10)))
    r = run_sample(model, sample, get_scorer("uniform"), PilotConfig(ratios=(0.5, 0.25), chunk_size=4))
    assert r.num_tokens == 10 and r.retention.shape == (2, 2, 2)
    np.testing.assert_allclose(r.retention[0], 0.5)
    np.testing.assert_allclose(r.retention[1], [[0.2, 0.3], [0.2, 0.3]])


def test_pilot_snapkv_keeps_the_layer_budget(model):
    sample = PilotSample(source="sharegpt", kind="conversation", label="x", token_ids=tuple(range(3, 40)))
    r = run_sample(model, sample, get_scorer("snapkv", window=4), PilotConfig(ratios=(0.7, 0.3), chunk_size=16))
    # per chunk the layer keeps ceil(rho * 2 * n): chunks 16, 16, 5 -> 23+23+7 = 53 and 10+10+3 = 23 of 37
    np.testing.assert_allclose(r.retention.sum(axis=2), [[53 / 37] * 2, [23 / 37] * 2])
    assert (r.retention >= 0).all() and (r.retention <= 1).all()


def test_pilot_model_scope_keeps_the_model_budget(model):
    sample = PilotSample(source="sharegpt", kind="conversation", label="x", token_ids=tuple(range(3, 40)))
    cfg = PilotConfig(ratios=(0.7, 0.3), chunk_size=16, scope="model")
    r = run_sample(model, sample, get_scorer("snapkv", window=4), cfg)
    # per chunk the model keeps ceil(rho * 2 layers * 2 heads * n): 45+45+14 = 104 and 20+20+6 = 46 of 37
    np.testing.assert_allclose(r.retention.sum(axis=(1, 2)), [104 / 37, 46 / 37])
    layer = run_sample(model, sample, get_scorer("snapkv", window=4), PilotConfig(ratios=(0.7, 0.3), chunk_size=16))
    assert not np.allclose(r.retention, layer.retention)  # layers' shares now differ
    with pytest.raises(ValueError, match="scope"):
        PilotConfig(ratios=(0.5,), scope="head")


def test_pilot_config_and_cli_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="ratio"):
        PilotConfig(ratios=(1.2,))
    with pytest.raises(ValueError, match="chunk_size"):
        PilotConfig(ratios=(0.5,), chunk_size=0)
    assert calibrate_main(["--model-path", str(tmp_path), "--method", "h2o", "--ratio", "0.5", "-o", "x"]) == 2
    assert "unknown scorer 'h2o'" in capsys.readouterr().err
    assert calibrate_main(["--model-path", str(tmp_path), "--method", "snapkv", "--ratio", "0.5",
                           "--alpha", "-1", "-o", "x"]) == 2
    assert calibrate_main(["--model-path", str(tmp_path), "--method", "snapkv", "--ratio", "0.5",
                           "--default-ratio", "0.25", "-o", "x"]) == 2
    assert "--default-ratio 0.25" in capsys.readouterr().err


def tiny_gemma():
    """A tiny random Gemma 3 whose layers 0 and 2 attend to a 4-token window, with capture attention."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                           sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           max_position_embeddings=128)
    return Gemma3ForCausalLM._from_config(cfg, attn_implementation=register_capture_attention()).eval()


def test_pilot_keeps_window_layers_whole_and_selects_over_full_layers():
    """A tiny random Gemma 3 (layers 0 and 2 attend to a window): its window layers are not scored
    and count every token as kept; a model-scope selection spans only layer 1, so layer 1 keeps
    the ratio's share exactly."""
    gemma = tiny_gemma()
    sample = PilotSample(source="needle", kind="passkey", label="x", token_ids=tuple(range(2, 14)))
    r = run_sample(gemma, sample, get_scorer("snapkv"), PilotConfig(ratios=(0.5,), chunk_size=4, scope="model"))
    assert r.retention.shape == (1, 3, 2)
    np.testing.assert_allclose(r.retention[0, [0, 2]], 1.0)
    assert r.retention[0, 1].sum() == pytest.approx(2 * 0.5)   # the model-wide top half of layer 1's slots


def test_kvzip_teacher_keeps_window_layers_whole():
    """KVzip's teacher pass on a hybrid model (window 4, chunks of 4 past it): window layers are not
    scored and keep everything; layer 1 keeps the ratio's share of a model-scope selection."""
    from tangram_sglang.calibration.kvzip_teacher import kvzip_sample

    gemma = tiny_gemma()

    class Tok:
        def apply_chat_template(self, msgs, add_generation_prompt=True, tokenize=True):
            return [2, 5, 6, 7]

    sample = PilotSample(source="needle", kind="passkey", label="x", token_ids=tuple(range(8, 20)))
    r = kvzip_sample(gemma, Tok(), sample, chunk_size=4, ratios=(0.5,), gate_rows=4, scope="model")
    np.testing.assert_allclose(r.retention[0, [0, 2]], 1.0)
    assert r.retention[0, 1].sum() == pytest.approx(2 * 0.5) and r.hidden.shape[:2] == (3, 4)
