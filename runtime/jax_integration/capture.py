"""Capture a JAX function's HLO: `capture_text` (jax's lowering, unoptimized), `capture` (parsed) and
`capture_optimized_text` (XLA:CPU's optimized module)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hlopt.hlo.ir import Module


def _lowered(fn: Callable, args: Sequence, kwargs: dict) -> Any:
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args, **kwargs)


def capture_text(fn: Callable, *args: Any, **kwargs: Any) -> str:
    """The unoptimized HLO text of `jax.jit(fn)` for these arguments (pytrees and shardings kept)."""
    from hlopt.runtime._xla import lowered_full_text

    return lowered_full_text(_lowered(fn, args, kwargs))


def capture_optimized_text(fn: Callable, *args: Any, **kwargs: Any) -> str:
    """XLA:CPU's after-optimization HLO text of `jax.jit(fn)` for these arguments."""
    from hlopt.runtime._xla import full_hlo_text

    compiled = _lowered(fn, args, kwargs).compile()
    modules = compiled.runtime_executable().hlo_modules()
    return full_hlo_text(modules[0])


def capture(fn: Callable, *args: Any, **kwargs: Any) -> Module:
    """The unoptimized HLO of `jax.jit(fn)` for these arguments, parsed."""
    from hlopt.hlo.parser import parse

    return parse(capture_text(fn, *args, **kwargs), filename=f"<capture of {getattr(fn, '__name__', 'fn')}>")
