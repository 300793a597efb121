"""Import of the authors' large-model retention files into the profile format."""

import json
import os

import numpy as np
import pytest

from tangram_sglang.profile import load_profile
from tangram_sglang.profile.reference_import import (
    available,
    default_root,
    load_retention,
    main,
    reference_profile,
    rescale_to_target,
)

RAW = np.array([[[0.1, 0.3]], [[0.1, 0.1]]])  # [S=2, L=1, H=2], layer mean 0.15


def write_fake(root, scorer="snapkv", model="llama-3.1-8b-instruct", raw=RAW):
    folder = os.path.join(root, scorer, model)
    os.makedirs(folder)
    meta = {"scorer": scorer, "base_ratios": [0.3], "window_size": 4096, "prefill_chunk": 32768,
            "static_layer_ids": [0], "sample_sources": ["scbench_kv_short"]}
    np.savez(os.path.join(folder, "profile_perlayer.npz"), raw_ratio=raw[None],
             meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))


def test_rescale_by_hand():
    np.testing.assert_allclose(rescale_to_target(RAW, 0.3), [[[0.2, 0.6]], [[0.2, 0.2]]])
    # target 0.6: scale 4 -> 0.4, 1.2 (clipped to 1), 0.4, 0.4
    np.testing.assert_allclose(rescale_to_target(RAW, 0.6), [[[0.4, 1.0]], [[0.4, 0.4]]])
    np.testing.assert_allclose(rescale_to_target(np.zeros((2, 1, 2)), 0.5), 0.0)  # empty layer stays


def test_profile_from_fake_file(tmp_path):
    write_fake(str(tmp_path))
    prof = reference_profile("snapkv", "llama-3.1-8b-instruct", [0.3, 0.6], alpha=2.0, heads_per_group=1,
                             parallel_capacity=10, root=str(tmp_path))
    e = prof.select(0.3)
    np.testing.assert_allclose(e.mean, [[0.2, 0.4]])
    np.testing.assert_allclose(e.std, [[0.0, 0.2]])
    np.testing.assert_allclose(e.budgets, [[0.2, 0.8]])  # min(1, mu + 2 sigma)
    np.testing.assert_allclose(prof.select(0.6).budgets, [[0.4, 1.0]])
    assert e.groups == [[[0], [1]]]
    assert e.split_map.tolist() == [[2, 8]]  # tau = 1.0 / 10
    assert prof.model.architecture == "LlamaForCausalLM" and prof.model.head_dim == 128
    assert prof.calibration.num_samples == 2
    assert "reference-profiles/snapkv/llama-3.1-8b-instruct" in prof.calibration.note


def test_cli_round_trip(tmp_path):
    write_fake(str(tmp_path / "ref"))
    out = str(tmp_path / "p.yaml")
    main(["--scorer", "snapkv", "--model", "llama-3.1-8b-instruct", "--ratio", "0.3", "--heads-per-group", "2",
          "--root", str(tmp_path / "ref"), "-o", out])
    prof = load_profile(out)
    assert prof.heads_per_group == 2 and prof.ratios == (0.3,)
    np.testing.assert_allclose(prof.select().budgets, [[0.2, 0.8]])


def test_unknown_names_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="scorer"):
        load_retention("h2o", "llama-3.1-8b-instruct", str(tmp_path))
    with pytest.raises(ValueError, match="model"):
        load_retention("snapkv", "llama-2", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        load_retention("snapkv", "gpt-oss-20b", str(tmp_path))


@pytest.mark.skipif(not available(), reason="shared/data/reference-profiles not present")
def test_real_reference_files_import_at_real_shapes():
    raw, meta = load_retention("snapkv", "llama-3.1-8b-instruct", default_root())
    assert raw.shape[1:] == (32, 8) and meta["scorer"] == "snapkv"
    prof = reference_profile("snapkv", "llama-3.1-8b-instruct", [0.25], heads_per_group=4)
    e = prof.select(0.25)
    assert e.budgets.shape == (32, 8) and e.split_map.shape == (32, 2)
    np.testing.assert_allclose(e.mean.mean(axis=1), 0.25, atol=0.02)  # rescaled per layer (clipping aside)
    assert (e.budgets >= e.mean - 1e-12).all() and (e.budgets <= 1).all()


def test_cli_tp_size_groups_within_ranks(tmp_path):
    raw = np.array([[[0.1, 0.9, 0.2, 0.8]], [[0.2, 0.7, 0.1, 0.9]]])  # [S, L=1, H=4]
    write_fake(str(tmp_path / "ref"), raw=raw)
    out = str(tmp_path / "p.yaml")
    main(["--scorer", "snapkv", "--model", "llama-3.1-8b-instruct", "--ratio", "0.5", "--heads-per-group", "2",
          "--tp-size", "2", "--root", str(tmp_path / "ref"), "-o", out])
    prof = load_profile(out)
    assert prof.tp_size == 2 and prof.heads_per_group == 2
    assert sorted(map(sorted, prof.select().groups[0])) == [[0, 1], [2, 3]]  # never across the two ranks


def test_default_root_is_beside_the_checkout(monkeypatch):
    """The skip above reads default_root(): a wrong path would turn the real-file test into a skip."""
    monkeypatch.delenv("TANGRAM_REFERENCE_DIR", raising=False)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert default_root() == os.path.join(os.path.dirname(repo), "shared", "data", "reference-profiles")


def write_meta_fake(root, model, raw, **meta_extra):
    folder = os.path.join(root, "snapkv", model)
    os.makedirs(folder)
    meta = {"scorer": "snapkv", "base_ratios": [0.3], "window_size": 4096, **meta_extra}
    np.savez(os.path.join(folder, "profile_perlayer.npz"), raw_ratio=raw[None],
             meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))


