"""The profile: the versioned file of budgets, groups and split maps (format.py), checked on
load (validation.py), built (builder.py), regrouped for tensor parallelism (tensor_parallel.py),
made uniform (uniform.py) or imported from the authors' retention data (reference_import.py).
Re-exports only."""

from tangram_sglang.profile.format import CalibrationMeta, ModelShape, ProfileError, RatioEntry, TangramProfile
from tangram_sglang.profile.validation import load_profile

__all__ = ["CalibrationMeta", "ModelShape", "ProfileError", "RatioEntry", "TangramProfile", "load_profile"]
