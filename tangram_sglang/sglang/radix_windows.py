"""Sliding-window layers in the radix tree (sglang/radix.py): which nodes a match may end at, and
dropping the window pages of interior nodes no match will end at, least recently used first.

A node that dropped its window columns records ``window_end`` (slots [V]): the latest match end
below it it dropped them for; it may drop more only for a later end.
"""

from __future__ import annotations

import numpy as np


def _lock_ends_at(node) -> bool:
    """Some lock ends at this node (a request admitted onto it, whose match was window_ready)."""
    return node.lock_ref > sum(k.lock_ref for ks in node.children.values() for k in ks)


def _may_end_a_match(node) -> bool:
    """A leaf, a node that has not dropped its window pages, or one some lock ends at."""
    return not node.children or node.window_end is None or _lock_ends_at(node)


def _match_end_below(node) -> np.ndarray:
    """The earliest end (slots [V]) below an interior node where a match may still end: the ends of the
    descendants that may end one (_may_end_a_match), reached through those that dropped their window
    pages. Reading past a dropped child costs reuse, never correctness: a match ends only where
    window_ready."""
    ends, stack = [], [k for ks in node.children.values() for k in ks]
    while stack:
        k = stack.pop()
        if _may_end_a_match(k):
            ends.append(k.seg.end_slots)
        else:
            stack.extend(c for cs in k.children.values() for c in cs)
    return np.min(ends, axis=0)


def drop_windows(tree, goal: int) -> None:
    """Interior nodes, least recently used first, stop being match ends and drop the window
    pages no query at or after the earliest match end below them reads (_match_end_below), until
    ``goal`` pages are available. A node some lock ends at (a request being admitted onto it) keeps
    its pages; a node that dropped them for an end at or past this one has nothing more to drop.
    A node's earliest match end moves past children that dropped theirs after it did (LRU order
    reaches a chain's older ancestors first), so passes repeat while one drops more."""
    while tree.store.available_pages < goal and _drop_pass(tree, goal):
        pass


def _drop_pass(tree, goal: int) -> bool:
    """One pass over the interior nodes, least recently used first; whether any dropped more."""
    interior = sorted((n for n in tree._nodes() if n.children), key=lambda n: n.last_access_time)
    dropped = False
    for node in interior:
        if tree.store.available_pages >= goal:
            break
        if _lock_ends_at(node):
            continue
        end = _match_end_below(node)
        if node.window_end is None or np.any(end > node.window_end):
            tree.store.drop_window_columns(node.seg.seg_id, end)
            node.window_end = end if node.window_end is None else np.maximum(end, node.window_end)
            dropped = True
    return dropped
