"""One test per rule of the profile format: each error names the field and the problem."""


import pytest

from tangram_sglang.profile import ModelShape, ProfileError, load_profile
from tangram_sglang.profile.uniform import uniform_profile
from tangram_sglang.profile.validation import parse_profile

SHAPE = ModelShape(architecture="LlamaForCausalLM", num_layers=3, num_kv_heads=4, head_dim=8)


@pytest.fixture
def raw():
    """A valid profile mapping: 3 layers, 4 KV heads, H_p = 2, two ratios."""
    prof = uniform_profile(SHAPE, [0.5, 1.0], heads_per_group=2, parallel_capacity=8)
    d = prof.to_dict()
    d["entries"][0]["budgets"] = [[0.2, 0.9, 0.4, 0.5]] * 3
    return d


def expect(raw, field, problem):
    with pytest.raises(ProfileError) as info:
        parse_profile(raw)
    assert info.value.field == field, str(info.value)
    assert problem in info.value.problem, str(info.value)
    assert field in str(info.value) and problem in str(info.value)


def test_valid_profile_parses_and_round_trips(raw, tmp_path):
    prof = parse_profile(raw)
    assert prof.ratios == (0.5, 1.0)
    assert prof.select(0.5).budgets[0].tolist() == [0.2, 0.9, 0.4, 0.5]
    prof.save(tmp_path / "p.yaml")
    again = load_profile(str(tmp_path / "p.yaml"))
    assert again.to_dict() == prof.to_dict()


def test_scope_round_trips_and_is_checked(raw, tmp_path):
    assert "scope" not in raw["calibration"] and parse_profile(raw).calibration.scope == "layer"
    raw["calibration"]["scope"] = "model"
    prof = parse_profile(raw)
    assert prof.calibration.scope == "model"
    prof.save(tmp_path / "p.yaml")
    assert load_profile(str(tmp_path / "p.yaml")).calibration.scope == "model"
    raw["calibration"]["scope"] = "head"
    expect(raw, "calibration.scope", "must be one of ['layer', 'model']")


def test_unknown_format(raw):
    raw["format"] = "vllm-profile"
    expect(raw, "format", "expected 'tangram-profile'")


def test_unknown_version(raw):
    raw["version"] = 2
    expect(raw, "version", "unknown version 2")


def test_missing_field(raw):
    del raw["heads_per_group"]
    expect(raw, "heads_per_group", "missing")


def test_missing_nested_field(raw):
    del raw["model"]["head_dim"]
    expect(raw, "model.head_dim", "missing")


def test_budgets_wrong_shape(raw):
    raw["entries"][0]["budgets"] = [[0.5] * 4] * 2
    expect(raw, "entries[0].budgets", "has shape [2, 4], expected [3, 4]")


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_budget_outside_unit_interval(raw, bad):
    raw["entries"][0]["budgets"][1] = [0.5, bad, 0.5, 0.5]
    expect(raw, "entries[0].budgets[1][1]", f"budget {bad} is outside (0, 1]")


def test_budget_not_a_number(raw):
    raw["entries"][0]["budgets"][0] = ["a", 0.5, 0.5, 0.5]
    expect(raw, "entries[0].budgets", "array of numbers")


def test_groups_repeat_a_head(raw):
    raw["entries"][0]["groups"][2] = [[0, 1], [1, 3]]
    expect(raw, "entries[0].groups[2]", "not a partition of the layer's heads (repeated: [1], missing: [2])")


def test_groups_wrong_count(raw):
    raw["entries"][0]["groups"][0] = [[0], [1], [2, 3]]
    expect(raw, "entries[0].groups[0]", "must hold 2 groups")


def test_group_larger_than_heads_per_group(raw):
    raw["entries"][0]["groups"][0] = [[0, 1, 2], [3]]
    expect(raw, "entries[0].groups[0][0]", "1 to 2 head ids")


def test_group_head_out_of_range(raw):
    raw["entries"][0]["groups"][0] = [[0, 7], [2, 3]]
    expect(raw, "entries[0].groups[0][0]", "head id 7 is not in [0, 4)")


def test_split_map_wrong_shape(raw):
    raw["entries"][0]["split_map"] = [[1, 1, 1]] * 3
    expect(raw, "entries[0].split_map", "has shape [3, 3], expected [3, 2]")


@pytest.mark.parametrize("bad", [0, 1.5])
def test_split_map_values(raw, bad):
    raw["entries"][0]["split_map"][0] = [bad, 1]
    expect(raw, "entries[0].split_map", "integer >= 1")


