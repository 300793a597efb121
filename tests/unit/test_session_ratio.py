"""A session's ratio (sglang/radix_sessions.py SessionRefs.ratio): a request naming a ratio sets it for its
session's later requests naming none, until the session closes or is opened again."""

from tangram_sglang.sglang.radix_sessions import SessionRefs


def test_a_named_ratio_holds_for_the_sessions_later_requests_only():
    refs = SessionRefs(enabled=True)
    refs.open("a")
    assert refs.ratio("a", named=False, ratio=None) is None            # nothing named yet: the served one
    assert refs.ratio("a", named=True, ratio=0.25) == 0.25
    assert refs.ratio("a", named=False, ratio=None) == 0.25            # inherited
    assert refs.ratio("b", named=False, ratio=None) is None            # another session
    assert refs.ratio(None, named=False, ratio=None) is None           # no session
    assert refs.ratio("a", named=True, ratio=None) is None             # naming the served ratio sets it
    assert refs.ratio("a", named=False, ratio=None) is None
    assert refs.ratio("a", named=True, ratio=0.7) == 0.7


def test_closing_or_reopening_a_session_forgets_its_ratio():
    refs = SessionRefs(enabled=True)
    refs.open("a")
    refs.ratio("a", named=True, ratio=0.25)
    refs.release("a", root=None)
    assert refs.ratio("a", named=False, ratio=None) is None            # closed: its late requests, the served one
    assert refs.ratio("a", named=True, ratio=0.25) == 0.25 and "a" not in refs.ratios   # nor remembered
    refs.open("a")
    assert refs.ratio("a", named=False, ratio=None) is None
    refs.ratio("a", named=True, ratio=0.25)
    refs.open("a")                                                     # opened again: a new session
    assert refs.ratio("a", named=False, ratio=None) is None
    refs.ratio("a", named=True, ratio=0.25)
    refs.reset()
    assert refs.ratio("a", named=False, ratio=None) is None


def test_without_the_session_radix_cache_a_request_has_only_its_own_ratio():
    refs = SessionRefs(enabled=False)
    assert refs.ratio("a", named=True, ratio=0.25) == 0.25
    assert refs.ratio("a", named=False, ratio=None) is None and refs.ratios == {}


def test_a_request_naming_no_ratio_in_a_session_naming_none_keeps_its_own_on_random_workloads():
    """What makes the change neutral for every figure: no benchmark names a ratio inside a session, and then
    every request is served at the ratio it alone would get (the code before sessions had ratios)."""
    import random

    rng = random.Random(0)
    for enabled in (True, False):
        refs = SessionRefs(enabled=enabled)
        for _ in range(2000):
            sid = rng.choice([None, "a", "b", "c"])
            op = rng.random()
            if op < 0.1 and sid:
                refs.open(sid)
            elif op < 0.2 and sid:
                refs.release(sid, root=None)
            else:
                assert refs.ratio(sid, named=False, ratio=None) is None
        assert refs.ratios == {}
