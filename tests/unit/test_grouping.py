"""Budget-aware and adjacent grouping on hand-worked examples."""

import numpy as np
import pytest

from tangram_sglang.method.grouping import group_budget_sums, group_budgets, group_heads, head_to_group, num_groups

DOC = np.array([[0.9, 0.1, 0.5, 0.2]])


def test_docstring_example():
    assert group_heads(DOC, 2, "adjacent") == [[[0, 1], [2, 3]]]
    aware = group_heads(DOC, 2, "budget_aware")
    assert aware == [[[1, 3], [2, 0]]]
    np.testing.assert_allclose(group_budgets(DOC, aware), [[0.2, 0.9]])
    np.testing.assert_allclose(group_budgets(DOC, group_heads(DOC, 2, "adjacent")), [[0.9, 0.5]])
    np.testing.assert_allclose(group_budget_sums(DOC, aware), [[0.3, 1.4]])


def test_uneven_groups_ties_and_per_layer_sorting():
    b = np.array([[0.3, 0.3, 0.1], [0.2, 0.8, 0.5]])
    groups = group_heads(b, 2)
    assert groups == [[[2], [0, 1]], [[0], [2, 1]]]  # ties keep head order; short group at the low end
    assert group_heads(b, 2, "adjacent") == [[[0, 1], [2]], [[0, 1], [2]]]
    assert num_groups(3, 2) == 2
    gid, pos = head_to_group(groups, 3)
    assert gid.tolist() == [[1, 1, 0], [0, 1, 1]]
    assert pos.tolist() == [[0, 1, 0], [0, 1, 0]]
    assert group_heads(b, 1) == [[[2], [0], [1]], [[0], [2], [1]]]
    assert group_heads(b, 3) == [[[2, 0, 1]], [[0, 2, 1]]]


def test_short_group_takes_the_lowest_budgets():
    b = np.array([[0.2, 0.9, 1.0]])
    groups = group_heads(b, 2)
    assert groups == [[[0], [1, 2]]]
    np.testing.assert_allclose(group_budgets(b, groups), [[0.2, 1.0]])
    b8 = np.arange(8, dtype=float)[None] / 10  # H = 8, H_p = 3: sizes 2, 3, 3
    assert group_heads(b8[:, ::-1], 3) == [[[7, 6], [5, 4, 3], [2, 1, 0]]]


def test_budget_aware_never_reserves_more_than_adjacent_here():
    b = np.array([[0.9, 0.1, 0.8, 0.2], [0.1, 0.9, 0.2, 0.8]])
    size = lambda s: (group_budgets(b, group_heads(b, 2, s)) * 2).sum()  # noqa: E731
    assert size("budget_aware") == pytest.approx(2 * (0.2 + 0.9 + 0.2 + 0.9))
    assert size("adjacent") == pytest.approx(2 * (0.9 + 0.8 + 0.9 + 0.8))


def test_bad_arguments():
    with pytest.raises(ValueError, match="strategy"):
        group_heads(DOC, 2, "random")
    with pytest.raises(ValueError, match="heads_per_group"):
        group_heads(DOC, 5)
    with pytest.raises(ValueError, match="heads_per_group"):
        group_heads(DOC, 0)
