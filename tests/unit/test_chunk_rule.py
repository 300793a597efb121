"""The chunk rule (method/chunks.py): a function of the tokens alone, cut at message starts."""

import random

import numpy as np
import pytest

from tangram_sglang.method.chunks import Markers, cut_tokens, reusable_prefix
from tangram_sglang.method.protection import Protection

S, A = 90, 91                      # a message start token and the assistant's role token
MARKERS = Markers(start_ids=(S,), assistant=((A,),))


def _chunks(cut):
    return list(zip(cut.starts.tolist(), cut.ends.tolist(), cut.lead.tolist(), cut.trail.tolist(), cut.full.tolist()))


def test_the_docstring_example():
    tokens = [S, 1, 1, 1, 1, 1, S, A, 2, 2, S, 1, 1]
    cut = cut_tokens(tokens, 4, Protection(sinks=1, newest=1), MARKERS)
    assert _chunks(cut) == [(0, 4, 1, 0, False), (4, 6, 0, 1, False), (6, 10, 0, 4, True), (10, 13, 0, 3, True)]


def test_without_markers_chunks_align_to_the_sequence_and_the_open_tail_is_kept_whole():
    cut = cut_tokens(np.arange(10), 4, Protection(sinks=2, newest=3))
    assert _chunks(cut) == [(0, 4, 2, 0, False), (4, 8, 0, 0, False), (8, 10, 0, 2, True)]
    cut = cut_tokens(np.arange(8), 4, Protection(sinks=2, newest=3))   # ends on a boundary: nothing open
    assert _chunks(cut) == [(0, 4, 2, 0, False), (4, 8, 0, 0, False)]
    assert _chunks(cut_tokens([], 4, Protection())) == []


def test_a_closed_message_is_compressed_whole_with_its_newest_tokens_protected():
    tokens = [S] + [1] * 9 + [S, A, 2, 2, 2, 2, 2, 2, 2] + [S, 3]
    cut = cut_tokens(tokens, 4, Protection(sinks=0, newest=3), MARKERS)
    # the user's message [0, 10): its newest run [7, 10) protected, so [8, 10) is kept whole; the
    # assistant's [10, 19) whole; the open message [19, 21) whole
    assert _chunks(cut) == [(0, 4, 0, 0, False), (4, 8, 0, 1, False), (8, 10, 0, 2, True),
                            (10, 14, 0, 4, True), (14, 18, 0, 4, True), (18, 19, 0, 1, True), (19, 21, 0, 2, True)]


def test_after_starts_at_a_chunk_or_inside_a_full_one():
    tokens = [S] + [1] * 9 + [S, A, 2, 2, 2, 2]
    cut = cut_tokens(tokens, 4, Protection(sinks=1, newest=2), MARKERS)
    assert cut.after(0)[0] == [4, 4, 2, 4, 2]
    assert cut.after(12) == ([2, 2], [(0, 2), (0, 2)])     # inside the assistant's full chunk [10, 14)
    with pytest.raises(ValueError, match="inside the compressed chunk"):
        cut.after(5)
    assert cut.after(len(tokens)) == ([], [])


def _conversation(rng, turns: int, system=None) -> list[int]:
    out = list(system or [])
    for _ in range(turns):
        out += [S] + [rng.randrange(20) for _ in range(rng.randint(1, 30))]
        out += [S, A] + [rng.randrange(20) for _ in range(rng.randint(0, 12))]
    return out


@pytest.mark.parametrize("markers", [MARKERS, None])
def test_every_prefix_reuses_what_the_whole_sequence_keeps(markers):
    """The kept state is a function of the tokens: what a shorter sequence kept and a longer one may reuse
    (reusable_prefix, the tree's match) is cut exactly as the longer one cuts it, and the longer one's
    chunks continue from there."""
    rng = random.Random(0)
    prot = Protection(sinks=2, newest=5)
    for _ in range(300):
        seq = _conversation(rng, rng.randint(1, 5), system=[S] + [7] * rng.randint(0, 20))
        whole = cut_tokens(seq, 8, prot, markers)
        p = rng.randint(1, len(seq))
        part = cut_tokens(seq[:p], 8, prot, markers)
        r = reusable_prefix(part, whole, p)
        assert 0 <= r <= p
        for c in _chunks(part):
            if c[1] <= r and not c[4]:
                assert c in _chunks(whole)           # a reused compressed chunk: the same chunk, the same protection
        sizes, _ = whole.after(r)                     # never raises: r ends where the longer cut may continue
        assert r + sum(sizes) == len(seq)
        if markers is None and p // 8 == len(seq) // 8:
            assert r == p                             # nothing completed the open chunk: all of it is reused


def test_a_shared_system_prompt_is_cut_alike_in_every_conversation():
    rng = random.Random(1)
    system = [S] + [5] * 23                          # 24 tokens: not a multiple of the chunk
    cuts = [cut_tokens(_conversation(rng, 2, system), 8, Protection(), MARKERS) for _ in range(4)]
    heads = {tuple(c for c in _chunks(cut) if c[1] <= 24) for cut in cuts}
    assert len(heads) == 1 and max(c[1] for c in next(iter(heads))) == 24


def test_an_open_tail_is_reused_until_its_chunk_completes_or_closes():
    prot = Protection(sinks=0, newest=0)
    first = cut_tokens([1] * 10, 4, prot)                       # [0,4) [4,8) compressed, [8,10) whole
    assert reusable_prefix(first, cut_tokens([1] * 11, 4, prot), 10) == 10   # still open: all reused
    assert reusable_prefix(first, cut_tokens([1] * 13, 4, prot), 10) == 8    # [8,12) completed: recomputed
    closed = cut_tokens([S] + [1] * 9 + [S, 2], 4, prot, MARKERS)
    assert reusable_prefix(cut_tokens([S] + [1] * 9, 4, prot, MARKERS), closed, 10) == 8   # closed: [8,10) compressed
