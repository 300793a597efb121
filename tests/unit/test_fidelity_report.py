"""The fidelity report's paired comparisons: which rows it pairs, what it counts, the sign test."""

from benchmarks.common.report_tables import KVPRESS_PEER
from benchmarks.fidelity.paired import PEER, comparisons, paired, paired_lines, sign_test


def _row(setting, ratio, kept, outcomes, method="snapkv"):
    return dict(model="m", setting=setting, ratio=ratio, kept_share=kept, method=method, outcomes=outcomes)


def test_sign_test_is_the_exact_binomial_tail():
    assert sign_test(0, 0) == 1.0
    assert sign_test(6, 0) == 2 / 64
    assert sign_test(5, 1) == 2 * (1 + 6) / 64
    assert sign_test(1, 5) == sign_test(5, 1)
    assert sign_test(3, 3) == 1.0


def test_paired_counts_only_conversations_both_judged():
    a = _row("tangram", 0.5, 0.6, {"c1": [True, False], "c2": [True, True], "c3": [None, False], "c4": [False, False]})
    b = _row("dynamic", 0.5, 0.5, {"c1": [False, False], "c2": [True, False], "c3": [True, True]})
    assert paired(a, b, 0) == (2, 1, 1, 0, 2)          # c3 unjudged for A, c4 missing in B
    assert paired(a, b, 1) == (1, 1, 1, 1, 3)          # degenerate: judged everywhere both ran


def test_comparisons_pair_same_ratio_and_nearest_kvpress_kept_share():
    oc = {"c1": [True, False]}
    rows = [_row("tangram[fastkvzip]", 0.25, 0.32, oc, "fastkvzip"), _row("dynamic[fastkvzip]", 0.25, 0.3, oc),
            _row("dynamic[fastkvzip]", 0.5, 0.5, oc), _row("dynamic[fastkvzip]", 0.33, 0.33, oc),
            _row("uniform[fastkvzip]", 0.25, 0.35, oc),
            _row("kvpress-kvzip", 0.25, 0.25, oc), _row("kvpress-kvzip", 0.32, 0.32, oc),
            _row("kvpress-snapkv", 0.32, 0.32, oc)]
    got = [(b["setting"], b["ratio"], field) for _, b, _, field in comparisons(rows)]
    assert got == [("dynamic[fastkvzip]", 0.25, 0), ("uniform[fastkvzip]", 0.25, 0), ("dynamic[fastkvzip]", 0.33, 0),
                   ("kvpress-kvzip", 0.32, 0), ("kvpress-kvzip", 0.32, 1)]
    lines = paired_lines(rows)
    assert len(lines) == 5 + 5 and lines[5].endswith("| right | 1/1 | 1/1 | 0 / 0 | 1.00 |")
    assert "| within 2 points at equal KV | right |" in lines[7] and "(32% kept)" in lines[7]
    assert "| not below at equal KV | right |" in lines[8]
    assert lines[-1].endswith("| degenerate | 0/1 | 0/1 | 0 / 0 | 1.00 |")


def test_comparisons_at_equal_kv_use_the_held_share_where_measured():
    """Tangram keeps 32% of the history but its pool holds 40% of full KV: the dynamic method and kvpress
    are paired at 40% (equal measured bytes), not at the kept share."""
    oc = {"c1": [True, False]}
    served = dict(_row("tangram[fastkvzip]", 0.25, 0.32, oc, "fastkvzip"), held_share=0.4)
    rows = [served, _row("dynamic[fastkvzip]", 0.27, 0.32, oc), _row("dynamic[fastkvzip]", 0.38, 0.395, oc),
            _row("kvpress-kvzip", 0.32, 0.32, oc), _row("kvpress-kvzip", 0.4, 0.4, oc)]
    got = [(b["ratio"], want) for _, b, want, _ in comparisons(rows)]
    assert got == [(0.38, "within 2 points at equal KV held"), (0.4, "not below at equal KV held"),
                   (0.4, "degenerate no more often")]
    assert "(32% kept, 40% held)" in paired_lines(rows)[5]


def test_readme_row_pairs_the_same_kvpress_setting_as_the_report():
    """report_tables (standard library only, loaded by path) keeps its own copy of the peer map."""
    assert KVPRESS_PEER == PEER
