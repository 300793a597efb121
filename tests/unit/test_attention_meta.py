"""Per-layer index tables, split-row expansion, piece cuts and slot locations."""

import numpy as np
import pytest
import torch

from tangram_sglang.attention import build_layer_meta, build_layer_metas, make_split_row, slot_locs
from tangram_sglang.attention.pieces import split_pieces, tile_pieces
from tangram_sglang.profile import ModelShape
from tangram_sglang.profile.uniform import uniform_profile


def test_layer_meta_worked_example():
    m = build_layer_meta([[2, 0], [1]], num_q_heads=6, num_kv_heads=3, heads_per_group=2)
    assert m.kv_head.tolist() == [[2, 0], [1, 0]]
    assert m.head_valid.tolist() == [[True, True], [True, False]]
    assert m.q_head.tolist() == [[4, 5, 0, 1], [2, 3, 0, 0]]
    assert m.q_row.tolist() == [2, 3, 4, 5, 0, 1]
    assert m.group_of_head.tolist() == [0, 1, 0] and m.slot_of_head.tolist() == [1, 0, 0]
    assert m.group_size.tolist() == [2, 1]


def test_q_row_inverts_q_head():
    m = build_layer_meta([[3, 1, 4], [0, 2]], num_q_heads=10, num_kv_heads=5, heads_per_group=3)
    flat = m.q_head.reshape(-1)
    assert flat[m.q_row].tolist() == list(range(10))
    assert bool(m.row_valid.reshape(-1)[m.q_row].all())


@pytest.mark.parametrize("groups,hq,h,hp", [([[0, 1], [1]], 2, 2, 2), ([[0, 1, 2]], 3, 3, 2), ([[0]], 3, 2, 1)])
def test_layer_meta_rejects_bad_groups(groups, hq, h, hp):
    with pytest.raises(ValueError):
        build_layer_meta(groups, num_q_heads=hq, num_kv_heads=h, heads_per_group=hp)


def test_layer_metas_from_profile():
    shape = ModelShape(architecture="LlamaForCausalLM", num_layers=2, num_kv_heads=3, head_dim=64)
    entry = uniform_profile(shape, [0.5], heads_per_group=2, parallel_capacity=8).entries[0]
    metas = build_layer_metas(entry, num_q_heads=9, num_kv_heads=3, heads_per_group=2)
    assert len(metas) == 2 and metas[0].num_groups == 2 and metas[0].gqa == 3
    np.testing.assert_allclose(metas[1].group_budget, [0.5, 0.5])


def test_split_row_worked_example():
    s = make_split_row([3, 1, 2])
    assert s.cta_group.tolist() == [0, 0, 0, 1, 2, 2]
    assert s.cta_split.tolist() == [0, 1, 2, 0, 0, 1]
    assert s.cta_offset.tolist() == [0, 3, 4] and s.num_ctas == 6 and s.max_splits == 3
    with pytest.raises(ValueError):
        make_split_row([1, 0])


def test_pieces_worked_example():
    lens = torch.tensor([[5, 0]])
    p = split_pieces(lens, torch.tensor([2, 1]))
    assert (p.item.tolist(), p.start.tolist(), p.length.tolist()) == ([0, 0], [0, 3], [3, 2])
    t = tile_pieces(lens, 4)
    assert (t.item.tolist(), t.start.tolist(), t.length.tolist()) == ([0, 0], [0, 4], [4, 1])


@pytest.mark.parametrize("seed", range(5))
def test_pieces_cover_every_slot_once(seed):
    rng = np.random.default_rng(seed)
    lens = torch.as_tensor(rng.integers(0, 40, size=(3, 4)))
    splits = torch.as_tensor(rng.integers(1, 9, size=4))
    for p in (split_pieces(lens, splits), tile_pieces(lens, 7)):
        assert bool((p.length >= 1).all())
        covered = torch.zeros(12, dtype=torch.int64).index_add_(0, p.item, p.length)
        assert covered.tolist() == lens.reshape(-1).tolist()
    per_item = torch.bincount(split_pieces(lens, splits).item, minlength=12).view(3, 4)
    assert bool((per_item <= splits).all())


def test_slot_locs_worked_example():
    table = torch.tensor([[[7, 3], [5, 0]]], dtype=torch.int32)
    locs = slot_locs(table, torch.tensor([[1, 0]]), torch.tensor([[2, 1]]), page_size=2)
    assert locs.tolist() == [15, 6, 10]
