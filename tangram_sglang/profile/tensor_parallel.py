"""Tensor parallelism: which KV heads a rank holds, grouping within a rank, and one rank's view.

SGLang shards a layer's H KV heads over t ranks in contiguous blocks of H / t
(``get_num_kv_heads``); with t > H each head is replicated on t / H ranks and
rank r holds head r // (t / H). A page table can only span heads of one rank,
so a profile made for TP = t groups heads within each shard (its ``tp_size``).

The ranks must take the same admission decisions without talking to each
other (each runs SGLang's scheduler on the same requests): every rank must
need the same number of pages for every request at every length. Pages depend
only on each virtual layer's group budget beta (keep counts are static), so it
is enough that every rank holds the same MULTISET of betas. A rank's view
raises its betas to the elementwise maximum over ranks of the sorted betas:
rank r's k-th smallest virtual layer gets M[k] = max_r sorted_r[k] >= its own.

Worked example, one layer, H = 4, t = 2, H_p = 1, budgets [0.2, 0.9, 0.4, 0.5]:
  shards [[0, 1], [2, 3]] -> rank betas [0.2, 0.9] and [0.4, 0.5]
  sorted [0.2, 0.9], [0.4, 0.5] -> M = [0.4, 0.9]
  rank 0 keeps heads at [0.4, 0.9], rank 1 at [0.4, 0.9]: both 1.3 of a layer.
The cost of TP (benchmarks/modeled/tp_memory.py) is the slots M adds over TP = 1.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from tangram_sglang.method.grouping import Groups, group_budgets, group_heads
from tangram_sglang.method.split_map import profile_split_map
from tangram_sglang.profile.format import ProfileError, RatioEntry, TangramProfile

logger = logging.getLogger("tangram_sglang")


def check_tp_size(num_kv_heads: int, tp_size: int, profile_tp: int | None = None) -> None:
    """Raise ProfileError unless the H KV heads shard evenly over tp_size ranks (SGLang's layout)."""
    if tp_size < 1:
        raise ProfileError("tp_size", f"must be >= 1, got {tp_size}")
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        made = f"the profile's groups were made for TP={profile_tp}; " if profile_tp is not None else ""
        raise ProfileError("tp_size", f"{made}--tp-size {tp_size} cannot shard the model's {num_kv_heads} KV "
                                      f"heads evenly (neither divides the other), so no grouping fits it")


def shards(num_kv_heads: int, tp_size: int) -> list[list[int]]:
    """The distinct head sets ranks hold, in rank order: min(t, H) lists of max(1, H // t) head ids."""
    check_tp_size(num_kv_heads, tp_size)
    per = max(1, num_kv_heads // tp_size)
    return [list(range(s * per, (s + 1) * per)) for s in range(num_kv_heads // per)]


def shard_of_rank(num_kv_heads: int, tp_size: int, rank: int) -> int:
    """Index into ``shards`` of the heads rank ``rank`` holds."""
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} outside [0, {tp_size})")
    replicas = max(1, tp_size // num_kv_heads)
    return rank // replicas


def heads_per_group_for(num_kv_heads: int, tp_size: int, heads_per_group: int) -> int:
    """A group cannot span ranks: H_p is at most a shard's head count."""
    return min(heads_per_group, max(1, num_kv_heads // tp_size))


def group_for_tp(budgets: np.ndarray, heads_per_group: int, strategy: str, tp_size: int) -> Groups:
    """Group each shard's heads on their own (``group_heads``), as global head ids, shard-major.

    budgets float [L, H] -> [L][G] with G = shards x groups per shard; every group inside one shard."""
    budgets = np.asarray(budgets, dtype=np.float64)
    parts = shards(budgets.shape[1], tp_size)
    hpg = heads_per_group_for(budgets.shape[1], tp_size, heads_per_group)
    per_shard = [group_heads(budgets[:, heads], hpg, strategy) for heads in parts]
    return [[[heads[h] for h in group] for s, heads in enumerate(parts) for group in per_shard[s][layer]]
            for layer in range(budgets.shape[0])]


def regroup(profile: TangramProfile, tp_size: int) -> TangramProfile:
    """The same calibrated budgets grouped for ``tp_size`` (no recalibration); split maps are
    those of each shard's rank view, shard-major."""
    H = profile.model.num_kv_heads
    check_tp_size(H, tp_size, profile.tp_size)
    hpg = heads_per_group_for(H, tp_size, profile.heads_per_group)
    entries = []
    for e in profile.entries:
        groups = group_for_tp(e.budgets, hpg, profile.grouping, tp_size)
        views = shard_views(e, groups, H, tp_size, profile.parallel_capacity)
        entries.append(dataclasses.replace(e, groups=groups,
                                           split_map=np.concatenate([v.split_map for v in views], axis=1)))
    return dataclasses.replace(profile, heads_per_group=hpg, tp_size=tp_size, entries=tuple(entries))


def shard_groups(groups: Groups, heads: list[int]) -> Groups:
    """The groups lying in one shard, renumbered to the rank's local head ids 0..len(heads)-1.

    Raises ProfileError when a group spans shards (a profile made for a smaller TP size)."""
    local = {h: i for i, h in enumerate(heads)}
    out = []
    for layer, layer_groups in enumerate(groups):
        mine = [g for g in layer_groups if g[0] in local]
        if any(h not in local for g in mine for h in g):
            raise ProfileError(f"entries.groups[{layer}]", f"a group spans TP ranks (shard {heads})")
        out.append([[local[h] for h in g] for g in mine])
    return out


def equalized_betas(budgets: np.ndarray, groups: Groups, num_kv_heads: int, tp_size: int) -> list[np.ndarray]:
    """Per shard float [L, G_local]: each virtual layer's beta raised so every shard holds the same
    multiset of betas (the elementwise max over shards of the sorted betas, put back in place).
    budgets float [L, H]; groups [L][G] global head ids, none spanning shards."""
    parts = [set(heads) for heads in shards(num_kv_heads, tp_size)]
    betas = [group_budgets(budgets, [[g for g in layer if g[0] in heads] for layer in groups]) for heads in parts]
    if len({b.shape for b in betas}) != 1:
        raise ProfileError("entries.groups", "shards hold different numbers of groups")
    orders = [np.argsort(b.ravel(), kind="stable") for b in betas]
    top = np.max([b.ravel()[o] for b, o in zip(betas, orders)], axis=0)
    out = []
    for b, o in zip(betas, orders):
        flat = np.empty_like(top)
        flat[o] = top
        out.append(flat.reshape(b.shape))
    return out


def shard_views(entry: RatioEntry, groups: Groups, num_kv_heads: int, tp_size: int,
                capacity: int) -> list[RatioEntry]:
    """Each shard's entry under ``groups``: its heads (local ids), the equalized betas (each group's
    highest-budget head raised to it) and its split map."""
    views = []
    for heads, beta in zip(shards(num_kv_heads, tp_size), equalized_betas(entry.budgets, groups, num_kv_heads,
                                                                          tp_size)):
        local = shard_groups(groups, heads)
        budgets = entry.budgets[:, heads].copy()
        for layer, layer_groups in enumerate(local):
            for g, members in enumerate(layer_groups):
                budgets[layer, members[int(np.argmax(budgets[layer, members]))]] = beta[layer, g]
        views.append(RatioEntry(ratio=entry.ratio, budgets=budgets, groups=local,
                                split_map=profile_split_map(budgets, local, capacity),
                                mean=entry.mean[:, heads], std=entry.std[:, heads]))
    return views


def rank_view(profile: TangramProfile, tp_size: int, rank: int) -> TangramProfile:
    """What rank ``rank`` of a TP = tp_size server serves: its heads (local ids), its groups, the
    equalized betas and its split map. A profile made for another TP size is regrouped first
    (logged). TP = 1 of a TP = 1 profile is the profile itself."""
    if profile.tp_size != tp_size:
        logger.info("Tangram: profile grouped for TP=%d, serving --tp-size %d: regrouped from its stored "
                    "budgets (no recalibration)", profile.tp_size, tp_size)
        profile = regroup(profile, tp_size)
    if tp_size == 1:
        return profile
    H = profile.model.num_kv_heads
    shard = shard_of_rank(H, tp_size, rank)
    entries = tuple(shard_views(e, e.groups, H, tp_size, profile.parallel_capacity)[shard] for e in profile.entries)
    model = dataclasses.replace(profile.model, num_kv_heads=len(shards(H, tp_size)[shard]))
    return dataclasses.replace(profile, model=model, entries=entries, tp_size=1)

