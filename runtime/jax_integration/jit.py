"""`runtime.jit`: a drop-in for `jax.jit` that runs an hlopt pipeline before XLA compiles.

    step = runtime.jit(train_step, pipeline="default", donate_argnums=0)
    params = step(params, batch)          # first call per signature: lower, optimize, compile; then cached
    print(step.stats())

It is `jax.jit` (static_argnums/argnames, donation, shardings, pytrees all as jax does them) whose
compilations run under a `runtime.hook`. `check=True` compares every call that compiled (a new shape,
dtype, pytree structure or static-argument value) with plain `jax.jit` and raises on a difference; with
donated arguments check mode copies the inputs before each call so that the reference run never sees a
donated buffer. A failing pass falls back to the unmodified module with a warning unless `strict=True`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hlopt.runtime.jax_integration.hook import CompileRecord, Hook, PatchLease, swap_thread_hook

__all__ = ["jit", "HloptJitted", "CheckError"]


class CheckError(AssertionError):
    """The optimized program's first result differs from plain jax.jit's."""


class HloptJitted:
    """A jitted function whose compilations go through an hlopt pipeline."""

    def __init__(self, fn: Callable, pipeline: str, check: bool, strict: bool, rtol: float, atol: float,
                 guard: bool = True, **jit_kwargs: Any):
        import jax

        self.fn = fn
        self.pipeline = pipeline
        self.check = check
        self.rtol, self.atol = rtol, atol
        self.hook = Hook(pipeline, strict=strict, guard=guard)
        self._lease = PatchLease()  # jax stays patched while this function lives; calls only name the hook

        @functools.wraps(fn)
        def own(*args: Any, **kwargs: Any) -> Any:  # a callable of our own: jax's caches keyed on `fn`
            return fn(*args, **kwargs)  # must not hand us an executable compiled without the hook

        self._jitted = jax.jit(own, **jit_kwargs)
        self._plain = jax.jit(fn, **jit_kwargs) if check else None
        self._donates = bool(jit_kwargs.get("donate_argnums") not in (None, ()) or
                             jit_kwargs.get("donate_argnames") not in (None, ()))
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled_before = len(self.hook.records)
        reference_args = _copied((args, kwargs)) if self.check and self._donates else (args, kwargs)
        previous = swap_thread_hook(self.hook)
        try:
            out = self._jitted(*args, **kwargs)
        finally:
            swap_thread_hook(previous)
        if self.check and len(self.hook.records) > compiled_before:  # this call compiled: check it
            ref_args, ref_kwargs = reference_args
            self._compare(out, self._plain(*ref_args, **ref_kwargs))
        return out

    def _compare(self, got: Any, want: Any) -> None:
        import jax
        import numpy as np
        from hlopt.runtime.execution.compare import compare

        result = compare([np.asarray(x) for x in jax.tree.leaves(want)], [np.asarray(x) for x in jax.tree.leaves(got)],
                         self.rtol, self.atol)
        if not result.ok:
            raise CheckError(f"hlopt pipeline {self.pipeline!r} changed the results:\n{result}")

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """jax's Lowered for these arguments (unoptimized); its `compile()` goes through the pipeline (jax's
        ahead-of-time compile, e.g. for a GPU topology without a GPU)."""
        return HookedLowered(self._jitted.lower(*args, **kwargs), self.hook)

    @property
    def records(self) -> list[CompileRecord]:
        """One record per compiled module."""
        return self.hook.records

    def stats(self) -> str:
        """What the pipeline did, per compiled module and per pass."""
        lines = []
        for r in self.records:
            lines.append(r.summary())
            for p in r.passes:
                if p.changed:
                    lines.append(f"    {p.name}: {p.instructions_before} -> {p.instructions_after} "
                                 f"({p.seconds * 1e3:.1f} ms)")
        return "\n".join(lines) or "nothing compiled yet"


class HookedLowered:
    """jax's `Lowered` whose `compile()` runs under the function's hook; everything else is jax's."""

    def __init__(self, lowered: Any, hook: Hook) -> None:
        self._lowered = lowered
        self._hook = hook

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        """jax's `Lowered.compile`, through the pipeline."""
        previous = swap_thread_hook(self._hook)
        try:
            return self._lowered.compile(*args, **kwargs)
        finally:
            swap_thread_hook(previous)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lowered, name)


def _copied(tree: Any) -> Any:
    """A copy of every array leaf (the reference run of a donating function needs its own buffers)."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x, tree)


def jit(fn: Callable | None = None, pipeline: str = "default", *, check: bool = False, strict: bool = False,
        rtol: float = 1e-5, atol: float = 1e-5, guard: bool = True, **jit_kwargs: Any) -> Any:
    """`jax.jit` with an hlopt pipeline before XLA compiles (usable as a decorator with arguments); `guard`: on
    a GPU, keep XLA's default compile where XLA's estimates rate it faster (`runtime.hook`)."""
    if fn is None:
        return lambda f: HloptJitted(f, pipeline, check, strict, rtol, atol, guard, **jit_kwargs)
    return HloptJitted(fn, pipeline, check, strict, rtol, atol, guard, **jit_kwargs)
