"""The scorer a profile serves with, including scorers with learned weights.

A profile's ``calibration.method`` names the scorer. Scorers with weights
(``fastkvzip``: per-layer gates) also name a weights file, relative to the
profile's folder, and its sha256 (``calibration.weights``,
``calibration.weights_sha256``). A missing or altered file is a ProfileError
naming the file, raised when the server validates the profile at launch.
"""

from __future__ import annotations

import os

from tangram_sglang.profile import ProfileError, TangramProfile
from tangram_sglang.scorers import Scorer, canonical_name, get_scorer
from tangram_sglang.scorers.fastkvzip import FastKVzipScorer, file_sha256, load_gates

WEIGHTED = {"fastkvzip"}


def weights_path(profile: TangramProfile, profile_path: str) -> str | None:
    """Absolute path of the profile's scorer weights, or None when its scorer has none."""
    name = profile.calibration.weights
    if not name:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(profile_path)), name)


def check_scorer_weights(profile: TangramProfile, profile_path: str) -> None:
    """ProfileError unless a weighted scorer's file exists and matches its recorded sha256,
    and the scorer accepts the profile's scorer_args."""
    method = profile.calibration.method
    if method not in WEIGHTED:
        profile_scorer(profile, profile_path)  # cheap without weights: validates the method and scorer_args
        return
    path = weights_path(profile, profile_path)
    if path is None:
        raise ProfileError("calibration.weights", f"scorer {method!r} needs a weights file; the profile names none")
    if not os.path.isfile(path):
        raise ProfileError("calibration.weights", f"scorer weights file {path} does not exist")
    want = profile.calibration.weights_sha256
    if not want:
        raise ProfileError("calibration.weights_sha256", f"no checksum recorded for {path}")
    if file_sha256(path) != want:
        raise ProfileError("calibration.weights_sha256",
                           f"scorer weights file {path} does not match the recorded sha256 {want[:12]}... "
                           "(altered, or from another calibration)")


def profile_scorer(profile: TangramProfile, profile_path: str) -> Scorer:
    """The scorer the profile was calibrated with, its weights loaded and checked."""
    try:
        method = canonical_name(profile.calibration.method)
    except ValueError as exc:
        raise ProfileError("calibration.method", str(exc)) from None
    if method not in WEIGHTED:
        try:
            return get_scorer(method, **profile.calibration.scorer_args)
        except ValueError as exc:
            raise ProfileError("calibration.scorer_args", str(exc)) from None
    check_scorer_weights(profile, profile_path)
    path = weights_path(profile, profile_path)
    try:
        gates = load_gates(path, profile.calibration.weights_sha256)
    except ValueError as exc:
        raise ProfileError("calibration.weights", str(exc)) from None
    shape = gates[0].shape
    if (shape.num_layers, shape.num_kv_heads) != (profile.model.num_layers, profile.model.num_kv_heads):
        raise ProfileError("calibration.weights", f"gates in {path} are for {shape.num_layers} layers x "
                           f"{shape.num_kv_heads} KV heads, the profile's model has {profile.model.num_layers} x "
                           f"{profile.model.num_kv_heads}")
    return FastKVzipScorer(gates)
