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


def _scheduler_init(result, scheduler, server_args, *args, **kwargs) -> None:
    """AFTER Scheduler.__init__: load the profile in the (spawned) scheduler process."""
    from .runtime_state import TangramRuntime
    from .server_args_ext import profile_request

    path, ratio = profile_request(server_args)
    scheduler.tangram = None
    if path is None:
        return
    runtime = TangramRuntime.load(path, ratio, scheduler.model_config.hf_config)
    scheduler.tangram = runtime
    scheduler.tp_worker.model_runner.tangram = runtime
    runtime.log_summary()


def _internal_state(result, controller, *args, **kwargs):
    """AFTER get_internal_state: report the profile in /server_info's internal_states."""
    runtime = getattr(controller.scheduler, "tangram", None)
    result.internal_state["tangram"] = runtime.info() if runtime is not None else None
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
    from .server_args_ext import engine_server_args_factory

    engine_cls = engine_mod.Engine
    current = engine_cls.__dict__.get("server_args_class")
    if current is not None and not hasattr(current, "tangram_wrapped"):
        engine_cls.server_args_class = staticmethod(engine_server_args_factory(current))


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import server_args_ext

    HookRegistry.register(f"{SERVER_ARGS}.add_cli_args", server_args_ext.add_cli_args, HookType.AFTER)
    HookRegistry.register(f"{SERVER_ARGS}.from_cli_args", server_args_ext.from_cli_args, HookType.AROUND)
    # Only where a scheduler runs (its module is imported by the spawn target):
    # resolving the hook targets elsewhere would import the scheduler for nothing.
    if "sglang.srt.managers.scheduler" in sys.modules:
        HookRegistry.register(f"{SCHEDULER}.__init__", _scheduler_init, HookType.AFTER)
        HookRegistry.register(f"{INTERNAL_STATE}.get_internal_state", _internal_state, HookType.AFTER)
    _patch_engine()

