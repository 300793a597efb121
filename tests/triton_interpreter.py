"""Triton's CPU interpreter without its per-call re-patching of `triton.language` (tests only).

Under TRITON_INTERPRET=1, a kernel launch (GridExecutor.__call__) patches `triton.language` with the
interpreter's semantics, runs the grid and restores it. Every call of a nested `@triton.jit` helper
inside the grid patches it again (InterpretedFunction.__call__ -> _patch_lang): an `inspect.getmembers`
sweep of the language modules per call, about 30% of the interpreter's time in our kernels, and never
restored (triton 3.8). While a launch is running and has patched every language module the helper
sees, the helper's patch changes nothing, so it is skipped. Same semantics: the kernel tests compare
with the torch references either way.
"""

from __future__ import annotations

import functools


def skip_nested_relanguage_patching() -> bool:
    """Install the skip (idempotent); False where the interpreter's internals are not as expected."""
    try:
        from triton import language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    grid_call, fn_call = interp.GridExecutor.__call__, interp.InterpretedFunction.__call__
    if getattr(fn_call, "_tangram_skip", False):
        return True
    if not all(hasattr(interp, n) for n in ("_patch_lang", "InterpreterError")):
        return False
    patched: list[set[int]] = []  # per running launch: ids of the language modules it patched

    def langs(fn) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    @functools.wraps(grid_call)
    def launch(self, *args, **kwargs):
        patched.append(langs(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    @functools.wraps(fn_call)
    def helper(self, *args, **kwargs):
        if not patched or not langs(self.fn) <= patched[-1]:
            return fn_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    helper._tangram_skip = True
    interp.GridExecutor.__call__, interp.InterpretedFunction.__call__ = launch, helper
    return True
