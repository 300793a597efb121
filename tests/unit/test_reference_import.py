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
