"""hlopt inside XLA's own compile, through jax's HLO-module transformation stages (`jax.extend.xla`).

jax 0.10.2 lets a Python callback rewrite the module XLA is compiling, at two stages of XLA's pipeline:
`PRE_SCHEDULER` (XLA's optimized module, before its scheduler) and `POST_SCHEDULER` (scheduled; what is returned
is what the executable runs). The callback gets and returns a serialized `HloModuleProto` (every literal in
full). In process for XLA:CPU, through the PJRT C API for plugin backends (XLA:GPU).

This module registers one callback per (stage, platform), once, and routes it to the transformation of the
compile running now (`transforming`): compiles outside `transforming` pass through untouched. A transformation
that raises leaves XLA's module unchanged and is recorded (`StageRun.errors`). `StageRun.calls` says whether XLA
called the stage at all: XLA:GPU builds before mid-2026 did not (openxla/xla#43630), and the caller then falls
back (see `runtime.hook`'s GPU route).

    with transforming(lambda m: my_rewrite(m), stage="post-scheduler", platform="cpu") as run:
        compiled = jax.jit(f).lower(x).compile()
    assert run.calls
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hlopt.hlo.ir import Module

__all__ = ["StageRun", "transforming", "STAGES", "registered"]

#: Stage names (kebab-case) -> jax's PipelineStage member names.
STAGES = {"pre-scheduler": "PRE_SCHEDULER", "post-scheduler": "POST_SCHEDULER"}

_REGISTERED: set[tuple[str, str]] = set()
_ACTIVE: dict[tuple[str, str], StageRun] = {}
_LOCK = threading.RLock()  # one transforming compile at a time: XLA may call back from another thread


@dataclass
class StageRun:
    """One transformation, for the compiles made while it is active."""

    transform: Callable[[Module], Module | None]
    stage: str
    platform: str
    calls: int = 0
    changed: int = 0
    errors: list[str] = field(default_factory=list)
    module_names: list[str] = field(default_factory=list)

    def apply(self, proto: bytes) -> bytes | None:
        """The callback's work: proto -> hlopt Module -> transform -> proto (None: unchanged)."""
        from hlopt.hlo.parser import parse
        from hlopt.runtime._xla import full_hlo_text, xla_parse, xla_proto_module

        self.calls += 1
        try:
            module = parse(full_hlo_text(xla_proto_module(proto)), filename=f"<XLA {self.stage} module>")
            self.module_names.append(module.name)
            out = self.transform(module)
            if out is None:
                return None
            self.changed += 1
            return xla_parse(out.to_text()).as_serialized_hlo_module_proto()
        except Exception as e:  # noqa: BLE001 - XLA goes on with its own module; the caller reads `errors`
            self.errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None


def registered() -> set[tuple[str, str]]:
    """The (stage, platform) pairs whose callback is registered with jax."""
    return set(_REGISTERED)


def _dispatch(stage: str, platform: str) -> Callable[[bytes], bytes | None]:
    def callback(proto: bytes) -> bytes | None:
        run = _ACTIVE.get((stage, platform))
        return None if run is None else run.apply(proto)

    return callback


def _register(stage: str, platform: str) -> None:
    from jax.extend.xla import PipelineStage, register_hlo_module_transformation

    if (stage, platform) in _REGISTERED:
        return
    register_hlo_module_transformation(_dispatch(stage, platform), name=f"hlopt-{stage}-{platform}",
                                       stage=getattr(PipelineStage, STAGES[stage]), platforms=platform)
    _REGISTERED.add((stage, platform))


@contextlib.contextmanager
def transforming(transform: Callable[[Module], Module | None], stage: str = "pre-scheduler",
                 platform: str = "cuda") -> Iterator[StageRun]:
    """Apply `transform` to the module of every compile for `platform` made inside the block, at `stage`
    (`transform` returns the new module, or None to leave XLA's as it is). Compiles are serialized while a
    transformation is active."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    run = StageRun(transform, stage, platform)
    with _LOCK:
        _register(stage, platform)
        previous = _ACTIVE.get((stage, platform))
        _ACTIVE[(stage, platform)] = run
        try:
            yield run
        finally:
            if previous is None:
                _ACTIVE.pop((stage, platform), None)
            else:
                _ACTIVE[(stage, platform)] = previous
