"""SGLang plugin entry point (group ``sglang.srt.plugins``) and the table of every hook.

SGLang calls ``register()`` once in every process it starts (launcher, Engine, scheduler,
detokenizer) before building anything, then applies the hooks registered here. Each process
gets one TangramProcess (process.py) holding its state; the hooks are its bound methods or
stateless functions of the modules beside this one. Kept light: importing this module imports
no torch model code.

Besides the hooks, SGLang is extended through its registries (the ``tangram`` attention backend
and radix tree names) and one class attribute: ``Engine.server_args_class`` is wrapped so
``sglang.Engine(tangram_profile=...)`` works.
"""

from __future__ import annotations

import sys

from tangram_sglang.sglang.process import TangramProcess

SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
INTERNAL_STATE = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
BEAMS = "sglang.srt.beam_search.coordinator.BeamCoordinator"
METRICS = "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter"
POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
DECODE_GRAPH = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"


def launcher_hooks() -> list:
    """Hooks for every process: (SGLang target, kind, body)."""
    from tangram_sglang.sglang import server_args

    return [
        (f"{SERVER_ARGS}.add_cli_args", "AFTER", server_args.add_cli_args),          # --tangram-* flags
        (f"{SERVER_ARGS}.from_cli_args", "AROUND", server_args.from_cli_args),       # validate the profile
    ]


def scheduler_hooks(process: TangramProcess) -> list:
    """Hooks for a scheduler process (the model runner lives in it too)."""
    from tangram_sglang.sglang import kv_dtype, scheduling

    return [
        (f"{SCHEDULER}.__init__", "BEFORE", process.scheduler_pre_init),             # load the profile
        (f"{MODEL_RUNNER}.configure_kv_cache_dtype", "AROUND", kv_dtype.configure_kv_cache_dtype),  # FP8 on CPU
        (f"{CONFIGURATOR}._derive_pool_sizes", "AROUND", process.derive_pool_sizes),  # stock bytes -> pages
        (f"{CONFIGURATOR}._build_token_to_kv_pool", "AROUND", process.build_token_to_kv_pool),  # a stub
        (f"{CONFIGURATOR}._build_token_to_kv_pool_allocator", "AROUND", process.build_allocator),
        (f"{SCHEDULER}.__init__", "AFTER", process.scheduler_init),                  # report the profile
        (f"{SCHEDULER}.get_prefill_adder_class", "AROUND", scheduling.prefill_adder_class),  # reservation
        (f"{SCHEDULER}._add_request_to_queue", "BEFORE", scheduling.refuse_at_arrival),  # clear 400s
        (f"{POLICY}._touch_waiting_prefixes", "AROUND", scheduling.touch_waiting_histories),
        (f"{SCHEDULE_BATCH}.prepare_for_extend", "AFTER", scheduling.bind_rows),
        (f"{BEAMS}.validate_and_init", "AROUND", scheduling.refuse_beam_search),
        (f"{SCHEDULER}.update_running_batch", "AFTER", process.count_running),
        (f"{METRICS}.report_prefill_stats", "AFTER", process.log_prefill_pool),
        (f"{METRICS}.report_decode_stats", "AFTER", process.log_decode_pool),
        (f"{INTERNAL_STATE}.get_internal_state", "AFTER", process.internal_state),   # /server_info
        (f"{DECODE_GRAPH}.execute", "BEFORE", scheduling.hand_graph_batch),          # rids for graph replays
    ]


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


def _register_resolution_hooks() -> None:
    """Wrappers of ServerArgs resolution steps (SGLang's own registry), once per process."""
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS, register_resolution_hook

    from tangram_sglang.sglang.server_args import sinks_backend_check

    step = "handle_model_specific_adjustments"
    if sinks_backend_check not in _HOOKS.get(step, ()):
        register_resolution_hook(step)(sinks_backend_check)


def _create_backend(runner):
    from tangram_sglang.sglang.backend import TangramAttnBackend

    return TangramAttnBackend(runner)


def _create_tree(ctx):
    from tangram_sglang.sglang.radix import TangramRadixCache

    serving = ctx.params.token_to_kv_pool_allocator.serving
    tree = TangramRadixCache(ctx.params, serving.tree_store)
    serving.admission.evict = tree.evict_pages  # admission makes room through this tree's leaves
    return tree


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

    hooks = launcher_hooks()
    # Only where a scheduler runs (its module is imported by the spawn target): resolving the
    # scheduler's hook targets elsewhere would import the scheduler for nothing.
    if "sglang.srt.managers.scheduler" in sys.modules:
        hooks += scheduler_hooks(TangramProcess())
    for target, kind, body in hooks:
        HookRegistry.register(target, body, getattr(HookType, kind))
    _register_backends()
    _register_resolution_hooks()
    _patch_engine()
