"""SessionRefs: SGLang's session radix cache over the segment tree (``--enable-session-radix-cache``).

A request with a top-level ``session_id`` that finishes registers the node its history ends on as a
frontier of its session: every node on the path root -> frontier is then referenced by the session.
Eviction takes unreferenced leaves first (least recently used among them) and referenced ones only
when nothing else can make room. Closing a session (``/close_session``) dereferences its frontiers:
its segments stay cached as ordinary LRU entries. A frontier evicted under pressure hands its
reference to its parent. A request of an older incarnation of a session (opened again since), or one
finishing after its session closed, registers nothing. Stock's counterpart:
sglang/srt/mem_cache/unified_cache/session_ref_tracker.py.

A session's ratio: a request that names a ratio of the profile (``custom_params``) sets it for its
session's later requests that name none, until the session closes or is opened again; a history is
reused only at the ratio that wrote it, so a session keeps finding its own without repeating the field.

State (owned here; nodes carry their counters):
    frontiers    {session_id: set of nodes}; a turn's frontier replaces those on its path
    node.sessions  {session_id: frontiers of it at or below the node}; referenced when non-empty
    ratios       {session_id: the ratio its requests last named (None: the served one)}
"""

from __future__ import annotations

from collections import OrderedDict

CLOSED_REMEMBERED = 8192   # stock's tombstone bound: a close this long ago may be re-tagged by a late finish


class SessionRefs:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.reset()

    def reset(self) -> None:
        self.frontiers: dict[str, set] = {}
        self.generations: dict[str, int] = {}
        self.ratios: dict[str, float | None] = {}
        self.closed: OrderedDict[str, None] = OrderedDict()
        self._incarnations = 0

    # -- SGLang's calls (scheduler: open_session, a request's arrival, close_session) ---------------
    def open(self, session_id: str) -> int:
        self.closed.pop(session_id, None)
        self.ratios.pop(session_id, None)
        self._incarnations += 1
        self.generations[session_id] = self._incarnations
        return self._incarnations

    def ensure_generation(self, session_id: str) -> int:
        generation = self.generations.get(session_id)
        return self.open(session_id) if generation is None else generation

    def release(self, session_id: str, root) -> list:
        """Dereference a closed session's frontiers; returns the nodes left unreferenced."""
        if not self.enabled or session_id is None or session_id in self.closed:
            return []
        self.closed[session_id] = None
        while len(self.closed) > CLOSED_REMEMBERED:
            self.closed.popitem(last=False)
        self.generations.pop(session_id, None)
        self.ratios.pop(session_id, None)
        freed = []
        for node in self.frontiers.pop(session_id, ()):
            freed += self._count(node, session_id, -1, root)
        return freed

    def ratio(self, session_id: str | None, named: bool, ratio: float | None) -> float | None:
        """The ratio a request of ``session_id`` is served at (None: the served one): the one it names
        (``named``; remembered for the session), else the one its session's requests last named."""
        if not self.enabled or session_id is None or session_id in self.closed:
            return ratio
        if named:
            self.ratios[session_id] = ratio
            return ratio
        return self.ratios.get(session_id, ratio)

    def register(self, req, leaf, root) -> None:
        """A finished request's history ends at ``leaf``: it becomes a frontier of the request's session,
        replacing the session's frontiers on its path (the turns before it)."""
        session_id = getattr(req, "session_id", None)
        if (not self.enabled or session_id is None or session_id in self.closed or leaf is root
                or getattr(req, "session_generation", None) != self.generations.get(session_id)):
            return
        mine = self.frontiers.setdefault(session_id, set())
        if leaf in mine:
            return
        path = set(_path(leaf, root))
        for old in [f for f in mine if f in path]:
            mine.discard(old)
            self._count(old, session_id, -1, root)
        mine.add(leaf)
        self._count(leaf, session_id, +1, root)

    # -- the tree's calls ---------------------------------------------------------------------------
    def on_delete(self, node, root) -> None:
        """A leaf leaves the tree: each session it was a frontier of keeps its parent instead."""
        for session_id in list(node.sessions):
            mine = self.frontiers.get(session_id)
            if mine is not None and node in mine:
                mine.discard(node)
                if node.parent is root:
                    del node.sessions[session_id]
                elif node.parent in mine:   # already a frontier (a sibling's, handed over): one count less
                    self._count(node.parent, session_id, -1, root)
                else:
                    mine.add(node.parent)   # its count on the path already includes this frontier
            if mine is not None and not mine:
                del self.frontiers[session_id]

    @staticmethod
    def on_split(upper, lower) -> None:
        """An uncompressed node split in two: the upper part lies on every path the lower one does."""
        upper.sessions = dict(lower.sessions)

    def check(self, nodes, root) -> None:
        """Raise AssertionError unless every node's counters equal the frontiers recounted."""
        expected: dict = {}
        alive = set(nodes)
        for session_id, mine in self.frontiers.items():
            for leaf in mine:
                if leaf not in alive:
                    raise AssertionError(f"session {session_id}: a frontier is no longer in the tree")
                for node in _path(leaf, root):
                    got = expected.setdefault(node, {})
                    got[session_id] = got.get(session_id, 0) + 1
        for node in nodes:
            if node.sessions != expected.get(node, {}):
                raise AssertionError(f"node {node.id}: session references {node.sessions}, "
                                     f"recounted {expected.get(node, {})}")

    @staticmethod
    def _count(leaf, session_id: str, delta: int, root) -> list:
        """Add delta to session_id's count on leaf's path; returns the nodes left unreferenced."""
        freed = []
        for node in _path(leaf, root):
            n = node.sessions.get(session_id, 0) + delta
            if n:
                node.sessions[session_id] = n
            else:
                node.sessions.pop(session_id, None)
                freed += [] if node.sessions else [node]
        return freed


def _path(node, root) -> list:
    """node, its parent, ... up to (not including) root."""
    out = []
    while node is not root and node is not None:
        out.append(node)
        node = node.parent
    return out
