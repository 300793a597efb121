"""The ragged pool's gauges on SGLang's own Prometheus endpoint (``--enable-metrics``).

SGLang's ``sglang:token_usage`` and friends count the *logical* token ids a
profile hands SGLang (a space 16x the stock one, so pages bind first); what
binds is the ragged pool. These gauges sit beside SGLang's, with its labels
(model name, ranks), and are set from the pool's counters each time SGLang
logs its own stats (every prefill batch, every decode log interval): reading
them costs O(running requests), never a walk of the pool.

Counters that only grow (admitted, refused, ...) are exported as gauges of
their running total ("mostrecent" across processes, like SGLang's own).
"""

from __future__ import annotations

GAUGES = {  # pool_info key -> help text
    "pages_total": "Pages of the ragged KV pool.",
    "pages_used": "Pages holding KV (requests' own and the radix tree's).",
    "pages_reserved": "Pages reserved by admitted requests and not yet written.",
    "pages_free": "Pages neither used nor reserved.",
    "pages_held_by_tree": "Pages held by the radix tree (cached history).",
    "tokens_held": "Tokens whose KV the pool holds.",
    "saved_vs_full_kv": "Share of full-KV bytes saved for the tokens held.",
    "running_requests": "Requests holding a reservation.",
    "admitted": "Requests admitted (running total).",
    "waited": "Admissions deferred for lack of pages (running total).",
    "too_large": "Requests refused: the pool can never hold them (running total).",
    "plan_errors": "Requests failed: their chunk plan did not fit their cached prefix; expected 0 (running total).",
    "capped": "Requests whose max_new_tokens was capped to what the pool can hold (running total).",
    "retracted": "Requests retracted from decode for lack of pages (running total).",
    "evicted_segments": "Radix tree segments evicted for room (running total).",
    "evicted_tokens_admission": "Tokens of tree segments evicted to admit requests (running total).",
    "evicted_tokens_decode": "Tokens of tree segments evicted for decode pages (running total).",
    "evicted_tokens_flush": "Tokens evicted to serve a request without its prefix, nothing running (running total).",
    "evicted_tokens_sglang": "Tokens evicted by SGLang's own evict calls (running total).",
    "evicted_tokens_load": "Tokens evicted for the pages of host segments loaded back (running total).",
    "host_pages_total": "Pages of the compressed host tier (0: none).",
    "host_pages_used": "Host tier pages holding segments.",
    "offloaded_tokens": "Tokens of tree segments moved to the host tier for device room (running total).",
    "loaded_tokens": "Tokens of host segments loaded back for a match (running total).",
    "host_evicted_tokens": "Tokens dropped from the host tier for host room (running total).",
    "evictions_refused": "Requests for room that evicting every unlocked leaf could not meet: nothing evicted (running total).",
    "published_segments": "Segments linked into the radix tree (running total).",
    "twin_segments": "Segments freed at publish: the tree already held them (running total).",
    "detached_segments": "Segments freed at publish: their chain continues a twin (running total).",
    "matched_tokens": "Prefix tokens admitted requests found in the radix tree (running total).",
    "prefill_passes": "Prefill forwards run (running total).",
    "prefill_chunks": "Compression chunks those forwards computed, several per forward where they fit (running total).",
    "window_drops": "Times a radix tree node dropped sliding-window pages for room (running total).",
    "peak_pages_used": "Most pages ever used at once.",
}


class TangramGauges:
    """One prometheus Gauge per GAUGES key, named ``tangram:<key>``, labelled like SGLang's."""

    def __init__(self, labels: dict[str, str]):
        from prometheus_client import Gauge  # after SGLang set PROMETHEUS_MULTIPROC_DIR

        self.labels = dict(labels)
        self.gauges = {key: Gauge(name=f"tangram:{key}", documentation=doc, labelnames=list(self.labels),
                                  multiprocess_mode="mostrecent") for key, doc in GAUGES.items()}

    def update(self, info: dict) -> None:
        for key, gauge in self.gauges.items():
            (gauge.labels(**self.labels) if self.labels else gauge).set(float(info[key]))


def report(reporter, gauges: "TangramGauges | None", info: dict) -> "TangramGauges | None":
    """Set the gauges from the pool's info, if this scheduler exports metrics (else nothing);
    returns the gauges (made at the first report)."""
    collector = getattr(reporter, "metrics_collector", None)
    if not getattr(reporter, "enable_metrics", False) or collector is None:
        return gauges
    gauges = gauges or TangramGauges(collector.labels)
    gauges.update(info)
    return gauges
