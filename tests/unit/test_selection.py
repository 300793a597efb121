"""Global (Eq. 3) and per-head (Eq. 4) top-k selection on hand-worked cases."""

import math

import numpy as np
import pytest
import torch

from tangram_sglang.calibration.pilot import _ChunkRecorder
from tangram_sglang.scorers import Scorer
from tangram_sglang.scorers.selection import (
    global_keep_total,
    global_topk_counts,
    global_topk_mask,
    model_topk_masks,
    per_head_topk_indices,
    per_head_topk_mask,
    scoped_topk_counts,
)

DOC = torch.tensor([[0.9, 0.8, 0.1, 0.1],
                    [0.2, 0.1, 0.3, 0.7]])


def test_docstring_example_global():
    assert global_topk_counts(DOC, 0.5).tolist() == [2, 2]
    mask = global_topk_mask(DOC, 0.5)
    assert mask.tolist() == [[True, True, False, False], [False, False, True, True]]
    assert global_topk_counts(DOC, 0.25).tolist() == [2, 0]


def test_docstring_example_per_head():
    idx = per_head_topk_indices(DOC, [1, 3])
    assert idx[0].tolist() == [0]
    assert idx[1].tolist() == [3, 2, 0]
    assert per_head_topk_mask(DOC, 2).tolist() == [[True, True, False, False], [False, False, True, True]]


def test_global_total_is_ceil_without_float_noise():
    assert global_keep_total(0.7, 3, 10) == 21  # 0.7 * 30 = 21.000000000000004
    assert global_keep_total(0.25, 3, 7) == 6  # ceil(5.25)
    assert global_keep_total(1.0, 2, 5) == 10
    for ratio, h, n in [(0.7, 3, 10), (0.3, 8, 17), (0.05, 2, 3)]:
        scores = torch.rand(h, n, generator=torch.Generator().manual_seed(n))
        assert int(global_topk_counts(scores, ratio).sum()) == math.ceil(round(ratio * h * n, 9))


def test_ties_later_position_then_higher_head_wins():
    equal = torch.zeros(2, 4)
    # keep 3 of 8: positions 3 (both heads) then position 2 of head 1
    assert global_topk_mask(equal, 3 / 8).tolist() == [[False, False, False, True], [False, False, True, True]]
    assert per_head_topk_indices(equal, 2)[0].tolist() == [3, 2]


def test_bad_input_raises():
    with pytest.raises(ValueError, match="ratio"):
        global_topk_counts(DOC, 0.0)
    with pytest.raises(ValueError, match="ratio"):
        global_topk_counts(DOC, 1.5)
    with pytest.raises(ValueError, match="num_kv_heads"):
        global_topk_counts(torch.zeros(4), 0.5)
    with pytest.raises(ValueError, match="counts"):
        per_head_topk_indices(DOC, [1, 5])


class _FixedScorer(Scorer):
    """Returns prepared scores chunk by chunk."""

    def __init__(self, chunks):
        self.chunks = list(chunks)

    def score(self, q, k, v, state=None):
        return self.chunks.pop(0)


def test_recorder_turns_global_selection_into_per_head_retention():
    # Two chunks of one layer, H = 2. Chunk 1 (n=4) is DOC: at rho 0.5 heads
    # keep [2, 2], at 0.25 [2, 0]. Chunk 2 (n=2): head 1 dominates -> at 0.5
    # keep ceil(2) = 2 -> [0, 2]; at 0.25 ceil(1) = 1 -> [0, 1].
    chunk2 = torch.tensor([[0.0, 0.1], [0.5, 0.6]])
    rec = _ChunkRecorder(_FixedScorer([DOC, chunk2]), (0.5, 0.25), num_layers=1, num_kv=2)
    for n in (4, 2):
        q = torch.zeros(1, 4, n, 3)  # [1, Hq, n, d]
        kv = torch.zeros(1, 2, 10, 3)  # whole cache; the recorder takes the last n
        rec(0, q, kv, kv)
        rec.end_chunk()
    assert rec.kept.tolist() == [[[2, 4]], [[2, 1]]]
    retention = rec.kept / 6.0
    np.testing.assert_allclose(retention[0, 0], [2 / 6, 4 / 6])
    np.testing.assert_allclose(retention[:, 0].sum(axis=1), [1.0, 0.5])  # = rho * H, to the ceil


def test_model_scope_spans_layers_by_hand():
    # L = 2 layers of DOC-shaped scores; layer 1 dominates. rho 0.5 keeps ceil(0.5 * 2 * 2 * 4) = 8 of 16.
    layer1 = DOC + 1.0
    masks = model_topk_masks([DOC, layer1], 0.5)
    assert masks.shape == (2, 2, 4)
    assert masks[1].all() and not masks[0].any()  # every layer-1 score beats every layer-0 score
    # rho 0.25 keeps 4: layer 1's 1.9, 1.8, 1.7, 1.3 -> heads [2, 2] in layer 1, none in layer 0
    assert scoped_topk_counts([DOC, layer1], 0.25, "model").tolist() == [[0, 0], [2, 2]]
    # layer scope is Eq. 3 per layer: [2, 0] in each
    assert scoped_topk_counts([DOC, layer1], 0.25, "layer").tolist() == [[2, 0], [2, 0]]
    # ties: later position first, then the higher (layer, head)
    flat = torch.zeros(2, 2, 3)
    assert model_topk_masks(list(flat), 1 / 12).nonzero().tolist() == [[1, 1, 2]]
    assert model_topk_masks(list(flat), 2 / 12).nonzero().tolist() == [[1, 0, 2], [1, 1, 2]]


def test_model_scope_bad_input():
    with pytest.raises(ValueError, match="at least one layer"):
        model_topk_masks([], 0.5)
    with pytest.raises(ValueError, match="every layer"):
        model_topk_masks([DOC, DOC[:, :3]], 0.5)
    with pytest.raises(ValueError, match="scope"):
        scoped_topk_counts([DOC], 0.5, "head")


def test_recorder_model_scope_counts_the_whole_chunk_once():
    # two layers, one chunk: layer 1 scores DOC + 1 -> at rho 0.25 it takes all 4 slots
    rec = _ChunkRecorder(_FixedScorer([DOC, DOC + 1.0]), (0.25,), num_layers=2, num_kv=2, scope="model")
    q, kv = torch.zeros(1, 4, 4, 3), torch.zeros(1, 2, 4, 3)
    rec(0, q, kv, kv)
    with pytest.raises(RuntimeError, match=r"expected \[0, 1\]"):
        rec.end_chunk()
    rec(1, q, kv, kv)
    rec.end_chunk()
    assert rec.kept.tolist() == [[[0, 0], [2, 2]]]
