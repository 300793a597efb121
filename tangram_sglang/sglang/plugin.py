"""SGLang plugin entry point (group ``sglang.srt.plugins``).

SGLang calls ``register()`` in every process it starts (launcher, Engine,
scheduler, detokenizer) before building anything, then applies the hooks
registered here. Kept light: importing this module imports no torch model
code; the hooks import what they need when they run.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("tangram_sglang")

SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
INTERNAL_STATE = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
BEAMS = "sglang.srt.beam_search.coordinator.BeamCoordinator"
METRICS = "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter"
POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
DECODE_GRAPH = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"


def _scheduler_pre_init(scheduler, server_args, *args, **kwargs):
    """BEFORE Scheduler.__init__: load the profile before SGLang builds its memory pools."""
    from tangram_sglang.serving.runtime import TangramServing, set_current
    from tangram_sglang.sglang.server_args import profile_request

    path, ratio = profile_request(server_args)
    set_current(TangramServing.load(path, ratio) if path is not None else None)


def _scheduler_init(result, scheduler, server_args, *args, **kwargs) -> None:
    """AFTER Scheduler.__init__: check the profile against the model SGLang loaded; report it."""
    from tangram_sglang.profile import ModelShape
    from tangram_sglang.serving.runtime import current, set_current
    from tangram_sglang.sglang.runtime_state import TangramRuntime

    serving = current()
    set_current(None)  # the hand-off ends here: later readers reach it through the tree and allocator
    scheduler.tangram = None
    if serving is None:
        return
    serving.profile.check_model(ModelShape.from_hf_config(scheduler.model_config.hf_config))
    runtime = TangramRuntime(path=serving.path, profile=serving.profile, entry=serving.entry, serving=serving)
    scheduler.tangram = runtime
    scheduler.tp_worker.model_runner.tangram = runtime
    runtime.log_summary()


def _log_prefill_pool(result, reporter, *args, **kwargs):
    """AFTER the prefill batch log line: the ragged pool's pages and the memory saved."""
    from tangram_sglang.serving.runtime import serving_of

    serving = serving_of(reporter.scheduler.tree_cache)
    if serving is not None and serving.cache is not None:
        _publish(reporter, serving)
    return result


def _publish(reporter, serving) -> None:
    """The pool's log line and its Prometheus gauges (with --enable-metrics)."""
    from tangram_sglang.serving.metrics import report

    info = serving.pool_info()  # once: the log line and the gauges read the same counters
    logger.info(serving.log_line(info))
    report(reporter, serving, info)


def _log_decode_pool(result, reporter, *args, **kwargs):
    """AFTER report_decode_stats: the same line, at SGLang's decode log interval."""
    from tangram_sglang.serving.runtime import serving_of

    serving = serving_of(reporter.scheduler.tree_cache)
    if serving is not None and serving.cache is not None:
        serving.decode_steps += 1
        if serving.decode_steps % max(1, getattr(reporter, "decode_log_interval", 40)) == 0:
            _publish(reporter, serving)
    return result


def _register_backends() -> None:
    """The attention backend and radix tree names, in every process (ServerArgs validates them)."""
    from sglang.srt.arg_groups.choices import add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if "tangram" not in ATTENTION_BACKENDS:
        add_attention_backend_choices(["tangram"])
        register_attention_backend("tangram")(_create_backend)
    if get_radix_cache_factory("tangram") is None:
        register_radix_cache_backend("tangram", _create_tree)


def _create_backend(runner):
    from tangram_sglang.sglang.backend import TangramAttnBackend

    return TangramAttnBackend(runner)


def _create_tree(ctx):
    from tangram_sglang.sglang.radix import TangramRadixCache

    return TangramRadixCache(ctx.params, ctx.params.token_to_kv_pool_allocator.serving)


