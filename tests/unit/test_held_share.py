"""The KV a served conversation holds, from the server's own control plane (benchmarks/fidelity/held.py)."""

import pytest

from benchmarks.fidelity.held import held_share
from tangram_sglang.method.chunks import Markers
from tangram_sglang.method.protection import Protection
from tangram_sglang.profile import ModelShape
from tangram_sglang.profile.uniform import uniform_profile

START = 10**6   # a message start id no prompt token equals
SHAPE = ModelShape(architecture="LlamaForCausalLM", num_layers=2, num_kv_heads=2, head_dim=16)


def _turns(*lengths):
    """Prompts of these lengths, each extending the one before (no chat markers: one message)."""
    return [list(range(n)) for n in lengths]


def test_a_lossless_profile_holds_exactly_full_kv_on_page_boundaries():
    profile = uniform_profile(SHAPE, [1.0], parallel_capacity=4)
    assert held_share(profile, 1.0, _turns(32, 64), 1, chunk=32) == pytest.approx(1.0)   # 64 tokens, 4 pages per group
    assert held_share(profile, 1.0, _turns(30, 64), 3, chunk=32) > 1.0                     # 66 tokens: a partial page


def test_compression_holds_the_ratio_plus_protection_and_pages():
    profile = uniform_profile(SHAPE, [0.5, 0.25], parallel_capacity=4)
    turns = _turns(600, 1200, 1800)
    half, quarter = (held_share(profile, r, turns, 20, chunk=128) for r in (0.5, 0.25))
    assert 0.5 < half < 0.6 and 0.25 < quarter < 0.35 and quarter < half
    bare = held_share(profile, 0.25, turns, 20, chunk=128, protection=Protection(0, 0))
    # one open message (no chat markers): only its sinks are protected (within the budget), its tail kept whole
    assert bare == pytest.approx(quarter)
    marked = [[START] + t[1:] for t in turns]   # a start token (not followed by another: one open message still)
    assert held_share(profile, 0.25, marked, 20, chunk=128, markers=Markers(start_ids=(START,))) == pytest.approx(quarter)
    closed = [t[:-1] + [START] for t in turns]  # every turn closes its message: its newest tokens protected
    assert held_share(profile, 0.25, closed, 20, chunk=128, markers=Markers(start_ids=(START,))) > quarter


def test_window_layers_hold_about_their_window_once_the_tree_drops_interior_pages():
    shape = ModelShape(architecture="Gemma3ForCausalLM", num_layers=2, num_kv_heads=1, head_dim=16, window=64,
                       window_layers=(0,))
    profile = uniform_profile(shape, [1.0], parallel_capacity=4)
    # chunks of half a window: an interior node drops up to the next match end below it, past dropped children
    for chunk in (32, 64):
        short, long = (held_share(profile, 1.0, _turns(n), 1, chunk=chunk) for n in (128, 1024))
        assert long < short < 1.0
        assert long == pytest.approx((1024 + 64) / 2048, abs=0.03)  # the full layer + the window layer's window


def test_compressed_replies_hold_less_than_whole_ones():
    """A chat whose replies are long: kept whole (the assistant's role among the markers) they hold about
    full KV; compressed once closed (markers without it: --tangram-replies compressed) about the ratio."""
    profile = uniform_profile(SHAPE, [0.25], parallel_capacity=4)
    role = START + 1
    turn, prompt = [], []
    for _ in range(3):   # a 40-token user message, then the assistant's 400-token reply
        prompt = prompt + [START] + list(range(40)) + [START, role] + list(range(400))
        turn.append(prompt[:-400])   # each turn's prompt ends with the assistant's header (its reply to come)
    turn.append(prompt + [START] + list(range(40)) + [START, role])
    whole = held_share(profile, 0.25, turn, 1, chunk=128, markers=Markers((START,), ((role,),)))
    compressed = held_share(profile, 0.25, turn, 1, chunk=128, markers=Markers((START,)))
    assert whole > 0.8 and compressed < 0.45
