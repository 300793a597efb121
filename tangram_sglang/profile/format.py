"""The Tangram profile: budgets, groups and split map of one model, versioned.

File format ``tangram-profile`` version 1 (YAML)::

    format: tangram-profile
    version: 1
    model: {architecture: LlamaForCausalLM, num_layers: 30, num_kv_heads: 3, head_dim: 64}
    # hybrid models only: the sliding-window layers and their window (keys each query sees, itself
    # included); those layers keep every token (budget 1.0) and attend to their window
    #   model: {..., window: 512, window_layers: [0, 1, 2, 3, 4, 6, ...]}
    calibration:                 # how the budgets were made
      method: snapkv             # scorer name, or "uniform"
      target_ratios: [0.5, 0.25]
      alpha: 2.0
      num_samples: 50
      sources: [needle, sharegpt, mtbench]
      chunk_size: 512
      date: "2026-11-21"
      tool_version: tangram_sglang 0.1.0
      note: ""                   # free text, e.g. where imported data came from
      weights: p.gate.safetensors  # only for scorers with weights (fastkvzip), beside the profile
      weights_sha256: "..."      # checked at launch
      scorer_args: {prefix_ids: [...]}  # only for scorers with options (kvzip: the repeat prompt's ids)
      scope: model               # only when not "layer": the pilot's global top-k spanned all layers
    heads_per_group: 2
    grouping: budget_aware       # or adjacent
    parallel_capacity: 132       # CTAs the split maps were computed for
    default_ratio: 0.25          # entry served when no ratio is asked for
    tp_size: 2                   # only when not 1: groups formed within each TP rank's KV heads
    entries:                     # one per target ratio
      - ratio: 0.25
        budgets: [[...H...] x L]    # b[l][h] in (0, 1]
        groups: [[[h, ...] x G] x L]  # a partition of each layer's heads
        split_map: [[...G...] x L]  # int >= 1
        stats: {mean: [[...]], std: [[...]]}  # per-head retention over samples

Every rule is checked on load (validation.load_profile); a violation raises ProfileError naming the
field and the problem.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import yaml

from tangram_sglang.method.grouping import Groups, group_budgets

FORMAT = "tangram-profile"
VERSION = 1


class ProfileError(ValueError):
    """A profile that breaks a rule of the format, or does not fit the model."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"tangram profile: field '{field_name}': {problem}")
        self.field = field_name
        self.problem = problem


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What a profile must agree with in the served model. window_layers: the layers that attend to
    the newest ``window`` positions only (each query sees itself and window - 1 keys before it)."""

    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    window: int = 0
    window_layers: tuple[int, ...] = ()

    @property
    def windows(self) -> tuple[int, ...]:
        """Per layer: its window, 0 for a full-attention layer."""
        return tuple(self.window if i in self.window_layers else 0 for i in range(self.num_layers))

    @classmethod
    def from_hf_config(cls, config) -> "ModelShape":
        """From a transformers PretrainedConfig or a config.json dict."""
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else (
            lambda k, d=None: getattr(config, k, d))
        text = get("text_config")
        if text is not None and get("num_hidden_layers") is None:  # multimodal configs nest the text model
            text = text if isinstance(text, dict) else text.to_dict()
            return cls.from_hf_config({**text, "architectures": get("architectures")})
        heads = get("num_attention_heads")
        head_dim = get("head_dim") or get("hidden_size") // heads
        archs = get("architectures") or ["unknown"]
        num_layers = int(get("num_hidden_layers"))
        kinds = layer_kinds(get("layer_types"), get("sliding_window_pattern"), get("sliding_window"), num_layers)
        window_layers = tuple(i for i, kind in kinds.items() if kind == SLIDING)
        return cls(
            architecture=str(archs[0]),
            num_layers=num_layers,
            num_kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            window=int(get("sliding_window") or 0) if window_layers else 0,
            window_layers=window_layers,
        )

    @classmethod
    def from_model_path(cls, model_path: str) -> "ModelShape":
        path = os.path.join(model_path, "config.json")
        if not os.path.isfile(path):
            raise ProfileError("model", f"no config.json in model folder {model_path!r}")
        with open(path) as f:
            return cls.from_hf_config(json.load(f))


SLIDING = "sliding_attention"


def layer_kinds(layer_types, pattern, window, num_layers: int) -> dict[int, str]:
    """{layer: its kind} of the layers that do not attend to the whole history: HF's ``layer_types``
    (``sliding_attention``, ``chunked_attention``, linear attention, ...) or, in configs written before
    it, Gemma's ``sliding_window_pattern`` (every pattern-th layer is global)."""
    if layer_types:
        return {i: t for i, t in enumerate(layer_types) if t != "full_attention"}
    if pattern and window:
        return {i: SLIDING for i in range(num_layers) if (i + 1) % int(pattern)}
    return {}


