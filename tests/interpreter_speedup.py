"""The Triton interpreter without its redundant re-patching of triton.language (CPU runs
under TRITON_INTERPRET=1).

Triton 3.6's interpreter patches triton.language's builtins (``_patch_lang``: an
``inspect.getmembers`` over tl, tl.tensor and tl.math, and a wrapper set per builtin) when a
kernel's grid starts, restoring them when it ends; and again on every call of a
``@triton.jit`` device function inside the grid, where they are patched already. The
verify kernels make thousands of such calls per launch: under the interpreter a third of
an interpreted verify test's time went there (cProfile, one top-k / top-p hypothesis
example: ``_patch_lang`` 21 of 57 s). Here a device function's call skips the patch when
the language modules its globals hold are patched already in its grid (by the grid, or
by an earlier device call that saw another module); a jit function called outside a grid
patches as before. The patches are functions of those modules alone (not of the function), so what
runs is what the interpreter runs.
"""

from __future__ import annotations

import inspect

import triton
import triton.language as tl

# The Triton releases whose interpreter this was read against.
RELEASES = ("3.6.",)
# Device functions' calls that skipped the patch, and patches made (tests read them).
COUNTS = {"skipped": 0, "patched": 0}


def _languages(fn) -> frozenset[int]:
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def install() -> bool:
    """Installs the skip where the interpreter is one of RELEASES; whether it did."""
    from triton.runtime import interpreter

    grid_call = getattr(interpreter.GridExecutor, "__call__", None)
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_class = getattr(interpreter, "_LangPatchScope", None)
    if (not triton.__version__.startswith(RELEASES) or grid_call is None or patch_lang is None
            or scope_class is None or getattr(interpreter, "_specops_speedup", False)):
        return False
    state = {"launching": False, "patched": None}  # the running grid's language modules

    def launch(self, *args, **kwargs):
        state["launching"] = True
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            state["launching"] = False

    def patch(fn):
        if state["launching"]:  # the grid's own patch: restored when the grid ends
            state["launching"] = False
            COUNTS["patched"] += 1
            scope = patch_lang(fn)
            state["patched"] = _languages(fn)
            restore = scope.restore

            def restore_and_forget():
                state["patched"] = None
                restore()

            scope.restore = restore_and_forget
            return scope
        if state["patched"] is None:  # a jit function called outside a grid
            COUNTS["patched"] += 1
            return patch_lang(fn)
        languages = _languages(fn)
        if languages <= state["patched"]:
            COUNTS["skipped"] += 1
            return scope_class()  # a device function's call: patched already
        # A device function seeing another module (tl.sum and the rest of triton.language's
        # own jit functions see tl.core): patched as the interpreter does, never restored,
        # and not again in this grid.
        COUNTS["patched"] += 1
        scope = patch_lang(fn)
        state["patched"] = state["patched"] | languages
        return scope

    interpreter.GridExecutor.__call__ = launch
    interpreter._patch_lang = patch
    interpreter._specops_speedup = True
    return True
