import json

import numpy as np
import pytest

from tangram_sglang.profile import load_profile
from tangram_sglang.profile.uniform import main


@pytest.fixture
def model_dir(tmp_path):
    cfg = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 5, "num_attention_heads": 14,
           "num_key_value_heads": 2, "hidden_size": 896}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("ratio", [1.0, 0.3])
def test_uniform_profile_command(model_dir, tmp_path, ratio):
    out = tmp_path / "u.yaml"
    main(["--model-path", str(model_dir), "--ratio", str(ratio), "-o", str(out), "--parallel-capacity", "10"])
    prof = load_profile(str(out))
    entry = prof.select()
    assert prof.model.num_layers == 5 and prof.model.num_kv_heads == 2 and prof.model.head_dim == 64
    assert prof.calibration.method == "uniform"
    assert np.all(entry.budgets == ratio) and entry.budgets.shape == (5, 2)
    assert entry.groups == [[[0], [1]]] * 5
    # Two equal groups share 10 CTAs evenly.
    assert entry.split_map.tolist() == [[5, 5]] * 5


def test_several_ratios_and_groups(model_dir, tmp_path):
    out = tmp_path / "u.yaml"
    main(["--model-path", str(model_dir), "--ratio", "0.5", "--ratio", "0.25", "--heads-per-group", "2",
          "-o", str(out)])
    prof = load_profile(str(out))
    assert prof.ratios == (0.5, 0.25) and prof.default_ratio == 0.5
    assert prof.select(0.25).groups == [[[0, 1]]] * 5