def _register_serving_hooks(HookRegistry, HookType) -> None:
    from tangram_sglang.sglang import memory, scheduling

    HookRegistry.register(f"{SCHEDULER}.__init__", _scheduler_pre_init, HookType.BEFORE)
    HookRegistry.register(f"{CONFIGURATOR}._derive_pool_sizes", memory.derive_pool_sizes, HookType.AROUND)
    HookRegistry.register(f"{CONFIGURATOR}._build_token_to_kv_pool", memory.build_token_to_kv_pool, HookType.AROUND)
    HookRegistry.register(f"{CONFIGURATOR}._build_token_to_kv_pool_allocator", memory.build_allocator,
                          HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.get_prefill_adder_class", scheduling.prefill_adder_class, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}._add_request_to_queue", scheduling.refuse_never_fitting, HookType.BEFORE)
    HookRegistry.register(f"{POLICY}._touch_waiting_prefixes", scheduling.touch_waiting_histories, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULE_BATCH}.prepare_for_extend", scheduling.bind_rows, HookType.AFTER)
    HookRegistry.register(f"{BEAMS}.validate_and_init", scheduling.refuse_beam_search, HookType.AROUND)
    HookRegistry.register(f"{METRICS}.report_prefill_stats", _log_prefill_pool, HookType.AFTER)
    HookRegistry.register(f"{METRICS}.report_decode_stats", _log_decode_pool, HookType.AFTER)
    HookRegistry.register(f"{DECODE_GRAPH}.execute", _graph_batch, HookType.BEFORE)


def _graph_batch(runner, *args, **kwargs):
    """BEFORE DecodeCudaGraphRunner.execute: hand the batch's request ids to a Tangram backend (the
    replay view it is given carries none)."""
    receive = getattr(getattr(runner, "attn_backend", None), "graph_batch", None)
    forward_batch = kwargs.get("forward_batch", args[0] if args else None)
    if receive is not None:
        receive(getattr(forward_batch, "rids", None))


def _internal_state(result, controller, *args, **kwargs):
    """AFTER get_internal_state: report the profile, the pool and the batch counters in /server_info."""
    scheduler = controller.scheduler
    runtime = getattr(scheduler, "tangram", None)
    result.internal_state["tangram"] = runtime.info() if runtime is not None else None
    result.internal_state["batch_counters"] = {
        "running": len(scheduler.running_batch.reqs), "waiting": len(scheduler.waiting_queue),
        "peak_running": getattr(scheduler, "tangram_peak_running", 0),
    }
    result.internal_state["overlap_schedule"] = scheduler.enable_overlap
    return result


def _count_running(result, scheduler, *args, **kwargs):
    """AFTER Scheduler.update_running_batch: the most requests ever decoding together (stock or Tangram)."""
    if result is not None:
        scheduler.tangram_peak_running = max(getattr(scheduler, "tangram_peak_running", 0), len(result.reqs))
    return result


def _patch_engine() -> None:
    """Let sglang.Engine(tangram_profile=..., tangram_ratio=...) work.

    Engine.__init__ calls load_plugins() before it builds its ServerArgs via
    ``self.server_args_class``, so swapping that class attribute takes effect
    for the Engine being constructed.
    """
    engine_mod = sys.modules.get("sglang.srt.entrypoints.engine")
    if engine_mod is None:
        return
    from tangram_sglang.sglang.server_args import engine_server_args_factory

    engine_cls = engine_mod.Engine
    current = engine_cls.__dict__.get("server_args_class")
    if current is not None and not hasattr(current, "tangram_wrapped"):
        engine_cls.server_args_class = staticmethod(engine_server_args_factory(current))


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from tangram_sglang.sglang import server_args as server_args_ext

    HookRegistry.register(f"{SERVER_ARGS}.add_cli_args", server_args_ext.add_cli_args, HookType.AFTER)
    HookRegistry.register(f"{SERVER_ARGS}.from_cli_args", server_args_ext.from_cli_args, HookType.AROUND)
    # Only where a scheduler runs (its module is imported by the spawn target):
    # resolving the hook targets elsewhere would import the scheduler for nothing.
    _register_backends()
    if "sglang.srt.managers.scheduler" in sys.modules:
        _register_serving_hooks(HookRegistry, HookType)
        HookRegistry.register(f"{SCHEDULER}.__init__", _scheduler_init, HookType.AFTER)
        HookRegistry.register(f"{INTERNAL_STATE}.get_internal_state", _internal_state, HookType.AFTER)
        HookRegistry.register(f"{SCHEDULER}.update_running_batch", _count_running, HookType.AFTER)
    _patch_engine()

