"""TangramProcess: what one SGLang process knows of Tangram, and the bodies of the plugin's hooks.

SGLang runs ``register()`` once in every process it starts; it makes one TangramProcess and
registers its bound methods (plugin.py's table), so every hook reaches this process's state
through ``self`` instead of a module global or attributes set on SGLang's objects.

In a scheduler process: the profile is read when Scheduler.__init__ starts (``loaded``); the
serving state is built whole when the KV configurator sizes stock SGLang's cache, and handed to
what SGLang builds next (the allocator holds it; the radix tree and the attention backend take
it from the allocator). SGLang's hooks on objects that reach the tree (the scheduler, the batch,
the policy) read it there (``serving_of``); the reports below read it here.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("tangram_sglang")

INTEGRITY_ENV = "TANGRAM_INTEGRITY_CHECK"
POOL_MODE = "ragged"


class TangramProcess:
    def __init__(self):
        self.loaded = None         # LoadedProfile of this scheduler process (None: no profile)
        self.serving = None        # TangramServing, once the pool is sized
        self.tree = None           # SGLang's tree cache, once the scheduler is built
        self.peak_running = 0      # most requests SGLang ever decoded together (stock or Tangram)
        self.decode_reports = 0    # SGLang's decode log lines seen (the pool's line follows every Nth)
        self.gauges = None         # serving.metrics.TangramGauges, at the first report with --enable-metrics

    # -- scheduler ------------------------------------------------------------------------------
    def scheduler_pre_init(self, scheduler, server_args, *args, **kwargs) -> None:
        """BEFORE Scheduler.__init__: read the profile before SGLang builds its memory pools."""
        from tangram_sglang.serving.context import LoadedProfile
        from tangram_sglang.sglang.server_args import served_profile

        asked = served_profile(server_args)
        self.loaded = LoadedProfile.load(asked.path, asked.ratio) if asked is not None else None

    def scheduler_init(self, result, scheduler, *args, **kwargs) -> None:
        """AFTER Scheduler.__init__: report the profile (the pool checked it against the model's
        config when it was sized)."""
        if self.serving is None:
            return
        self.tree = scheduler.tree_cache
        i = self.info()
        logger.info("Tangram profile %s: %s, method=%s, ratio=%s, H_p=%d, %d virtual layers, mean budget %.3f",
                    i["profile"], i["model"], i["method"], i["ratio"], i["heads_per_group"], i["virtual_layers"],
                    i["mean_budget"])

    def count_running(self, result, scheduler, *args, **kwargs):
        """AFTER Scheduler.update_running_batch: the most requests ever decoding together."""
        if result is not None:
            self.peak_running = max(self.peak_running, len(result.reqs))
        return result

    def internal_state(self, result, controller, *args, **kwargs):
        """AFTER get_internal_state: the profile, the pool and the batch counters in /server_info."""
        scheduler = controller.scheduler
        result.internal_state["tangram"] = self.info() if self.serving is not None else None
        result.internal_state["batch_counters"] = {
            "running": len(scheduler.running_batch.reqs), "waiting": len(scheduler.waiting_queue),
            "peak_running": self.peak_running,
        }
        result.internal_state["overlap_schedule"] = scheduler.enable_overlap
        return result

    # -- KV memory (the configurator of the target model; a draft model keeps SGLang's pools) -----
    def derive_pool_sizes(self, original, configurator, *args, **kwargs):
        """AROUND KVCacheConfigurator._derive_pool_sizes: the same bytes become ragged pages."""
        from tangram_sglang.sglang import memory

        sizes = original(configurator, *args, **kwargs)
        if self.loaded is None or configurator.is_draft_worker:
            return sizes
        self.serving = memory.build_serving(self.loaded, configurator, sizes.max_total_num_tokens)
        return memory.logical_sizes(self.serving, sizes)

    def _serving_for(self, configurator):
        return None if configurator.is_draft_worker else self.serving

    def build_token_to_kv_pool(self, original, configurator, *args, **kwargs):
        from tangram_sglang.sglang import memory

        return memory.build_token_to_kv_pool(self._serving_for(configurator), original, configurator, *args,
                                             **kwargs)

    def build_allocator(self, original, configurator, *args, **kwargs):
        from tangram_sglang.sglang import memory

        return memory.build_allocator(self._serving_for(configurator), original, configurator, *args, **kwargs)

    # -- reports: /server_info, the pool's log line and gauges ------------------------------------
    def info(self) -> dict:
        """JSON-able summary of the profile and the pool."""
        ctx = self.serving.context
        p, e = ctx.profile, ctx.entry
        return {
            "profile": ctx.path, "model": p.model.architecture, "method": p.calibration.method,
            "ratio": e.ratio, "ratios": list(p.ratios), "heads_per_group": p.heads_per_group,
            "grouping": p.grouping, "virtual_layers": int(p.model.num_layers * e.num_groups),
            "mean_budget": float(e.budgets.mean()), "mean_group_budget": float(e.group_budget.mean()),
            "pool": POOL_MODE, "pool_info": self.pool_info(check=True),
            "sessions": ({"open_referenced": len(self.tree.sessions.frontiers)}
                         if self.tree is not None and self.tree.sessions.enabled else None),
        }

    def pool_info(self, check: bool = False) -> dict:
        """The pool's counters (O(running requests)) and, with check and TANGRAM_INTEGRITY_CHECK=1 in
        the server's environment (the tests and benchmarks set it), the integrity check's result
        (pool, tree and tables, O(pool))."""
        from tangram_sglang.serving import observability

        info = observability.pool_info(self.serving, self.tree)
        if not check:
            return info
        if os.environ.get(INTEGRITY_ENV, "0") in ("", "0"):
            info["integrity"] = f"not checked ({INTEGRITY_ENV}=1 checks it on every /server_info)"
            return info
        try:
            observability.check_integrity(self.serving, self.tree)
            info["integrity"] = "ok"
        except Exception as exc:  # reported, not raised: /server_info must answer
            info["integrity"] = f"{type(exc).__name__}: {exc}"
        return info

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
        from tangram_sglang.serving import metrics, observability

        info = self.pool_info()  # once: the log line and the gauges read the same counters
        logger.info(observability.log_line(info))
        self.gauges = metrics.report(reporter, self.gauges, info)
