"""BatchMemo: a value derived from a batch's request ids, reused while the batch repeats.

A decode batch usually repeats step after step; whatever is looked up per request (arena
slots in the pool, SGLang rows in the runtime) is then looked up once per batch composition
instead of once per step. The owner calls ``changed()`` whenever a looked-up binding may have
moved (a request released, a row rebound); a repeated batch then costs one list comparison.
"""

from __future__ import annotations


class BatchMemo:
    def __init__(self):
        self.epoch = 0
        self._last: tuple | None = None  # (epoch, rids, value)

    def changed(self) -> None:
        self.epoch += 1

    def get(self, rids: list, resolve, *, keep=lambda value: True):
        """resolve(rids) -> value, called only when rids or a binding changed since the last
        call; the value is remembered when keep(value) (a value that must be re-checked at every
        call, e.g. from a batch that is not all ready, is not)."""
        last = self._last
        if last is not None and last[0] == self.epoch and last[1] == rids:
            return last[2]
        value = resolve(rids)
        if keep(value):
            self._last = (self.epoch, list(rids), value)
        return value
