"""Memory pools when a profile is served: the ragged page pool replaces SGLang's token pool.

SGLang sizes its KV cache (from free memory or --max-total-tokens) as
``max_total_num_tokens`` full-KV token slots. Three AROUND hooks on
KVCacheConfigurator (bound to the process's serving state by process.py) turn
that into Tangram's pool:

* ``_derive_pool_sizes``: the same bytes become ragged pages
  (TangramServing.build); SGLang's token count becomes a *logical* id
  space large enough for every token the pages can hold, so pages, not ids,
  are what limits admission.
* ``_build_token_to_kv_pool``: SGLang's per-token K/V buffers shrink to one
  page (nothing reads them: the Tangram attention backend reads the pages).
* ``_build_token_to_kv_pool_allocator``: TangramAllocator hands out logical
  ids and answers SGLang's decode-capacity question with pages.
"""

from __future__ import annotations

import logging

import msgspec
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

logger = logging.getLogger("tangram_sglang")

PAGE_SIZE = 16
_STUB_TOKENS = 16


class TangramAllocator(TokenToKVPoolAllocator):
    """Logical token ids for SGLang's bookkeeping; real capacity is the ragged pool's pages."""

    def __init__(self, size: int, *, dtype, device, kvcache, serving):
        super().__init__(size, dtype=dtype, device=device, kvcache=kvcache, need_sort=False)
        self.serving = serving

    def check_decode_capacity(self, *, num_tokens: int, tree_cache, requests=None, spec_algorithm=None) -> bool:
        if not super().check_decode_capacity(num_tokens=num_tokens, tree_cache=tree_cache, requests=requests,
                                             spec_algorithm=spec_algorithm):
            return False
        rids = [r.rid for r in (requests or ())]
        return self.serving.admission.ensure_decode_room(rids)

    def max_new_tokens_for_memory(self, input_tokens: int, max_new_tokens: int, *, token_capacity: int,
                                  sliding_window_size=None, chunk_size=None) -> int | None:
        """SGLang's arrival cap (Scheduler.init_req_max_new_tokens), in pages: the most tokens the
        request could ever generate with the whole ragged pool to itself (its prompt compressed),
        so decode never needs more than the pool. A prompt that can never fit is left to the
        arrival hook, which refuses it naming the pool (HTTP 400)."""
        return self.serving.admission.max_decode_tokens(int(input_tokens), int(max_new_tokens))


def build_serving(loaded, configurator, stock_tokens: int):
    """The serving state for the pool sized from stock SGLang's KV cache of stock_tokens tokens."""
    from tangram_sglang.serving.data_plane import choose_data_plane
    from tangram_sglang.serving.runtime import TangramServing
    from tangram_sglang.sglang.kv_dtype import pool_dtype
    from tangram_sglang.sglang.server_args import served_profile

    mc = configurator.model_config
    tp_size, tp_rank = _tensor_parallel(configurator)
    served = served_profile(configurator.server_args)
    data_plane = choose_data_plane(served.data_plane, configurator.device)
    serving = TangramServing.build(loaded, mc.hf_config, host_ratio=served.host_ratio, stock_tokens=stock_tokens,
                                   dtype=pool_dtype(configurator), device=configurator.device,
                                   page_size=PAGE_SIZE, num_q_heads=mc.get_num_attention_heads(tp_size),
                                   tp_size=tp_size, tp_rank=tp_rank, data_plane=data_plane,
                                   kv_scales=kv_scales(configurator.model, mc.num_hidden_layers),
                                   markers=chat_markers(configurator.server_args))
    spec, ctx = serving.spec, serving.context
    rank = f" (TP rank {tp_rank} of {tp_size}: its {ctx.entry.budgets.shape[1]} KV heads)" if tp_size > 1 else ""
    logger.info("Tangram pool%s: %d pages of %d slots (%d B each, %.1f MiB) = the bytes of %d full-KV tokens; "
                "%d virtual layers; logical token ids: %d", rank, spec.num_pages, spec.page_size, spec.page_size_bytes,
                spec.pool_bytes / 2**20, stock_tokens, spec.num_virtual, ctx.logical_tokens)
    if serving.host is not None:
        logger.info("Tangram host tier: %d pages (%.1f MiB of host memory, %.2fx the pool)",
                    serving.host.pages.num_pages, serving.host.bytes / 2**20, served.host_ratio)
    return serving


