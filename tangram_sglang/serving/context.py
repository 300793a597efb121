"""What a scheduler process serves with, fixed once its pool is sized: the ServingContext.

Two steps, because SGLang learns the model's memory budget after it starts building the
scheduler: ``LoadedProfile.load`` when Scheduler.__init__ starts (the profile, its entry and
scorer), then ``build_context`` when the KV configurator has sized stock SGLang's cache (the
pool's spec from the same bytes, this TP rank's view, the per-layer attention metadata). The
result is frozen: nothing in it changes while the server runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tangram_sglang.attention import build_layer_metas, make_split_rows
from tangram_sglang.method.chunks import Cut, Markers, cut_tokens
from tangram_sglang.method.grouping import group_budgets
from tangram_sglang.method.protection import Protection
from tangram_sglang.pool.spec import PoolSpec
from tangram_sglang.profile import ModelShape, ProfileError, RatioEntry, TangramProfile, load_profile
from tangram_sglang.profile.tensor_parallel import rank_view, shard_of_rank, shards
from tangram_sglang.scorers import Scorer
from tangram_sglang.scorers.base import HeadShard
from tangram_sglang.scorers.profile_scorer import profile_scorer

DEFAULT_CHUNK = 512


def chunk_size_of(profile: TangramProfile) -> int:
    """The compression chunk: the calibration's chunk size (the budgets were measured on it)."""
    return int(profile.calibration.chunk_size) or DEFAULT_CHUNK


@dataclass(frozen=True)
class LoadedProfile:
    """--tangram-profile / --tangram-ratio, read in the scheduler process."""

    path: str
    profile: TangramProfile
    ratio: float | None
    scorer: Scorer

    @classmethod
    def load(cls, path: str, ratio: float | None) -> "LoadedProfile":
        profile = load_profile(path)
        profile.select(ratio)  # a ratio the profile lacks fails here, before any pool is built
        return cls(path, profile, ratio, profile_scorer(profile, path))


@dataclass(frozen=True, kw_only=True)
class ServingContext:
    path: str
    profile: TangramProfile
    ratio: float | None
    entry: RatioEntry              # this TP rank's view of the served entry
    tp: tuple[int, int]            # (TP size, this rank)
    chunk: int                     # compression chunk (tokens)
    protection: Protection
    scorer: Scorer                 # of this rank's KV heads
    spec: PoolSpec
    stock_tokens: int              # full-KV tokens stock SGLang would hold in the same bytes
    full_kv_token_bytes: int       # one token's K and V in every layer and KV head of this rank
    data_plane: str                # "torch", "triton" or "cuda"
    device: object
    metas: list                    # per layer: attention.LayerMeta
    split_rows: list               # per layer: attention.SplitRow
    ratio_budgets: dict            # every ratio of the profile -> beta float64 [L, G] in the served groups
    markers: Markers | None = None  # the chat template's message markers (method/chunks.py)

    def cut(self, tokens, whole: bool = True, ratio: float | None = None) -> Cut:
        """The chunks and protected tokens a sequence is kept in at ``ratio`` (None: the served one;
        method/chunks.cut_tokens; whole=False: the start of a sequence not known further)."""
        keep_all = bool(np.all(self.budgets_for(ratio) >= 1.0))
        return cut_tokens(tokens, self.chunk, self.protection, self.markers, whole=whole, keep_all=keep_all)

    def budgets_for(self, ratio: float | None) -> np.ndarray:
        """beta [L, G] a request asking for ``ratio`` (None: the served one) is planned and compressed
        with; raises ProfileError naming the profile's ratios for one it lacks."""
        if ratio is None:
            return self.entry.group_budget
        for have, beta in self.ratio_budgets.items():
            if math.isclose(have, float(ratio), abs_tol=1e-9):
                return beta
        raise ProfileError("tangram_ratio", f"{ratio} is not a ratio of the served profile; it holds "
                           f"{', '.join(str(r) for r in sorted(self.ratio_budgets))}")

    @property
    def logical_tokens(self) -> int:
        """Token ids SGLang's allocator gets: enough for every token the pages could ever hold,
        so pages, not ids, are what binds (an id costs 8 bytes of free list)."""
        slots_per_token = float(self.entry.group_budget.sum())
        logical = int(self.spec.num_pages * self.spec.page_size / max(slots_per_token, 1e-6)) * 4
        return max(logical, 16 * self.stock_tokens)


def build_context(loaded: LoadedProfile, hf_config, *, stock_tokens: int, dtype: torch.dtype, device,
                  page_size: int, num_q_heads: int, tp_size: int = 1, tp_rank: int = 0,
                  data_plane: str = "torch", chunk: int | None = None,
                  protection: Protection = Protection(), kv_scales=None,
                  markers: Markers | None = None) -> ServingContext:
    """Size the ragged pool from the bytes stock SGLang would give its KV cache (one rank's:
    num_q_heads and the KV heads are the rank's share; tensor_parallel.rank_view). Raises
    ProfileError when the profile was not made for this model. dtype: the KV cache's (an FP8
    type stores pages quantized, with kv_scales: per layer (k_scale, v_scale), default 1.0)."""
    profile = loaded.profile
    profile.check_model(ModelShape.from_hf_config(hf_config))
    if profile.model.window_layers and loaded.scorer.needs_reconstruction:
        # its extra pass attends to every cached slot, and window layers release theirs
        raise ProfileError("calibration.method", f"the {loaded.scorer.name} scorer's reconstruction pass has no "
                           "sliding window; serve this model with a profile of another method (e.g. fastkvzip)")
    view = rank_view(profile, tp_size, tp_rank)
    entry, shape, scorer = view.select(loaded.ratio), view.model, loaded.scorer
    if tp_size > 1 and scorer.needs_hidden:  # gates rate all heads: keep this rank's
        H = profile.model.num_kv_heads
        scorer = HeadShard(scorer, shards(H, tp_size)[shard_of_rank(H, tp_size, tp_rank)])
    itemsize = torch.empty((), dtype=dtype).element_size()
    token_bytes = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * itemsize
    spec = PoolSpec.for_bytes(int(stock_tokens) * token_bytes, num_layers=shape.num_layers,
                              num_groups=entry.num_groups, heads_per_group=view.heads_per_group,
                              head_dim=shape.head_dim, page_size=page_size,
                              dtype=str(dtype).replace("torch.", ""))
    metas = build_layer_metas(entry, num_q_heads=num_q_heads, num_kv_heads=shape.num_kv_heads,
                              heads_per_group=view.heads_per_group, device=device, kv_scales=kv_scales,
                              windows=shape.windows)
    return ServingContext(path=loaded.path, profile=profile, ratio=loaded.ratio, entry=entry,
                          tp=(tp_size, tp_rank), chunk=chunk or chunk_size_of(profile), protection=protection,
                          scorer=scorer, spec=spec, stock_tokens=int(stock_tokens), full_kv_token_bytes=token_bytes,
                          data_plane=data_plane, device=device, metas=metas,
                          split_rows=make_split_rows(entry.split_map, device=device),
                          ratio_budgets=ratio_budgets(view, entry), markers=markers)


def ratio_budgets(view: TangramProfile, served: RatioEntry) -> dict:
    """Every ratio's group budgets in the served entry's groups (a group keeps the most any of its heads
    keeps at that ratio; with one head per group, that ratio's own budgets), so a request may ask for
    any ratio of the profile and share the pool's virtual layers, pages and batches."""
    return {e.ratio: group_budgets(e.budgets, served.groups) for e in view.entries}
