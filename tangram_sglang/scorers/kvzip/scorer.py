"""KVzip (Kim et al. 2025) served inside chunked prefill: context reconstruction.

An entry matters if the model needs it to reproduce its own context, whatever
is asked turns later. After a chunk is prefilled, a reconstruction pass feeds
``prefix_ids`` (the repeat instruction in the model's chat template, stored in
the profile at calibration, so the server needs no tokenizer) followed by the
chunk's own tokens; they attend to the cached history, the whole chunk and
themselves, and their KV is never stored. A chunk entry's score per KV head is
the largest softmax probability any reconstruction query (of the head's GQA
group) pays it, the softmax over the head's first ``sinks`` cached slots, the
chunk and the reconstruction tokens (tangram_sglang.scorers.kvzip.attention).

Scores therefore need a whole extra forward pass, not one chunk's q, k, v: the scorer's
forward pass runs it when served (serving_pass.KVzipPass), ``needs_reconstruction`` tells the
dense oracle to; ``score`` itself refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_sglang.scorers.base import Scorer


@dataclass(frozen=True)
class KVzipScorer(Scorer):
    prefix_ids: tuple[int, ...] = ()
    sinks: int = 4

    name = "kvzip"
    needs_reconstruction = True

    def __post_init__(self):
        if not self.prefix_ids:
            raise ValueError("the kvzip scorer needs prefix_ids (the repeat instruction's token ids): calibrate "
                             "with `python -m tangram_sglang.calibrate --method kvzip`, which stores them")
        object.__setattr__(self, "prefix_ids", tuple(int(t) for t in self.prefix_ids))
        if self.sinks < 0:
            raise ValueError(f"kvzip sinks must be >= 0, got {self.sinks}")

    def forward_pass(self):
        from tangram_sglang.scorers.kvzip.serving_pass import KVzipPass

        return KVzipPass(self)

    def score(self, q, k, v, state=None, hidden=None):
        raise ValueError("kvzip scores come from a reconstruction pass over the whole model "
                         "(serving backend or serving_reference), not from one chunk's q, k, v")
