"""A prefill pass holding several compression chunks per request (TangramServing.extend_waves) plans,
wave by wave, exactly what one chunk per pass plans (extend_metadata, the path before it): the same
tables up to the slots each wave reads, the same write slots, keep counts, protected runs and
compression sizes, on random batches of random prompts. Two pools driven alike; integrity after
every pass."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tangram_sglang.method.protection import Protection
from tangram_sglang.pool.spec import PoolError
from tangram_sglang.serving.context import LoadedProfile
from tangram_sglang.serving.runtime import TangramServing
from tangram_sglang.serving.testing import HKV, HQ, NUM_LAYERS, D

PROFILE = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs" / "smollm2-snapkv.yaml"
CHUNK = 24


def _serving() -> TangramServing:
    shape = SimpleNamespace(num_hidden_layers=NUM_LAYERS, num_attention_heads=HQ, num_key_value_heads=HKV,
                            hidden_size=HQ * D, architectures=["LlamaForCausalLM"])
    return TangramServing.build(LoadedProfile.load(str(PROFILE), 0.25), shape, stock_tokens=3000,
                                dtype=torch.float32, device="cpu", page_size=16, num_q_heads=HQ,
                                data_plane="torch", chunk=CHUNK, protection=Protection(sinks=2, newest=6))


def _admit(servings, rid: str, row: int, tokens: int) -> None:
    for s in servings:
        assert s.admit(rid, prefix_chain=[], prefix_tokens=0, node=None, tokens=np.zeros(tokens, np.int64),
                       decode_tokens=4)
        s.bind_row(rid, row)


def _assert_same_plan(got, want) -> None:
    P = 16
    assert torch.equal(got.seq_lens, want.seq_lens) and torch.equal(got.keep, want.keep)
    assert got.protect == want.protect
    used = (want.seq_lens.to(torch.int64) + P - 1) // P                        # [L, B, G] columns read
    cols = torch.arange(want.block_table.shape[-1])
    mask = cols[None, None, None, :] < used[..., None]
    width = want.block_table.shape[-1]
    assert torch.equal(got.block_table[..., :width][mask], want.block_table[mask])
    assert int((used > got.block_table.shape[-1]).sum()) == 0
    for a, b in zip(got.out_loc, want.out_loc):
        assert torch.equal(a, b)
    for a, b in zip(got.chunks, want.chunks):
        assert a.cu == b.cu and a.n_max == b.n_max and a.kmax == b.kmax and torch.equal(a.take, b.take)
    for a, b in zip(got.states, want.states):
        assert len(a) == len(b)


@pytest.mark.parametrize("seed", range(4))
def test_a_pass_of_several_chunks_plans_what_one_chunk_per_pass_plans(seed):
    rng = np.random.default_rng(seed)
    many, one = _serving(), _serving()
    lens = {f"r{i}": int(rng.integers(1, 6 * CHUNK)) for i in range(6)}
    for row, (rid, n) in enumerate(lens.items()):
        _admit((many, one), rid, row, n)
    passes = 0
    while live := [r for r in lens if not many.cache.requests[r].prefill_done]:
        rids = [r for r in live if rng.random() < 0.7] or live[:1]
        chunks = []   # per request: the planned chunks this pass covers
        for rid in rids:
            req = many.cache.requests[rid]
            planned = req.plan.chunk_tokens[len(req.chunk_ends):]
            chunks.append(list(planned[: int(rng.integers(1, len(planned) + 1))]))
        ext = [sum(c) for c in chunks]
        starts = np.concatenate([[0], np.cumsum(ext)])
        waves = many.extend_waves(rids, ext)
        assert len(waves) == max(len(c) for c in chunks)
        for w, wave in enumerate(waves):
            members = [i for i, c in enumerate(chunks) if len(c) > w]
            assert wave.sizes == [chunks[i][w] for i in members]
            _assert_same_plan(wave.plan, one.extend_metadata([rids[i] for i in members], wave.sizes))
            if len(waves) == 1:
                assert wave.tokens is None   # the whole batch: no gather
            else:   # the wave's rows: each member's w-th chunk within its extend
                expect = np.concatenate([np.arange(chunks[i][w]) + starts[i] + sum(chunks[i][:w]) for i in members])
                assert np.array_equal(wave.tokens.numpy(), expect)
        many.cache.check_integrity()
        one.cache.check_integrity()
        passes += 1
    assert many.counters.prefill_chunks == one.counters.prefill_chunks
    assert many.counters.prefill_passes == passes


def test_an_extend_that_is_not_a_run_of_planned_chunks_is_refused():
    serving = _serving()
    _admit((serving,), "a", 0, 3 * CHUNK + 5)
    with pytest.raises(PoolError, match="not a run of its planned chunks"):
        serving.extend_waves(["a"], [CHUNK + 3])
    assert serving.planned_extend("a", 10) == CHUNK                 # never less than one chunk
    assert serving.planned_extend("a", 2 * CHUNK + 4) == 2 * CHUNK
    assert serving.planned_extend("a", 10 * CHUNK) == 3 * CHUNK + 5
    assert serving.planned_extend("a") == CHUNK                     # no limit: one chunk
    waves = serving.extend_waves(["a"], [2 * CHUNK])
    assert [w.sizes for w in waves] == [[CHUNK], [CHUNK]]
    assert serving.planned_extend("a", 10 * CHUNK) == CHUNK + 5
    serving.cache.check_integrity()
