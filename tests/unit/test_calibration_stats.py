"""Calibration statistics and the regularity figures, by hand."""

import math

import numpy as np
import pytest

from tangram_sglang.calibration.pilot import SampleRetention
from tangram_sglang.calibration.report import markdown, regularity_report
from tangram_sglang.calibration import stats

# 3 samples, 1 layer, 2 heads at rho 0.5
RET = np.array([[[0.2, 0.8]], [[0.4, 0.6]], [[0.3, 0.7]]])


def test_ratio_stats_by_hand():
    st = stats.ratio_stats(RET, 0.5, alpha=2.0)
    np.testing.assert_allclose(st.mean, [[0.3, 0.7]])
    sigma = math.sqrt(0.02 / 3)  # population std of (0.2, 0.4, 0.3)
    np.testing.assert_allclose(st.std, [[sigma, sigma]])
    np.testing.assert_allclose(st.budgets, [[0.3 + 2 * sigma, min(1.0, 0.7 + 2 * sigma)]])
    with pytest.raises(ValueError, match="retention"):
        stats.ratio_stats(np.zeros((0, 1, 2)), 0.5, 2.0)


def test_spearman_cases():
    assert stats.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert stats.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert stats.spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))
    x = np.array([[1, 2, 3], [0.5, 0.5, 0.5], [3, 2, 1]])
    y = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    out = stats.layer_spearman(x, y)
    assert out == {"mean": 0.0, "min": -1.0, "layers": 2, "layers_skipped": 1, "share_perfect": 0.5}


def test_per_sample_spearman_and_coverage():
    b = np.array([[0.5, 0.9]])
    out = stats.per_sample_spearman(RET, b)
    assert out["mean"] == 1.0 and out["pairs"] == 3
    cov = stats.coverage(RET, np.array([[0.35, 0.9]]))
    # 0.4 > 0.35 is the only miss of 6 cases, by 0.05
    assert cov["share_covered"] == pytest.approx(5 / 6, abs=1e-4)
    assert cov["mean_overflow"] == pytest.approx(0.05 / 6, abs=1e-4)
    assert cov["max_overflow"] == pytest.approx(0.05, abs=1e-4)


def test_budget_spend_and_grouping_reserve():
    st = stats.ratio_stats(RET, 0.5, alpha=0.0)  # b = mu = [0.3, 0.7]: sum 1.0 = rho * H
    assert stats.budget_spend(st)["mean"] == pytest.approx(1.0)
    b = np.array([[0.9, 0.1, 0.8, 0.2]])
    # H_p 2: budget-aware groups {1,3} {2,0} -> 2*0.2 + 2*0.9 = 2.2 / 4; adjacent 2*0.9 + 2*0.8 = 3.4 / 4
    assert stats.reserved_fraction(b, 2, "budget_aware") == pytest.approx(0.55)
    assert stats.reserved_fraction(b, 2, "adjacent") == pytest.approx(0.85)
    rows = stats.grouping_comparison(b)
    assert rows[0] == {"heads_per_group": 1, "budget_aware": 0.5, "adjacent": 0.5}
    # H_p 3: budget-aware {1} {3,2,0} -> 3 * (0.1 + 0.9) / 4; adjacent {0,1,2} {3} -> 3 * (0.9 + 0.2) / 4
    assert rows[2] == {"heads_per_group": 3, "budget_aware": 0.75, "adjacent": 0.825}
    assert rows[3] == {"heads_per_group": 4, "budget_aware": 0.9, "adjacent": 0.9}


def test_across_sources_and_report():
    ret = np.array([[[0.1, 0.5, 0.9]], [[0.2, 0.4, 0.9]], [[0.9, 0.5, 0.1]]])
    out = stats.across_sources(ret, ["a", "b", "c"])
    assert out["pairs"]["a~b"]["mean"] == pytest.approx(1.0)
    assert out["pairs"]["a~c"]["mean"] == pytest.approx(-1.0)
    cal = [SampleRetention("a", "x", 10, r[None]) for r in RET]
    held = [SampleRetention("b", "x", 10, np.array([[[0.25, 0.75]]]))]
    rep = regularity_report(cal, held, (0.5,), 2.0, {"model": "m", "method": "snapkv"})
    r = rep["ratios"][0]
    assert r["heldout"]["coverage"]["share_covered"] == 1.0
    assert r["heldout"]["rank_layer_means"]["mean"] == 1.0
    assert rep["samples"]["calibration"]["by_source"] == {"a": 3}
    assert "| 0.5 |" in markdown(rep)


def test_reference_regularity_two_fold_by_hand():
    from tangram_sglang.calibration.reference_regularity import sample_sources, two_fold

    assert sample_sources({"dataset_mix": "scbench_kv:2,scbench_many_shot:1"}, 3) == ["kv", "kv", "many_shot"]
    assert sample_sources({}, 2) == ["all", "all"]
    # 4 samples, one layer, heads ranked identically everywhere, no spread -> perfect ranks, full coverage
    raw = np.array([[[0.1, 0.2, 0.3]]] * 4)
    out = two_fold(raw, ["a", "a", "b", "b"], alpha=2.0)
    assert out["rank_layer_means"] == 1.0 and out["rank_per_sample"] == 1.0
    assert out["coverage"] == 1.0 and out["across_sources"] == 1.0 and out["samples"] == 4


def test_spearman_agrees_with_scipy_on_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 4, 9), rng.integers(0, 5, 9)
        if np.ptp(a) and np.ptp(b):
            assert stats.spearman(a, b) == pytest.approx(scipy_stats.spearmanr(a, b).statistic)
