"""TangramProcess: what one SGLang process knows of Tangram, and the bodies of the plugin's hooks.

SGLang runs ``register()`` once in every process it starts; it makes one TangramProcess and
registers its bound methods (plugin.py's table), so every hook reaches this process's state
through ``self`` instead of a module global or attributes set on SGLang's objects.

In a scheduler process the serving state is made when Scheduler.__init__ starts (before SGLang
sizes its memory pools) and handed to what SGLang builds next: the KV configurator's hooks size
the ragged pool and make the allocator with it; the radix tree and the attention backend take it
from the allocator (our own classes hold it as a field). Hooks on SGLang objects that reach the
tree (the scheduler, the batch, the policy) read it there (``serving_of``).
"""

from __future__ import annotations

import logging

logger = logging.getLogger("tangram_sglang")


class TangramProcess:
    def __init__(self):
        self.serving = None        # TangramServing of this scheduler process (None: no profile)
        self.runtime = None        # TangramRuntime: the profile summary /server_info reports
        self.peak_running = 0      # most requests SGLang ever decoded together (stock or Tangram)
        self.decode_reports = 0    # SGLang's decode log lines seen (the pool's line follows every Nth)

    # -- scheduler ------------------------------------------------------------------------------
    def scheduler_pre_init(self, scheduler, server_args, *args, **kwargs) -> None:
        """BEFORE Scheduler.__init__: load the profile before SGLang builds its memory pools."""
        from tangram_sglang.serving.runtime import TangramServing
        from tangram_sglang.sglang.server_args import profile_request

        path, ratio = profile_request(server_args)
        self.serving = TangramServing.load(path, ratio) if path is not None else None

    def scheduler_init(self, result, scheduler, *args, **kwargs) -> None:
        """AFTER Scheduler.__init__: report the profile (the pool checked it against the model's
        config when it was sized)."""
        from tangram_sglang.sglang.runtime_state import TangramRuntime

        serving = self.serving
        if serving is None:
            return
        self.runtime = TangramRuntime(path=serving.path, profile=serving.profile, entry=serving.entry,
                                      serving=serving)
        self.runtime.log_summary()

    def count_running(self, result, scheduler, *args, **kwargs):
        """AFTER Scheduler.update_running_batch: the most requests ever decoding together."""
        if result is not None:
            self.peak_running = max(self.peak_running, len(result.reqs))
        return result

    def internal_state(self, result, controller, *args, **kwargs):
        """AFTER get_internal_state: the profile, the pool and the batch counters in /server_info."""
        scheduler = controller.scheduler
        result.internal_state["tangram"] = self.runtime.info() if self.runtime is not None else None
        result.internal_state["batch_counters"] = {
            "running": len(scheduler.running_batch.reqs), "waiting": len(scheduler.waiting_queue),
            "peak_running": self.peak_running,
        }
        result.internal_state["overlap_schedule"] = scheduler.enable_overlap
        return result

    # -- KV memory (the configurator of the target model; a draft model keeps SGLang's pools) -----
    def _serving_for(self, configurator):
        return None if configurator.is_draft_worker else self.serving

    def derive_pool_sizes(self, original, configurator, *args, **kwargs):
        from tangram_sglang.sglang import memory

        return memory.derive_pool_sizes(self._serving_for(configurator), original, configurator, *args, **kwargs)

    def build_token_to_kv_pool(self, original, configurator, *args, **kwargs):
        from tangram_sglang.sglang import memory

        return memory.build_token_to_kv_pool(self._serving_for(configurator), original, configurator, *args,
                                             **kwargs)

    def build_allocator(self, original, configurator, *args, **kwargs):
        from tangram_sglang.sglang import memory

        return memory.build_allocator(self._serving_for(configurator), original, configurator, *args, **kwargs)

    # -- the pool's log line and gauges ---------------------------------------------------------
    def log_prefill_pool(self, result, reporter, *args, **kwargs):
        """AFTER the prefill batch log line: the ragged pool's pages and the memory saved."""
        if self.serving is not None:
            self._publish(reporter)
        return result

    def log_decode_pool(self, result, reporter, *args, **kwargs):
        """AFTER report_decode_stats: the same line, at SGLang's decode log interval."""
        if self.serving is not None:
            self.decode_reports += 1
            if self.decode_reports % max(1, getattr(reporter, "decode_log_interval", 40)) == 0:
                self._publish(reporter)
        return result

    def _publish(self, reporter) -> None:
        from tangram_sglang.serving.metrics import report

        info = self.serving.pool_info()  # once: the log line and the gauges read the same counters
        logger.info(self.serving.log_line(info))
        report(reporter, self.serving, info)
