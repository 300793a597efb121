"""Every scorer on a small hand-computed case, plus the shared contract."""

import math

import pytest
import torch

from tangram_sglang.scorers import (
    ExpectedAttentionScorer,
    KeyDiffScorer,
    KeyNormScorer,
    ScorerState,
    SnapKVScorer,
    StreamingLLMScorer,
    UniformScorer,
    get_scorer,
    scorer_names,
)


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [x / sum(e) for x in e]


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ---- contract, for all scorers ---------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in scorer_names() if n not in ("fastkvzip", "kvzip")])  # own tests
@pytest.mark.parametrize("n,hq,h", [(17, 6, 2), (1, 3, 3), (54, 4, 1)])
def test_contract(name, n, hq, h):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(n, hq, 8, generator=g), torch.randn(n, h, 8, generator=g),
               torch.randn(n, h, 8, generator=g))
    copies = [x.clone() for x in (q, k, v)]
    state = ScorerState()
    scores = get_scorer(name).score(q, k, v, state)
    assert scores.shape == (h, n) and scores.dtype == torch.float32
    assert torch.isfinite(scores).all()
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), copies))
    assert state.tokens_seen == n
    get_scorer(name).score(q, k, v, state)
    assert state.tokens_seen == 2 * n


def test_registry():
    assert set(scorer_names()) == {"snapkv", "expected_attention", "keydiff", "key_norm", "streaming_llm",
                                   "uniform", "fastkvzip", "kvzip"}
    assert isinstance(get_scorer("ea"), ExpectedAttentionScorer)
    assert get_scorer("snapkv", window=8).window == 8
    with pytest.raises(ValueError, match="known scorers: snapkv"):
        get_scorer("h2o")
    with pytest.raises(ValueError, match="bad options"):
        get_scorer("snapkv", windw=8)
    with pytest.raises(ValueError, match="window"):
        SnapKVScorer(window=0)


def test_shape_errors():
    with pytest.raises(ValueError, match="multiple"):
        UniformScorer().score(torch.zeros(3, 5, 2), torch.zeros(3, 2, 2), torch.zeros(3, 2, 2))
    with pytest.raises(ValueError, match="do not agree"):
        UniformScorer().score(torch.zeros(3, 2, 2), torch.zeros(4, 2, 2), torch.zeros(4, 2, 2))


# ---- SnapKV -----------------------------------------------------------------------------------

def snap_case():
    # n = 4, one KV head, two query heads (GQA group 2), d = 2.
    q = t([[[0, 0], [0, 0]], [[0, 0], [0, 0]], [[0, 0], [0, 0]], [[1, 0], [0, 2]]])
    k = t([[[0, 0]], [[1, 0]], [[2, 1]], [[0, 1]]])
    return q, k, torch.zeros(4, 1, 2)


