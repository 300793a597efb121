"""Budgets b = min(1, mu + alpha * sigma) and keep counts, by hand."""

import numpy as np
import pytest

from tangram_sglang.method.budgets import MIN_BUDGET, budgets_from_stats, keep_count


def test_mu_plus_alpha_sigma_clipped_to_one():
    mean = np.array([[0.2, 0.5, 0.9], [0.0, 0.25, 0.4]])
    std = np.array([[0.1, 0.3, 0.0], [0.0, 0.05, 0.2]])
    want = np.array([[0.4, 1.0, 0.9], [MIN_BUDGET, 0.35, 0.8]])  # 0.5 + 0.6 -> 1; 0 -> floor
    np.testing.assert_allclose(budgets_from_stats(mean, std, 2.0), want)
    np.testing.assert_allclose(budgets_from_stats(mean, std, 0.0), np.maximum(mean, MIN_BUDGET))
    np.testing.assert_allclose(budgets_from_stats([[0.3]], [[0.1]], 1.0), [[0.4]])


def test_negative_alpha_raises():
    with pytest.raises(ValueError, match="alpha"):
        budgets_from_stats([[0.3]], [[0.1]], -1.0)


def test_keep_count_is_exact_ceil():
    assert keep_count(0.5, 10).tolist() == 5
    assert keep_count(0.7, 30).tolist() == 21  # 0.7 * 30 = 21.000000000000004
    assert keep_count(0.34, 10).tolist() == 4
    assert keep_count(MIN_BUDGET, 10).tolist() == 1  # every head keeps at least one slot
    assert keep_count(np.array([0.25, 1.0]), 7).tolist() == [2, 7]
    assert keep_count(1.0, 0).tolist() == 0
