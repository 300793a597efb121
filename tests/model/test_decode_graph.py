"""CUDA-graph decode in the Tangram backend, checked on CPU through the graph runner's protocol.

SGLang's DecodeCudaGraphRunner calls init_cuda_graph_state once, then per batch-size bucket
init_forward_metadata_out_graph(in_capture=True) and the forward (captured), and per replay
init_forward_metadata_out_graph on a view padded to the bucket, then replays the captured
kernels on the tensors they read at capture. Without a GPU nothing is captured, so these
tests check what replay relies on: every tensor forward_decode reads keeps its address from
capture to every replay of the bucket, padded entries read nothing and write only the scratch
page, and the real entries get exactly the eager backend's outputs and pool writes (two
servings driven identically, one eager, one through the graph protocol; Triton data plane,
under TRITON_INTERPRET=1).
"""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from tangram_sglang.pool.spec import PoolError
from tangram_sglang.serving.observability import check_integrity
from tangram_sglang.serving.testing import HKV, HQ, PROMPTS, STEPS, D, served_pool, step_inputs
from tangram_sglang.sglang.backend import TangramAttnBackend
from tangram_sglang.sglang.memory import TangramAllocator
from tangram_sglang.sglang.scheduling import hand_graph_batch

PROFILE = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "configs" / "smollm2-snapkv.yaml")
ROWS, CONTEXT = 16, 256
LAYERS = (17,)            # attention runs on this one (the Triton interpreter is slow); slots append on all
BUCKETS = (2, 4, 8)
NO_HOOK = 3               # this step runs without the runner hook: the backend reads the view's rows


def served(graph: bool, plane: str = "triton"):
    serving = served_pool(PROFILE, "cpu", data_plane=plane)
    alloc = TangramAllocator(1 << 16, dtype=torch.float32, device="cpu", kvcache=None, serving=serving)
    # model: no attention layers (nothing for the backend to check or route at start)
    runner = SimpleNamespace(token_to_kv_pool_allocator=alloc, device="cpu", model=torch.nn.Module(),
                             req_to_token_pool=SimpleNamespace(size=ROWS),
                             model_config=SimpleNamespace(context_len=CONTEXT))
    backend = TangramAttnBackend(runner)
    if graph:
        backend.init_cuda_graph_state(max(BUCKETS), max(BUCKETS))
    return serving, backend


def layer(lid):
    return SimpleNamespace(layer_id=lid, tp_q_head_num=HQ, tp_k_head_num=HKV, tp_v_head_num=HKV, qk_head_dim=D,
                           v_head_dim=D, scaling=D ** -0.5)


def qkv(bs, seed):
    return [t[0].reshape(bs, -1) for t in step_inputs(1, bs, seed, "cpu")]


def decode_batch(rids, bs=None, padding=0, serving=None):
    rows = [PROMPTS[r][0] for r in rids] + [0] * padding   # SGLang pads with row 0
    return SimpleNamespace(forward_mode=ForwardMode.DECODE, rids=rids, batch_size=bs or len(rids),
                           num_padding=padding, req_pool_indices=torch.tensor(rows, dtype=torch.int64))


def run_layers(backend, bs, seed):
    outs = []
    for lid in LAYERS:
        q, k, v = qkv(bs, seed + lid)
        outs.append(backend.forward_decode(q, k, v, layer(lid), None))
    return outs


def addresses(backend):
    plan = backend.plan
    return [plan.rows.data_ptr(), plan.block_table.data_ptr(), backend.serving.data.k_pages.data_ptr(),
            *(plan.seq_lens[l].data_ptr() for l in LAYERS), *(plan.out_loc[l].data_ptr() for l in LAYERS)]