def test_snapkv_window_one_by_hand():
    q, k, v = snap_case()
    s = SnapKVScorer(window=1, kernel=1).score(q, k, v)
    r2 = math.sqrt(2)
    p_a = softmax([0, 1 / r2, 2 / r2, 0])  # query head 0: q = (1, 0)
    p_b = softmax([0, 0, 2 / r2, 2 / r2])  # query head 1: q = (0, 2)
    want = [p_a[i] + p_b[i] for i in range(4)]
    want[3] += 3.0  # window token: offset group + 1
    torch.testing.assert_close(s[0], torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_snapkv_pooling_and_causal_window():
    q, k, v = snap_case()
    s = SnapKVScorer(window=2, kernel=3).score(q, k, v)
    r2 = math.sqrt(2)
    # window = tokens 2, 3. Query 2 is all zeros and sees keys 0..2 only (causal).
    p2 = softmax([0, 0, 0]) + [0.0]
    p_a, p_b = softmax([0, 1 / r2, 2 / r2, 0]), softmax([0, 0, 2 / r2, 2 / r2])
    raw = [(p2[i] + p_a[i]) / 2 + (p2[i] + p_b[i]) / 2 for i in range(4)]
    # avg pooling (kernel 3, padding not counted) over the non-window tokens 0, 1
    pooled = [(raw[0] + raw[1]) / 2, (raw[0] + raw[1]) / 2]
    want = pooled + [raw[2] + 3.0, raw[3] + 3.0]
    torch.testing.assert_close(s[0], torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_snapkv_window_clamped_and_gqa_mapping():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 4, 4, generator=g), torch.randn(3, 2, 4, generator=g)
    s = SnapKVScorer(window=32).score(q, k, torch.zeros(3, 2, 4))
    assert (s >= 2.0 + 1.0).all()  # n < window: every token is in the window (offset 2 + 1)
    q2 = q.clone()
    q2[:, 2:] = torch.randn(3, 2, 4, generator=g)  # change only KV head 1's query heads
    s2 = SnapKVScorer(window=32).score(q2, k, torch.zeros(3, 2, 4))
    torch.testing.assert_close(s2[0], s[0])
    assert not torch.allclose(s2[1], s[1])


# ---- Expected Attention -------------------------------------------------------------------------

def test_expected_attention_by_hand():
    # One head, d = 2; queries (1, 0), (3, 0) -> mu = (2, 0), Sigma = diag(1, 0).
    q = t([[[1, 0]], [[3, 0]]])
    k = t([[[1, 0]], [[0, 1]]])
    v = t([[[3, 4]], [[0, 1]]])
    sc = ExpectedAttentionScorer(n_sink=0, use_vnorm=False)
    z = [2 / math.sqrt(2) + 1 / 4, 0.0]  # mu.k / sqrt(d) + k^T Sigma k / (2 d)
    torch.testing.assert_close(sc.score(q, k, v), torch.tensor([softmax(z)]), rtol=1e-5, atol=1e-6)
    with_v = ExpectedAttentionScorer(n_sink=0).score(q, k, v)
    torch.testing.assert_close(with_v, torch.tensor([[softmax(z)[0] * 5.0, softmax(z)[1] * 1.0]]),
                               rtol=1e-5, atol=1e-6)
    mean_only = ExpectedAttentionScorer(n_sink=0, use_vnorm=False, use_covariance=False).score(q, k, v)
    torch.testing.assert_close(mean_only, torch.tensor([softmax([2 / math.sqrt(2), 0.0])]), rtol=1e-5, atol=1e-6)


def test_expected_attention_statistics_run_across_chunks_and_skip_sinks():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(12, 4, 8, generator=g), torch.randn(12, 2, 8, generator=g), torch.randn(12, 2, 8, generator=g)
    sc = ExpectedAttentionScorer(n_sink=3)
    state = ScorerState()
    sc.score(q[:7], k[:7], v[:7], state)
    chunked = sc.score(q[7:], k[7:], v[7:], state)
    # one chunk-less reference: statistics of queries 3..11, scores of tokens 7..11
    ref_state = ScorerState(tokens_seen=3)
    ExpectedAttentionScorer(n_sink=0).score(q[3:7], k[3:7], v[3:7], ref_state)
    ref = ExpectedAttentionScorer(n_sink=0).score(q[7:], k[7:], v[7:], ref_state)
    torch.testing.assert_close(chunked, ref, rtol=1e-5, atol=1e-6)
    first = sc.score(q[:5], k[:5], v[:5], ScorerState())
    assert (first[:, :3] > first[:, 3:].max()).all()  # sinks score above all


# ---- KeyDiff, key norm, StreamingLLM, uniform ------------------------------------------------------

def test_keydiff_by_hand_and_running_anchor():
    k = t([[[1, 0]], [[0, 2]], [[3, 0]]])
    s = KeyDiffScorer().score(torch.zeros(3, 1, 2), k, torch.zeros(3, 1, 2))
    # unit keys (1,0), (0,1), (1,0): anchor direction (2, 1) / sqrt(5)
    want = [-2 / math.sqrt(5), -1 / math.sqrt(5), -2 / math.sqrt(5)]
    torch.testing.assert_close(s[0], torch.tensor(want))
    state = ScorerState()
    KeyDiffScorer().score(torch.zeros(2, 1, 2), k[:2], torch.zeros(2, 1, 2), state)
    later = KeyDiffScorer().score(torch.zeros(1, 1, 2), k[2:], torch.zeros(1, 1, 2), state)
    torch.testing.assert_close(later[0], torch.tensor(want[2:]))  # anchor over all 3 keys


def test_key_norm():
    s = KeyNormScorer().score(torch.zeros(2, 2, 2), t([[[3, 4], [0, 1]], [[0, 0], [1, 0]]]), torch.zeros(2, 2, 2))
    torch.testing.assert_close(s, t([[-5, 0], [-1, -1]]))


def test_streaming_llm_sinks_then_recency():
    sc, state = StreamingLLMScorer(n_sink=2), ScorerState()
    s = sc.score(torch.zeros(5, 2, 2), torch.zeros(5, 1, 2), torch.zeros(5, 1, 2), state)
    torch.testing.assert_close(s[0], t([6, 6, 3, 4, 5]))
    assert sorted(torch.topk(s[0], 3).indices.tolist()) == [0, 1, 4]
    s2 = sc.score(torch.zeros(3, 2, 2), torch.zeros(3, 1, 2), torch.zeros(3, 1, 2), state)
    torch.testing.assert_close(s2[0], t([6, 7, 8]))  # positions 5, 6, 7: no sinks left


def test_uniform_spreads_the_global_budget_evenly():
    from tangram_sglang.scorers.selection import global_topk_counts, per_head_topk_indices

    s = UniformScorer().score(torch.zeros(10, 3, 2), torch.zeros(10, 3, 2), torch.zeros(10, 3, 2))
    assert torch.equal(s, torch.zeros(3, 10))
    assert global_topk_counts(s, 0.5).tolist() == [5, 5, 5]
    assert per_head_topk_indices(s, 2)[1].tolist() == [9, 8]


def test_head_shard_keeps_a_ranks_rows_of_a_scorer_of_all_heads():
    """TP: a gate scorer rates all H heads from the replicated hidden states; a rank keeps its own."""
    from tangram_sglang.scorers.base import HeadShard, Scorer

    class PerLayer(Scorer):
        name, needs_hidden = "fake", True

        def __init__(self, layer=0):
            self.layer = layer

        def for_layer(self, layer):
            return PerLayer(layer)

        def score(self, q, k, v, state=None, hidden=None):
            return hidden.T[:4] + 100 * self.layer    # [H=4, n] from the hidden states

    hidden = torch.arange(12.0).view(3, 4)             # n = 3 tokens, D = 4
    k = torch.zeros(3, 2, 8)                           # the rank's 2 KV heads
    shard = HeadShard(PerLayer(), [2, 3]).for_layer(1)
    assert shard.needs_hidden and shard.name == "fake"
    torch.testing.assert_close(shard.score(None, k, k, None, hidden=hidden), hidden.T[2:4] + 100)
