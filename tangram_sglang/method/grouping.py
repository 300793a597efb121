"""Head grouping: which KV heads of a layer share one page table.

A grouping of one layer is a partition of its H KV heads into
G = ceil(H / H_p) groups of at most H_p heads. Every layer has the same G, so
the virtual layers form a dense [L, G] grid.

Worked example, budgets of one layer b = [0.9, 0.1, 0.5, 0.2], H_p = 2:
  adjacent:      [[0, 1], [2, 3]]  -> group budgets beta = [0.9, 0.5]
  budget-aware:  sort ascending -> heads [1, 3, 2, 0] -> [[1, 3], [2, 0]]
                 -> beta = [0.2, 0.9]
Budget-aware grouping keeps low-budget heads together, so their group's
budget (the max of its members) stays low.

When H_p does not divide H, one group is short. A pool slot is H_p heads
wide whatever the group's size, so a group costs H_p * beta and the short
group goes to the LOW end, where its max is smallest. Example b = [0.2, 0.9,
1.0], H_p = 2: [[0], [1, 2]] -> beta [0.2, 1.0] (slot cost 2 * 1.2), not
[[0, 1], [2]] -> beta [0.9, 1.0] (2 * 1.9). Adjacent grouping keeps head order.
"""

from __future__ import annotations

import math

import numpy as np

STRATEGIES = ("budget_aware", "adjacent")

Groups = list[list[list[int]]]  # [L][G] -> head ids


def num_groups(num_kv_heads: int, heads_per_group: int) -> int:
    return math.ceil(num_kv_heads / heads_per_group)


def group_heads(budgets: np.ndarray, heads_per_group: int, strategy: str = "budget_aware") -> Groups:
    """Partition each layer's heads into groups of ``heads_per_group``.

    budgets: float [L, H]. Returns [L][G] lists of head ids; head ids inside a
    group are in ascending budget order for ``budget_aware`` (ties by head id).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown grouping strategy {strategy!r}; expected one of {STRATEGIES}")
    budgets = np.asarray(budgets, dtype=np.float64)
    num_layers, num_heads = budgets.shape
    if not 1 <= heads_per_group <= num_heads:
        raise ValueError(f"heads_per_group must be in [1, {num_heads}], got {heads_per_group}")
    # budget-aware: a short group (H % H_p heads) takes the lowest budgets
    first = num_heads % heads_per_group if strategy == "budget_aware" else 0
    cuts = ([0] if first else []) + list(range(first, num_heads, heads_per_group)) + [num_heads]
    groups: Groups = []
    for layer in range(num_layers):
        order = (
            np.argsort(budgets[layer], kind="stable")
            if strategy == "budget_aware"
            else np.arange(num_heads)
        )
        groups.append([[int(h) for h in order[a:b]] for a, b in zip(cuts, cuts[1:]) if b > a])
    return groups


def group_budgets(budgets: np.ndarray, groups: Groups) -> np.ndarray:
    """beta[l, g] = max budget of the heads of group g in layer l. float [L, G]."""
    return np.array(
        [[max(budgets[layer][h] for h in group) for group in layer_groups]
         for layer, layer_groups in enumerate(groups)],
        dtype=np.float64,
    )


def group_budget_sums(budgets: np.ndarray, groups: Groups) -> np.ndarray:
    """Phi[l, g] = sum of the budgets of the heads of group g in layer l. float [L, G]."""
    return np.array(
        [[sum(budgets[layer][h] for h in group) for group in layer_groups]
         for layer, layer_groups in enumerate(groups)],
        dtype=np.float64,
    )


def head_to_group(groups: Groups, num_kv_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse map: (group id [L, H], position inside the group [L, H]), int64."""
    num_layers = len(groups)
    gid = np.full((num_layers, num_kv_heads), -1, dtype=np.int64)
    pos = np.full((num_layers, num_kv_heads), -1, dtype=np.int64)
    for layer, layer_groups in enumerate(groups):
        for g, group in enumerate(layer_groups):
            for p, h in enumerate(group):
                gid[layer, h] = g
                pos[layer, h] = p
    return gid, pos