def capture(backend):
    """Each bucket's capture: an all-padding batch through the forward; the addresses it read."""
    captured = {}
    before = backend.serving.data.k_pages[:-1].clone()
    for bs in BUCKETS:
        fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=bs, num_padding=0,
                             req_pool_indices=torch.zeros(bs, dtype=torch.int64))
        backend.init_forward_metadata_out_graph(fb, in_capture=True)
        for o in run_layers(backend, bs, seed=99):
            assert torch.equal(o, torch.zeros_like(o))   # padding reads nothing
        captured[bs] = addresses(backend)
    assert torch.equal(backend.serving.data.k_pages[:-1], before)   # and writes only the scratch page
    return captured


def check_pools(eager, graph):
    for s in (eager, graph):
        check_integrity(s, None)
        s.tables.check_scratch()
    n = eager.data.scratch_page
    assert torch.equal(eager.data.k_pages[:n], graph.data.k_pages[:n])
    assert torch.equal(eager.data.v_pages[:n], graph.data.v_pages[:n])


def test_graph_replay_matches_eager_decode():
    """Replays with padding give the eager outputs and pool writes, at the captured addresses; without
    the runner hook the backend maps the padded view's rows to requests itself."""
    (e_srv, eager), (g_srv, graph) = served(False), served(True)
    captured = capture(graph)
    for step, rids in enumerate(STEPS):
        for s in (e_srv, g_srv):
            assert s.admission.ensure_decode_room(rids)   # SGLang's capacity check
        eager.init_forward_metadata(decode_batch(rids))
        want = run_layers(eager, len(rids), seed=step)
        bs = min(b for b in BUCKETS if b >= len(rids))
        pad = bs - len(rids)
        if step != NO_HOOK:
            hand_graph_batch(SimpleNamespace(attn_backend=graph), decode_batch(rids))
        graph.init_forward_metadata_out_graph(decode_batch(rids, bs, pad), in_capture=False)
        assert addresses(graph) == captured[bs]
        got = []
        for lid in LAYERS:
            q, k, v = (torch.cat([t, torch.randn(pad, t.shape[1])]) for t in qkv(len(rids), step + lid))  # + padding
            got.append(graph.forward_decode(q, k, v, layer(lid), None))
        for w, g in zip(want, got):
            torch.testing.assert_close(g[: len(rids)], w, rtol=0, atol=0)
            assert torch.equal(g[len(rids):], torch.zeros_like(g[len(rids):]))
        check_pools(e_srv, g_srv)
    assert graph.graph_rids is None   # handed over once, consumed by the replay it was for


def test_frozen_tables_refuse_to_grow_and_name_graphs():
    serving, backend = served(True)
    tables = serving.tables
    shape = tuple(tables.pages.shape)
    assert shape[1] == ROWS + 2 and shape[3] == CONTEXT // 16 + 1   # SGLang rows + its padding row + scratch
    with pytest.raises(PoolError, match="frozen .* CUDA graphs"):
        tables.load([ROWS + 5], ["x"], [serving.cache.requests["a"].pages])
    with pytest.raises(PoolError, match="scratch row"):
        tables.load([tables.scratch_row], ["x"], [serving.cache.requests["a"].pages])
    assert tuple(tables.pages.shape) == shape


def test_graph_state_needs_the_kernels():
    serving, backend = served(False, plane="torch")
    with pytest.raises(RuntimeError, match="--disable-cuda-graph"):
        backend.init_cuda_graph_state(4, 4)


def test_plugin_hooks_the_graph_runner_in_a_scheduler_process():
    """Where a scheduler runs, the plugin wraps DecodeCudaGraphRunner.execute (the rids handover)."""
    import subprocess
    import sys

    code = ("import sglang.srt.managers.scheduler\n"
            "from sglang.srt.plugins import load_plugins\n"
            "from sglang.srt.plugins.hook_registry import HookRegistry\n"
            "load_plugins(); HookRegistry.apply_hooks()\n"
            "from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner as R\n"
            "print(getattr(R.execute, '__wrapped__', None) is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr[-2000:]