@dataclass(frozen=True, kw_only=True)
class CalibrationMeta:
    method: str
    target_ratios: tuple[float, ...]
    alpha: float
    num_samples: int
    sources: tuple[str, ...] = ()
    chunk_size: int = 0
    date: str = ""
    tool_version: str = ""
    note: str = ""
    weights: str = ""  # scorer weights file beside the profile (fastkvzip gates), or ""
    weights_sha256: str = ""
    scorer_args: dict = field(default_factory=dict)  # options for the scorer (kvzip: prefix_ids)
    scope: str = "layer"  # the pilot's global top-k: one layer (Eq. 3) or all layers (selection.SCOPES)


@dataclass(frozen=True, kw_only=True)
class RatioEntry:
    """Budgets and their derived layout for one target ratio.

    budgets, mean, std: float64 [L, H]; groups: [L][G] head ids;
    split_map: int64 [L, G]; group_budget (beta): float64 [L, G].
    """

    ratio: float
    budgets: np.ndarray
    groups: Groups
    split_map: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    group_budget: np.ndarray = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "group_budget", group_budgets(self.budgets, self.groups))

    @property
    def num_groups(self) -> int:
        return len(self.groups[0])


@dataclass(frozen=True, kw_only=True)
class TangramProfile:
    model: ModelShape
    calibration: CalibrationMeta
    heads_per_group: int
    grouping: str
    parallel_capacity: int
    default_ratio: float
    entries: tuple[RatioEntry, ...]
    tp_size: int = 1  # the TP size the groups were made for (tensor_parallel.py)

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(e.ratio for e in self.entries)

    def select(self, ratio: float | None = None) -> RatioEntry:
        """The entry for ``ratio`` (default: ``default_ratio``)."""
        want = self.default_ratio if ratio is None else float(ratio)
        for entry in self.entries:
            if math.isclose(entry.ratio, want, abs_tol=1e-9):
                return entry
        raise ProfileError("entries", f"no entry for ratio {want}; the profile holds {list(self.ratios)}")

    def check_model(self, shape: ModelShape) -> None:
        """Raise ProfileError unless the profile was made for this model shape."""
        for name in ("num_layers", "num_kv_heads", "head_dim", "window_layers", "window"):
            mine, theirs = (list(x) if isinstance(x, tuple) else x for x in (getattr(self.model, name),
                                                                              getattr(shape, name)))
            if mine != theirs:
                raise ProfileError(f"model.{name}", f"profile has {mine}, the served model has {theirs}")
        if self.model.architecture != shape.architecture:
            raise ProfileError(
                "model.architecture",
                f"profile is for {self.model.architecture}, the served model is {shape.architecture}",
            )

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": _model_to_dict(self.model),
            "calibration": _calibration_to_dict(self.calibration),
            "heads_per_group": self.heads_per_group,
            "grouping": self.grouping,
            "parallel_capacity": self.parallel_capacity,
            "default_ratio": self.default_ratio,
            **({"tp_size": self.tp_size} if self.tp_size != 1 else {}),  # TP = 1 files stay as they were
            "entries": [_entry_to_dict(e) for e in self.entries],
        }

    def save(self, path: str) -> None:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=120)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def _model_to_dict(model: ModelShape) -> dict:
    out = dataclasses.asdict(model)
    out["window_layers"] = list(model.window_layers)
    if not model.window_layers:  # full-attention models: files of earlier versions stay byte-identical
        del out["window"], out["window_layers"]
    return out


def _calibration_to_dict(meta: CalibrationMeta) -> dict:
    out = dataclasses.asdict(meta)
    out["target_ratios"] = [float(r) for r in meta.target_ratios]
    out["sources"] = list(meta.sources)
    for key in ("weights", "weights_sha256", "scorer_args"):
        if not out[key]:
            del out[key]
    if out["scope"] == "layer":  # the default: files of earlier versions stay byte-identical
        del out["scope"]
    return out


def _round_list(a: np.ndarray) -> list:
    return np.round(np.asarray(a, dtype=np.float64), 6).tolist()


def _entry_to_dict(e: RatioEntry) -> dict:
    return {
        "ratio": float(e.ratio),
        "budgets": _round_list(e.budgets),
        "groups": [[list(map(int, g)) for g in layer] for layer in e.groups],
        "split_map": np.asarray(e.split_map, dtype=np.int64).tolist(),
        "stats": {"mean": _round_list(e.mean), "std": _round_list(e.std)},
    }