def chat_markers(server_args):
    """The chat template's message markers the chunk rule cuts at (method/chunks.py), from the served
    tokenizer; None (one message per sequence) without a tokenizer or a template the rule can read.
    With --tangram-replies compressed, without the assistant's role: its messages are cut like any other."""
    from tangram_sglang.method.chat_markers import detect_markers
    from tangram_sglang.method.chunks import Markers
    from tangram_sglang.sglang.server_args import served_profile

    try:   # read even with --skip-tokenizer-init: its clients still send chat-formatted ids
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(server_args.tokenizer_path or server_args.model_path,
                                                  trust_remote_code=server_args.trust_remote_code,
                                                  revision=server_args.revision)
    except Exception as exc:  # the scheduler serves without markers rather than not at all
        logger.warning("Tangram: no tokenizer for the chunk rule's message markers (%s)", exc)
        return None
    markers = detect_markers(tokenizer)
    if markers is not None and served_profile(server_args).replies == "compressed":
        logger.info("Tangram chunk rule: messages open at token %s; the assistant's compressed once closed",
                    markers.start_ids)
        return Markers(start_ids=markers.start_ids)
    logger.info("Tangram chunk rule: %s", f"messages open at token {markers.start_ids}, the assistant's named "
                f"by {markers.assistant}" if markers else "no chat markers (a sequence is one message)")
    return markers


def kv_scales(model, num_layers: int) -> list[tuple[float, float]]:
    """Per layer (k_scale, v_scale) of SGLang's attention layers: the checkpoint's KV cache scales
    where it has them (SGLang loads them into RadixAttention.k_scale_float), 1.0 otherwise."""
    scales = [(1.0, 1.0)] * num_layers
    for mod in model.modules() if model is not None else ():
        layer_id = getattr(mod, "layer_id", None)
        if isinstance(layer_id, int) and 0 <= layer_id < num_layers and hasattr(mod, "k_scale_float"):
            scales[layer_id] = (float(mod.k_scale_float or 1.0), float(mod.v_scale_float or 1.0))
    return scales


def logical_sizes(serving, sizes):
    """SGLang's pool sizes with its token count replaced by the serving state's logical id space."""
    return msgspec.structs.replace(sizes, max_total_num_tokens=serving.context.logical_tokens)


def _tensor_parallel(configurator) -> tuple[int, int]:
    """(TP size, this rank): SGLang's parallel state is initialized before the pools are built."""
    tp_size = int(getattr(configurator.server_args, "tp_size", 1) or 1)
    if tp_size == 1:
        return 1, 0
    from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

    return tp_size, int(get_tensor_model_parallel_rank())


def build_token_to_kv_pool(serving, original, configurator, *args, sizes, **kwargs):
    """AROUND KVCacheConfigurator._build_token_to_kv_pool: one page of SGLang's buffers (serving None:
    no profile, SGLang's own)."""
    if serving is None:
        return original(configurator, *args, sizes=sizes, **kwargs)
    stub = msgspec.structs.replace(sizes, max_total_num_tokens=_STUB_TOKENS)
    return original(configurator, *args, sizes=stub, **kwargs)


def build_allocator(serving, original, configurator, *args, sizes, token_to_kv_pool, **kwargs):
    """AROUND KVCacheConfigurator._build_token_to_kv_pool_allocator (serving None: SGLang's own)."""
    if serving is None:
        return original(configurator, *args, sizes=sizes, token_to_kv_pool=token_to_kv_pool, **kwargs)
    return TangramAllocator(sizes.max_total_num_tokens, dtype=configurator.kv_cache_dtype,
                            device=configurator.device, kvcache=token_to_kv_pool, serving=serving)
