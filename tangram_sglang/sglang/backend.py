"""The Tangram attention backend (``--attention-backend tangram``, set by --tangram-profile).

Per forward batch, ``init_forward_metadata`` asks the serving state for the
batch's page tables once (extend: draws each request's next chunk pages;
decode: appends one slot per virtual layer). Per layer:

* extend: chunk queries attend to each group's cached slots plus the chunk's
  own K/V (causal), merged by log-sum-exp (on CPU both parts on ATen's fused
  flash kernel, attention/fused_cpu.py); then the scorer's forward pass
  (scorers/forward_pass.py: it owns whatever hooks its scorer needs) has the
  chunk scored, each head keeps its group's keep count (protected sinks and
  newest tokens first), and only those K/V are written (serving/chunk_writer.py).
* decode: the new token's K/V go to every group; attention runs per group over
  its own length, cut by the profile's split map (tiles on CPU), reading each
  request's block table in place (DeviceBlockTables, through the batch's rows).

Learned attention sinks (gpt-oss: SGLang passes the layer's ``sinks``) enter every data plane's
result the same way, from its log-sum-exp (attention/merge.py add_sinks).

Kernels (serving/data_plane.py, --tangram-data-plane): on CUDA the Triton
split-map decode kernel (or, with ``cuda``, the CUDA one) and the Triton chunk
prefill (no host sync); elsewhere the torch data plane of
tangram_sglang.attention, their reference.

CUDA graphs (decode only, triton or cuda data plane): ``init_cuda_graph_state`` freezes
the block tables at their largest size and allocates DecodeGraphBuffers; before
each capture or replay ``init_forward_metadata_out_graph`` builds the eager plan of
the batch's real entries (host control plane, as in eager decode) and copies it
into the buffers, padding the rest of the bucket; the captured kernels read only
those buffers, the frozen tables and the pages. The graph runner's batch view
carries no request ids: ``graph_batch`` receives them from a hook on the runner
(plugin.py), so no device read is needed to map rows to requests.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from tangram_sglang.attention import ragged_decode_torch, ragged_prefill_chunk_torch, write_decode_kv
from tangram_sglang.attention.merge import add_sinks
from tangram_sglang.serving.chunk_writer import ChunkWriter
from tangram_sglang.sglang.model_writes import learned_sinks, route_kv_writes_through_backend, window_mismatches
from tangram_sglang.serving.decode_graph import DecodeGraph

CPU_TILE = 256
SINK_MODELS = ("GptOssForCausalLM",)   # one sink logit per query head, value zero: add_sinks
logger = logging.getLogger("tangram_sglang")


class TangramAttnBackend(AttentionBackend):
    def __init__(self, model_runner):
        super().__init__()
        self.serving = getattr(model_runner.token_to_kv_pool_allocator, "serving", None)
        if self.serving is None:
            raise RuntimeError("the tangram attention backend needs --tangram-profile")
        self.context = self.serving.context
        sinks = learned_sinks(model_runner.model)
        if sinks and type(model_runner.model).__name__ not in SINK_MODELS:
            raise RuntimeError(f"--tangram-profile: {sinks[0]} has learned attention sinks, served for "
                               f"{', '.join(SINK_MODELS)} only: serve this model without a profile")
        windows = window_mismatches(model_runner.model, self.context.profile.model.windows)
        if windows:
            raise RuntimeError(f"--tangram-profile: {windows[0]}: the profile was made for other windows")
        route_kv_writes_through_backend(model_runner.model)   # fused set-KV models write through this backend
        self.device = model_runner.device
        self.runner = model_runner
        self.plan = None
        self.scoring = self.context.scorer.forward_pass()   # what the scorer takes from the forward
        self.tile = CPU_TILE if str(self.device).startswith("cpu") else None
        self.data_plane = self.context.data_plane   # chosen when the pool was sized (sglang/memory.py)
        self.kernels = self.data_plane in ("triton", "cuda")
        if self.kernels:
            from tangram_sglang.attention.triton_decode import ragged_decode_triton
            from tangram_sglang.attention.triton_prefill import ragged_prefill_chunk_triton

            self._decode_kernel, self._prefill_triton = ragged_decode_triton, ragged_prefill_chunk_triton
        if self.data_plane == "cuda":
            from tangram_sglang.attention.cuda_ext import load_extension, ragged_decode_cuda

            load_extension()   # compiled now, not in the first decode step
            self._decode_kernel = ragged_decode_cuda
        self.graph: DecodeGraph | None = None
        self.graph_rids: list | None = None

    # -- CUDA graphs (decode) -------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        if not self.kernels:
            raise RuntimeError(f"tangram: CUDA graphs need the triton or cuda data plane (this server runs "
                               f"{self.data_plane!r}); pass --disable-cuda-graph")
        if self.graph is not None:
            return
        tables = self.serving.tables
        rows = int(self.runner.req_to_token_pool.size) + 1   # SGLang's rows, with room for its padding row
        self.graph = DecodeGraph(self.serving, max_bs, rows, int(self.runner.model_config.context_len), self.device)
        logger.info("Tangram CUDA graphs: decode buckets up to %d; block tables frozen at %s (%.1f MiB)",
                    max_bs, "x".join(map(str, tables.pages.shape)), tables.nbytes() / 2**20)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def graph_batch(self, rids) -> None:
        """The request ids of the batch the graph runner is about to replay (plugin hook)."""
        self.graph_rids = None if rids is None else list(rids)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        """Capture or replay of a decode graph: the batch's plan into the static buffers."""
        if self.graph is None or not forward_batch.forward_mode.is_decode():
            raise RuntimeError(f"tangram: graph metadata for {forward_batch.forward_mode} without decode graph state")
        bs = int(forward_batch.batch_size)
        raw = 0 if in_capture else bs - int(getattr(forward_batch, "num_padding", 0) or 0)
        rids = self.graph_rids if raw else []
        if rids is None or len(rids) != raw:   # no hook ran: map rows to requests (a device read)
            rids = self.serving.rids_of_rows(forward_batch.req_pool_indices[:raw].tolist())
        self.graph_rids = None
        self.plan = self.graph.prepare(rids, bs)

    def init_forward_metadata_in_graph(self, forward_batch):
        pass  # everything is prepared out of the graph, into static buffers

    def init_forward_metadata(self, forward_batch):
        mode = forward_batch.forward_mode
        rids = forward_batch.rids  # host list (req_pool_indices would cost a device sync)
        if rids is None:
            rids = self.serving.rids_of_rows(forward_batch.req_pool_indices.tolist())
        if mode.is_decode():
            self.plan = self.serving.decode_metadata(rids)
        elif mode.is_extend():
            self.scoring.prepare(self.runner.model, int(self.runner.model_config.context_len))
            ext = forward_batch.extend_seq_lens_cpu
            ext = ext.tolist() if hasattr(ext, "tolist") else list(ext)
            self.plan = self.serving.extend_waves(rids, ext)
            writers = []
            for wave in self.plan:
                cu = torch.zeros(len(wave.sizes) + 1, dtype=torch.int64)
                cu[1:] = torch.cumsum(torch.tensor(wave.sizes, dtype=torch.int64), 0)
                writers.append(ChunkWriter(wave.plan, cu.to(self.device), self.serving.data, self.context.metas))
            self.scoring.begin(forward_batch, writers, [wave.tokens for wave in self.plan])
        else:
            raise NotImplementedError(f"tangram backend: forward mode {mode} is not supported")

    def _pages(self):
        data = self.serving.data
        return data.k_pages, data.v_pages

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        lid = layer.layer_id
        q3 = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        k3 = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)
        v3 = v.view(-1, layer.tp_v_head_num, layer.v_head_dim)
        o = self.scoring.attention(layer, q3, k3, v3)
        if o is not None:  # the scorer's own pass (KVzip's reconstruction): nothing is stored
            return o.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)
        sinks = kwargs.get("sinks")
        if len(self.plan) == 1 and self.plan[0].tokens is None:   # one chunk per request: no gather
            o = self._extend_wave(self.plan[0].plan, self.scoring.writers[0].cu_seqlens, q3, k3, v3, layer, sinks)
            if save_kv_cache:
                self.scoring.chunk(lid, q3, k3, v3)
            return o.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)
        # Several chunks of a request in this pass: wave w (every request's w-th chunk) attends to
        # what the waves before it wrote, then is compressed and written itself, so each chunk sees
        # exactly what it would have seen in a pass of its own.
        o = q3.new_empty(q3.shape[0], layer.tp_q_head_num, layer.v_head_dim)
        for w, wave in enumerate(self.plan):
            idx = wave.tokens
            qw, kw, vw = q3.index_select(0, idx), k3.index_select(0, idx), v3.index_select(0, idx)
            o.index_copy_(0, idx, self._extend_wave(wave.plan, self.scoring.writers[w].cu_seqlens, qw, kw, vw,
                                                    layer, sinks).to(o.dtype))
            if save_kv_cache:
                self.scoring.chunk(lid, qw, kw, vw, wave=w)
        return o.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)

    def _extend_wave(self, plan, cu_seqlens, q3, k3, v3, layer, sinks):
        """Attention of one wave's chunks over their cached history and themselves (causal):
        [T_w, Hq, dv]."""
        lid = layer.layer_id
        meta = self.context.metas[lid]
        k_pages, v_pages = self._pages()
        if self.kernels:
            o = self._prefill_triton(q3, k3, v3, cu_seqlens, k_pages, v_pages, plan.block_table[lid],
                                     plan.seq_lens[lid], meta, layer.scaling, split=self.context.split_rows[lid],
                                     return_lse=sinks is not None)
        else:
            o = ragged_prefill_chunk_torch(q3, k3, v3, cu_seqlens, k_pages, v_pages, plan.block_table[lid],
                                           plan.seq_lens[lid], meta, layer.scaling, fused=True,
                                           return_lse=sinks is not None)
        if sinks is not None:
            o = add_sinks(*o, sinks)
        return o

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        lid, plan = layer.layer_id, self.plan
        meta = self.context.metas[lid]
        k_pages, v_pages = self._pages()
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        if save_kv_cache:
            write_decode_kv(k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
                            v.view(-1, layer.tp_v_head_num, layer.v_head_dim), plan.out_loc[lid], meta,
                            k_pages, v_pages)
        decode = self._decode_kernel if self.kernels else ragged_decode_torch
        kw = {} if self.kernels else {"tile": self.tile}
        sinks = kwargs.get("sinks")
        o = decode(q3, k_pages, v_pages, plan.block_table[lid], plan.seq_lens[lid], meta,
                   self.context.split_rows[lid], layer.scaling, rows=plan.rows, return_lse=sinks is not None, **kw)
        if sinks is not None:
            o = add_sinks(*o, sinks)
        return o.reshape(q3.shape[0], layer.tp_q_head_num * layer.v_head_dim)

    def support_triton(self):
        return False