def test_stats_shape(raw):
    raw["entries"][0]["stats"]["std"] = [[0.0] * 4]
    expect(raw, "entries[0].stats.std", "has shape [1, 4]")


def test_negative_std(raw):
    raw["entries"][0]["stats"]["std"][0] = [0.0, -0.1, 0.0, 0.0]
    expect(raw, "entries[0].stats.std", "must be >= 0")


def test_entry_ratio_out_of_range(raw):
    raw["entries"][0]["ratio"] = 1.2
    expect(raw, "entries[0].ratio", "must be in (0, 1]")


def test_duplicate_ratios(raw):
    raw["entries"][1]["ratio"] = 0.5
    expect(raw, "entries", "ratios must be distinct")


def test_default_ratio_not_an_entry(raw):
    raw["default_ratio"] = 0.25
    expect(raw, "default_ratio", "0.25 is not one of the entries' ratios")


def test_heads_per_group_exceeds_heads(raw):
    raw["heads_per_group"] = 5
    expect(raw, "heads_per_group", "5 exceeds the model's 4 KV heads")


def test_unknown_grouping(raw):
    raw["grouping"] = "random"
    expect(raw, "grouping", "unknown strategy 'random'")


def test_parallel_capacity_positive(raw):
    raw["parallel_capacity"] = 0
    expect(raw, "parallel_capacity", "must be >= 1")


def test_alpha_negative(raw):
    raw["calibration"]["alpha"] = -1
    expect(raw, "calibration.alpha", "must be a number >= 0")


@pytest.mark.parametrize("field,value,message", [
    ("num_layers", 4, "profile has 3, the served model has 4"),
    ("num_kv_heads", 8, "profile has 4, the served model has 8"),
    ("head_dim", 16, "profile has 8, the served model has 16"),
    ("architecture", "Qwen2ForCausalLM", "profile is for LlamaForCausalLM, the served model is Qwen2ForCausalLM"),
])
def test_model_mismatch(raw, field, value, message):
    prof = parse_profile(raw)
    served = ModelShape(**{**SHAPE.__dict__, field: value})
    with pytest.raises(ProfileError) as info:
        prof.check_model(served)
    assert info.value.field == f"model.{field}" and message in str(info.value)


def test_select_unknown_ratio(raw):
    with pytest.raises(ProfileError, match=r"no entry for ratio 0.7; the profile holds \[0.5, 1.0\]"):
        parse_profile(raw).select(0.7)


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(str(tmp_path / "nope.yaml"))


def test_not_yaml(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("format: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(p))


def test_model_shape_from_hf_config():
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "hidden_size": 576}
    assert ModelShape.from_hf_config(cfg) == ModelShape(
        architecture="LlamaForCausalLM", num_layers=30, num_kv_heads=3, head_dim=64)


GEMMA = {"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 4, "head_dim": 8, "sliding_window": 24,
         "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}


def test_window_layers_from_hf_config_and_back():
    shape = ModelShape.from_hf_config(GEMMA)
    assert shape.window_layers == (0, 2) and shape.window == 24 and shape.windows == (24, 0, 24)
    older = {**GEMMA, "layer_types": None, "sliding_window_pattern": 3}  # every 3rd layer is global
    assert ModelShape.from_hf_config(older).window_layers == (0, 1)
    prof = uniform_profile(shape, [0.5], parallel_capacity=8)
    assert prof.entries[0].budgets[[0, 2]].min() == 1.0 and prof.entries[0].budgets[1].max() == 0.5
    again = parse_profile(prof.to_dict())
    assert again.model == shape
    dense = ModelShape(**{**shape.__dict__, "window": 0, "window_layers": ()})
    with pytest.raises(ProfileError, match=r"model.window_layers.*profile has \[0, 2\], the served model has \[\]"):
        again.check_model(dense)


def test_window_layer_budgets_must_be_whole():
    raw = uniform_profile(ModelShape.from_hf_config(GEMMA), [0.5], parallel_capacity=8).to_dict()
    raw["entries"][0]["budgets"][2][1] = 0.5
    with pytest.raises(ProfileError, match=r"entries\[0\].budgets\[2\].*24-token window: it keeps every token"):
        parse_profile(raw)
    raw["model"]["window_layers"] = [2, 0]
    with pytest.raises(ProfileError, match="model.window_layers"):
        parse_profile(raw)


def test_dense_profiles_write_no_window_fields(raw):
    assert "window" not in raw["model"] and "window_layers" not in parse_profile(raw).to_dict()["model"]