def test_hybrid_rows_land_on_full_attention_layers(tmp_path):
    """A hybrid file lists its full-attention layers only: with the config they land on those layers
    and the window layers keep every token."""
    raw = np.full((2, 2, 2), 0.1)
    write_meta_fake(str(tmp_path), "gpt-oss-20b", raw, static_layer_ids=[1, 3])
    config = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 128,
              "layer_types": ["sliding_attention", "full_attention"] * 2}
    prof = reference_profile("snapkv", "gpt-oss-20b", [0.25], heads_per_group=1, root=str(tmp_path), config=config)
    assert prof.model.window_layers == (0, 2) and prof.model.num_layers == 4
    np.testing.assert_allclose(prof.entries[0].budgets[[0, 2]], 1.0)
    np.testing.assert_allclose(prof.entries[0].budgets[[1, 3]], 0.25)
    wrong = {**config, "layer_types": ["full_attention"] * 4}
    with pytest.raises(ValueError, match=r"rows are layers \[1, 3\]"):
        reference_profile("snapkv", "gpt-oss-20b", [0.25], root=str(tmp_path), config=wrong)


def test_one_tp_rank_stands_for_every_rank(tmp_path):
    raw = np.array([[[0.1, 0.3]], [[0.1, 0.1]]])
    write_meta_fake(str(tmp_path), "qwen3-30b-a3b-instruct-2507", raw, static_layer_ids=[0], tensor_parallel_size=2)
    config = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 1, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 128}
    prof = reference_profile("snapkv", "qwen3-30b-a3b-instruct-2507", [0.3], heads_per_group=1, root=str(tmp_path),
                             config=config)
    b = prof.entries[0].budgets[0]
    assert b.shape == (4,) and b[0] == b[2] and b[1] == b[3] and "one TP rank" in prof.calibration.note
    with pytest.raises(ValueError, match="holds 2 KV heads"):
        reference_profile("snapkv", "qwen3-30b-a3b-instruct-2507", [0.3], root=str(tmp_path),
                          config={**config, "num_key_value_heads": 8})


def test_shipped_profiles_fit_their_configs():
    """configs/reference/ (the paper's five models) against configs/models/: shapes, window layers whole."""
    from tangram_sglang.profile import ModelShape
    from tangram_sglang.profile.reference_import import SHIPPED, SHIPPED_RATIOS, model_config

    root = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "reference")
    for model, scorer in SHIPPED:
        shape = ModelShape.from_hf_config(model_config(model))
        prof = load_profile(os.path.join(root, f"{model}-{scorer}.yaml"))
        prof.check_model(shape)
        assert prof.ratios == SHIPPED_RATIOS and prof.model.architecture == REFERENCE_ARCH[model]
        for entry in prof.entries:
            assert np.all(entry.budgets[list(shape.window_layers)] == 1.0)
    gemma = ModelShape.from_hf_config(model_config("gemma-3-12b-it"))   # multimodal: the text model's shape
    assert gemma.num_layers == 48 and gemma.window == 1024 and len(gemma.window_layers) == 40


REFERENCE_ARCH = {"llama-3.1-8b-instruct": "LlamaForCausalLM", "qwen3-4b-instruct-2507": "Qwen3ForCausalLM",
                  "gemma-3-12b-it": "Gemma3ForConditionalGeneration", "gpt-oss-20b": "GptOssForCausalLM",
                  "qwen3-30b-a3b-instruct-2507": "Qwen3MoeForCausalLM"}


def test_paper_models_kv_table():
    """Stock bytes per token by hand: Llama 2 x 32 x 8 x 128 x 2 B; gpt-oss's 12 window layers (stock's SWA
    pool) hold 128 of 16,384 tokens."""
    from benchmarks.modeled.paper_models import rows

    data = {(r["model"], r["ratio"]): r for r in rows(16384, 512, 2)}
    assert data[("llama-3.1-8b-instruct", 0.25)]["stock"] == 2 * 32 * 8 * 128 * 2
    assert data[("gpt-oss-20b", 0.25)]["stock"] == round(12 * 8 * 256 + 12 * 8 * 256 * 128 / 16384)
    for r in data.values():
        assert r["bounded"] <= r["tangram"] and (r["window_layers"] or r["bounded"] == r["tangram"])
