"""Parse a raw profile mapping into a TangramProfile, checking every rule.

Each check raises ProfileError(field, problem) with the field's path, e.g.
``entries[0].budgets[3][1]``, so a user can find the bad value.
"""

from __future__ import annotations

import math
import os

import numpy as np
import yaml

from tangram_sglang.method.budgets import SCOPES
from tangram_sglang.method.grouping import STRATEGIES, num_groups
from tangram_sglang.profile.format import (
    FORMAT,
    VERSION,
    CalibrationMeta,
    ModelShape,
    ProfileError,
    RatioEntry,
    TangramProfile,
)
from tangram_sglang.profile.tensor_parallel import check_tp_size, shard_groups, shards


def _require(mapping: dict, key: str, where: str):
    if not isinstance(mapping, dict):
        raise ProfileError(where or "file", f"expected a mapping, got {type(mapping).__name__}")
    if key not in mapping:
        raise ProfileError(f"{where}.{key}" if where else key, "missing")
    return mapping[key]


def _int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ProfileError(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise ProfileError(name, f"must be >= {minimum}, got {value}")
    return int(value)


def _ratio(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(name, f"expected a number, got {value!r}")
    if not 0 < value <= 1:
        raise ProfileError(name, f"must be in (0, 1], got {value}")
    return float(value)


def _matrix(value, name: str, shape: tuple[int, int], dtype) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError):
        raise ProfileError(name, f"must be a [{shape[0]}][{shape[1]}] array of numbers") from None
    if arr.shape != shape:
        raise ProfileError(name, f"has shape {list(arr.shape)}, expected {list(shape)} ([num_layers][...])")
    if not np.all(np.isfinite(arr)):
        raise ProfileError(name, "contains a non-finite value")
    return arr


def parse_model(raw) -> ModelShape:
    num_layers = _int(_require(raw, "num_layers", "model"), "model.num_layers")
    window_layers = raw.get("window_layers") or []
    if not isinstance(window_layers, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in window_layers) \
            or sorted(set(window_layers)) != window_layers:
        raise ProfileError("model.window_layers", f"must list distinct layer ids in [0, {num_layers}) in "
                                                  f"order, got {window_layers!r}")
    window = _int(raw.get("window", 0), "model.window", 1 if window_layers else 0)
    return ModelShape(
        architecture=str(_require(raw, "architecture", "model")),
        num_layers=num_layers,
        num_kv_heads=_int(_require(raw, "num_kv_heads", "model"), "model.num_kv_heads"),
        head_dim=_int(_require(raw, "head_dim", "model"), "model.head_dim"),
        window=window if window_layers else 0,
        window_layers=tuple(window_layers),
    )


def parse_calibration(raw) -> CalibrationMeta:
    ratios = _require(raw, "target_ratios", "calibration")
    if not isinstance(ratios, list) or not ratios:
        raise ProfileError("calibration.target_ratios", "must be a non-empty list")
    alpha = _require(raw, "alpha", "calibration")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
        raise ProfileError("calibration.alpha", f"must be a number >= 0, got {alpha!r}")
    return CalibrationMeta(
        method=str(_require(raw, "method", "calibration")),
        target_ratios=tuple(_ratio(r, f"calibration.target_ratios[{i}]") for i, r in enumerate(ratios)),
        alpha=float(alpha),
        num_samples=_int(_require(raw, "num_samples", "calibration"), "calibration.num_samples", 0),
        sources=tuple(str(s) for s in raw.get("sources") or ()),
        chunk_size=_int(raw.get("chunk_size", 0), "calibration.chunk_size", 0),
        date=str(raw.get("date", "")),
        tool_version=str(raw.get("tool_version", "")),
        note=str(raw.get("note", "")),
        weights=str(raw.get("weights", "") or ""),
        weights_sha256=str(raw.get("weights_sha256", "") or ""),
        scorer_args=_scorer_args(raw.get("scorer_args")),
        scope=_scope(raw.get("scope", "layer")),
    )


def _scope(raw) -> str:
    if raw not in SCOPES:
        raise ProfileError("calibration.scope", f"must be one of {list(SCOPES)}, got {raw!r}")
    return raw


def _scorer_args(raw) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise ProfileError("calibration.scorer_args", f"must be a mapping of option names, got {raw!r}")
    return dict(raw)


def _check_budgets(budgets: np.ndarray, name: str) -> None:
    bad = np.argwhere(~((budgets > 0) & (budgets <= 1)))
    if len(bad):
        l, h = bad[0]
        raise ProfileError(f"{name}[{l}][{h}]", f"budget {budgets[l, h]} is outside (0, 1]")


def parse_groups(raw, name: str, model: ModelShape, heads_per_group: int) -> list:
    expected_g = num_groups(model.num_kv_heads, heads_per_group)
    if not isinstance(raw, list) or len(raw) != model.num_layers:
        raise ProfileError(name, f"must list the groups of each of the {model.num_layers} layers")
    groups = []
    for l, layer in enumerate(raw):
        where = f"{name}[{l}]"
        if not isinstance(layer, list) or len(layer) != expected_g:
            raise ProfileError(where, f"must hold {expected_g} groups (ceil(H / heads_per_group)), got "
                               f"{len(layer) if isinstance(layer, list) else layer!r}")
        seen = []
        for g, group in enumerate(layer):
            if not isinstance(group, list) or not group or len(group) > heads_per_group:
                raise ProfileError(f"{where}[{g}]", f"a group must list 1 to {heads_per_group} head ids")
            for h in group:
                if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < model.num_kv_heads:
                    raise ProfileError(f"{where}[{g}]", f"head id {h!r} is not in [0, {model.num_kv_heads})")
            seen.extend(group)
        if sorted(seen) != list(range(model.num_kv_heads)):
            dup = sorted({h for h in seen if seen.count(h) > 1})
            missing = sorted(set(range(model.num_kv_heads)) - set(seen))
            raise ProfileError(where, f"groups are not a partition of the layer's heads "
                               f"(repeated: {dup}, missing: {missing})")
        groups.append([list(g) for g in layer])
    return groups


def parse_entry(raw, i: int, model: ModelShape, heads_per_group: int) -> RatioEntry:
    where = f"entries[{i}]"
    lh = (model.num_layers, model.num_kv_heads)
    ratio = _ratio(_require(raw, "ratio", where), f"{where}.ratio")
    budgets = _matrix(_require(raw, "budgets", where), f"{where}.budgets", lh, np.float64)
    _check_budgets(budgets, f"{where}.budgets")
    for layer in model.window_layers:
        if np.any(budgets[layer] != 1.0):
            raise ProfileError(f"{where}.budgets[{layer}]", f"layer {layer} attends to a {model.window}-token "
                               "window: it keeps every token (budget 1.0 for each head)")
    groups = parse_groups(_require(raw, "groups", where), f"{where}.groups", model, heads_per_group)
    lg = (model.num_layers, len(groups[0]))
    split = _matrix(_require(raw, "split_map", where), f"{where}.split_map", lg, np.float64)
    if np.any(split < 1) or np.any(split != np.round(split)):
        raise ProfileError(f"{where}.split_map", "every split factor must be an integer >= 1")
    stats = _require(raw, "stats", where)
    mean = _matrix(_require(stats, "mean", f"{where}.stats"), f"{where}.stats.mean", lh, np.float64)
    std = _matrix(_require(stats, "std", f"{where}.stats"), f"{where}.stats.std", lh, np.float64)
    if np.any(mean < 0) or np.any(mean > 1):
        raise ProfileError(f"{where}.stats.mean", "retention means must lie in [0, 1]")
    if np.any(std < 0):
        raise ProfileError(f"{where}.stats.std", "standard deviations must be >= 0")
    return RatioEntry(ratio=ratio, budgets=budgets, groups=groups,
                      split_map=split.astype(np.int64), mean=mean, std=std)


def parse_profile(raw) -> TangramProfile:
    if not isinstance(raw, dict):
        raise ProfileError("file", "a profile must be a YAML mapping")
    if raw.get("format") != FORMAT:
        raise ProfileError("format", f"expected {FORMAT!r}, got {raw.get('format')!r}")
    version = raw.get("version")
    if version != VERSION:
        raise ProfileError("version", f"unknown version {version!r}; this tangram_sglang reads version {VERSION}")
    model = parse_model(_require(raw, "model", ""))
    calibration = parse_calibration(_require(raw, "calibration", ""))
    hpg = _int(_require(raw, "heads_per_group", ""), "heads_per_group")
    if hpg > model.num_kv_heads:
        raise ProfileError("heads_per_group", f"{hpg} exceeds the model's {model.num_kv_heads} KV heads")
    grouping = str(_require(raw, "grouping", ""))
    if grouping not in STRATEGIES:
        raise ProfileError("grouping", f"unknown strategy {grouping!r}; expected one of {list(STRATEGIES)}")
    capacity = _int(_require(raw, "parallel_capacity", ""), "parallel_capacity")
    raw_entries = _require(raw, "entries", "")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise ProfileError("entries", "must be a non-empty list")
    entries = tuple(parse_entry(e, i, model, hpg) for i, e in enumerate(raw_entries))
    ratios = [e.ratio for e in entries]
    if len(set(ratios)) != len(ratios):
        raise ProfileError("entries", f"ratios must be distinct, got {ratios}")
    default = _ratio(raw.get("default_ratio", ratios[0]), "default_ratio")
    if not any(math.isclose(default, r, abs_tol=1e-9) for r in ratios):
        raise ProfileError("default_ratio", f"{default} is not one of the entries' ratios {ratios}")
    tp_size = _int(raw.get("tp_size", 1), "tp_size")
    _check_tp_grouping(model, hpg, entries, tp_size)
    return TangramProfile(model=model, calibration=calibration, heads_per_group=hpg, grouping=grouping,
                          parallel_capacity=capacity, default_ratio=default, entries=entries, tp_size=tp_size)


def _check_tp_grouping(model: ModelShape, hpg: int, entries, tp_size: int) -> None:
    """A profile made for TP = t: heads shard evenly and no group spans two ranks' heads."""

    check_tp_size(model.num_kv_heads, tp_size)
    if tp_size == 1:
        return
    per_rank = max(1, model.num_kv_heads // tp_size)
    if hpg > per_rank:
        raise ProfileError("heads_per_group", f"{hpg} exceeds the {per_rank} KV heads a rank holds at "
                                              f"tp_size {tp_size}")
    for i, e in enumerate(entries):
        for heads in shards(model.num_kv_heads, tp_size):
            try:
                shard_groups(e.groups, heads)
            except ProfileError as exc:
                raise ProfileError(f"entries[{i}].groups", f"{exc.problem} (tp_size {tp_size})") from None


def load_profile(path: str) -> TangramProfile:
    """Read and validate a profile file. Raises ProfileError on any violation."""
    if not os.path.isfile(path):
        raise ProfileError("path", f"profile file {path!r} does not exist")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ProfileError("file", f"{path} is not valid YAML: {exc}") from None
    return parse_profile(raw)
