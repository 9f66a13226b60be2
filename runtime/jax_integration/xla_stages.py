"""hlopt inside XLA's own compile, through XLA's HLO-module transformation stages (`xla/service/xla_transform.cc`).

XLA lets a callback rewrite the module it is compiling at two stages: `PRE_SCHEDULER` and `POST_SCHEDULER`
(scheduled; what is returned is what the executable runs). The callback gets and returns a serialized
`HloModuleProto` (every literal in full). XLA:CPU takes the callback in process (`jax.extend.xla`); plugin
backends (XLA:GPU) through their PJRT C API's xla_transform extension. jax registers the latter only on plugin
clients it initializes itself, and its compile-only (topology) client refuses it; the extension's registry is
global to the plugin library, so for XLA:GPU this module registers through the extension directly
(`gpu_driver.register_xla_transform`): the same callback serves jax's compile-only client and a real GPU client.

Where XLA:GPU 0.10.2 (jax-cuda12-plugin 0.10.2) calls them, established deviceless (tests/test_gpu_hook.py):
`PRE_SCHEDULER` once, early (after the simplifiers, before fusion and layout-sensitive passes: useless to
hlopt's step 3), `POST_SCHEDULER` once, on the fused, laid-out, scheduled module (copy insertion done); what it
returns goes to XLA's post-scheduling passes and backend.

This module registers one callback per (stage, platform), once, and routes it to the transformation of the
compile running now (`transforming`): compiles outside `transforming` pass through untouched, and so do
compiles a transformation starts itself (re-entry). A transformation that raises leaves XLA's module unchanged
and is recorded (`StageRun.errors`). `StageRun.calls` says whether XLA called the stage at all.

    with transforming(lambda m: my_rewrite(m), stage="post-scheduler", platform="cpu") as run:
        compiled = jax.jit(f).lower(x).compile()
    assert run.calls
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hlopt.hlo.ir import Module

__all__ = ["StageRun", "transforming", "STAGES", "registered", "StageGate", "StageStop", "stopping_at"]

#: Stage names (kebab-case) -> jax's PipelineStage member names.
STAGES = {"pre-scheduler": "PRE_SCHEDULER", "post-scheduler": "POST_SCHEDULER"}

_REGISTERED: set[tuple[str, str]] = set()
_ACTIVE: dict[tuple[str, str], StageRun] = {}
_LOCK = threading.RLock()  # one transforming compile at a time: XLA may call back from another thread


class StageStop(Exception):  # noqa: N818 - not an error: a compile stopped on purpose at a stage
    """Raised into XLA by a stage callback to end the compile there (`stopping_at`, `StageGate`): XLA's compile
    then fails with this message."""


@dataclass
class StageRun:
    """One transformation, for the compiles made while it is active."""

    transform: Callable[[Module], Module | str | bytes | None]  # the new module (its HLO text, its proto)
    stage: str
    platform: str
    calls: int = 0
    changed: int = 0
    errors: list[str] = field(default_factory=list)
    module_names: list[str] = field(default_factory=list)
    busy: bool = False  # inside `transform`: compiles it starts itself pass through
    only_module: str | None = None  # transform only modules of this name (another thread's compiles pass)
    only_thread: int | None = None  # transform only compiles of this thread (XLA:GPU calls back on the caller's)

    def apply(self, proto: bytes) -> bytes | None:
        """The callback's work: proto -> hlopt Module -> transform -> proto (None: unchanged; a transform
        returning bytes returns a serialized HloModuleProto, handed to XLA as it is)."""
        from hlopt.hlo.parser import parse
        from hlopt.runtime._xla import full_hlo_text, xla_parse, xla_proto_module

        if self.busy:
            return None
        if self.only_thread is not None and threading.get_ident() != self.only_thread:
            return None
        if self.only_module is not None and _module_name(proto) != self.only_module:
            return None
        self.calls += 1
        self.busy = True
        try:
            module = parse(full_hlo_text(xla_proto_module(proto)), filename=f"<XLA {self.stage} module>")
            self.module_names.append(module.name)
            out = self.transform(module)
            if out is None:
                return None
            self.changed += 1
            if isinstance(out, bytes):
                return out
            return xla_parse(out if isinstance(out, str) else out.to_text()).as_serialized_hlo_module_proto()
        except StageStop:
            raise  # the transformation ends XLA's compile on purpose
        except Exception as e:  # noqa: BLE001 - XLA goes on with its own module; the caller reads `errors`
            self.errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None
        finally:
            self.busy = False


def _module_name(proto: bytes) -> str | None:
    """HloModuleProto's `name` (field 1, a string), read without parsing the module; None if absent."""
    if not proto or proto[0] != 0x0A:
        return None
    size, at, shift = 0, 1, 0
    while at < len(proto):
        byte = proto[at]
        size |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return proto[at:at + size].decode(errors="replace")
    return None


def registered() -> set[tuple[str, str]]:
    """The (stage, platform) pairs whose callback is registered with jax."""
    return set(_REGISTERED)


@dataclass
class StageGate:
    """A compile of one thread met at a stage (`stopping_at`): its module (`proto`, the first call only), and
    what the compile does next. `pause`: the callback waits there until `resume()` (XLA's compile goes on with
    its own module) or `stop()` (it ends with `StageStop`); without it the compile ends at once."""

    stage: str
    pause: bool = False
    proto: bytes | None = None
    #: work done on the module on the compiling thread before it pauses (its result in `prepared`, an exception
    #: raised by it there too): what the waiting thread needs of it, computed while that thread still works
    prepare: Callable[[bytes], Any] | None = None
    prepared: Any = None
    _reached: threading.Event = field(default_factory=threading.Event)
    _verdict: threading.Event = field(default_factory=threading.Event)
    _go_on: bool = False

    def meet(self, proto: bytes) -> None:
        """The callback's work (on the compiling thread): keep the module, wait for the verdict when pausing,
        then return (the compile goes on unchanged) or raise `StageStop`."""
        self.proto = proto
        if self.prepare is not None:
            try:
                self.prepared = self.prepare(proto)
            except Exception as e:  # noqa: BLE001 - handed to the waiting thread
                self.prepared = e
        self._reached.set()
        if self.pause:
            self._verdict.wait()
        if not self._go_on:
            raise StageStop(f"hlopt stopped XLA's compile at its {self.stage} stage")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the compile meets the stage or ends without meeting it (`give_up`); whether either
        happened (`proto` is None in the second case)."""
        return self._reached.wait(timeout)

    def give_up(self) -> None:
        """The compile ended without meeting the stage: wake `wait`."""
        self._reached.set()

    def resume(self) -> None:
        """Let a paused compile go on with its module (a no-op after `stop`)."""
        if not self._verdict.is_set():
            self._go_on = True
            self._verdict.set()

    def stop(self) -> None:
        """End a paused compile at the stage (a no-op after `resume`)."""
        self._verdict.set()


_GATES = threading.local()  # `.gate`: the StageGate of this thread's compile (`stopping_at`)


@contextlib.contextmanager
def stopping_at(stage: str = "post-scheduler", pause: bool = False, gate: StageGate | None = None
                ) -> Iterator[StageGate]:
    """XLA:GPU compiles this thread makes in the block meet a `StageGate` at `stage` (first call only): the
    module there is kept in `gate.proto`, and the compile ends there (`StageStop` raised into XLA: the compile
    fails with its message), or with `pause` waits for the gate's verdict. XLA:GPU only (it calls the stages on
    the compiling thread; XLA:CPU may not), while the stage's callback is registered (inside `transforming`),
    and before a transformation active on this thread. `gate`: one made by another thread, which waits for it
    and gives the verdict; when the block ends, the gate is given up (`wait` returns) if its stage was not met."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    gate = gate or StageGate(stage, pause)
    previous = getattr(_GATES, "gate", None)
    _GATES.gate = gate
    try:
        yield gate
    finally:
        _GATES.gate = previous
        gate.give_up()


def _dispatch(stage: str, platform: str) -> Callable[[bytes], bytes | None]:
    def callback(proto: bytes) -> bytes | None:
        gate = getattr(_GATES, "gate", None)
        if gate is not None and gate.stage == stage and gate.proto is None:
            gate.meet(proto)
            return None
        run = _ACTIVE.get((stage, platform))
        return None if run is None else run.apply(proto)

    return callback


#: Platforms whose stages are reached through the CUDA plugin's xla_transform extension.
PLUGIN_PLATFORMS = frozenset({"cuda", "gpu"})


def _register(stage: str, platform: str) -> None:
    if (stage, platform) in _REGISTERED:
        return
    if platform in PLUGIN_PLATFORMS:
        from hlopt.runtime.xla_gpu_path.gpu_driver import register_xla_transform

        register_xla_transform(_dispatch(stage, platform), name=f"hlopt-{stage}-{platform}", stage=stage)
        _REGISTERED.add((stage, platform))
        return
    from jax.extend.xla import PipelineStage, register_hlo_module_transformation

    register_hlo_module_transformation(_dispatch(stage, platform), name=f"hlopt-{stage}-{platform}",
                                       stage=getattr(PipelineStage, STAGES[stage]), platforms=platform)
    _REGISTERED.add((stage, platform))


def _unregister(stage: str, platform: str) -> None:
    """Take a plugin stage's callback away when no transformation uses it (XLA:GPU serializes every module it
    compiles for a registered callback: compiles outside `transforming` then pay nothing). jax's XLA:CPU
    registrations stay (they cost a dictionary lookup)."""
    if platform not in PLUGIN_PLATFORMS or (stage, platform) not in _REGISTERED:
        return
    from hlopt.runtime.xla_gpu_path.gpu_driver import DriverError, clear_xla_transform

    try:
        clear_xla_transform(f"hlopt-{stage}-{platform}", stage)
    except DriverError:
        return  # it stays registered, and passes every module through untouched
    _REGISTERED.discard((stage, platform))


@contextlib.contextmanager
def transforming(transform: Callable[[Module], Module | str | None], stage: str = "pre-scheduler",
                 platform: str = "cuda", only_module: str | None = None) -> Iterator[StageRun]:
    """Apply `transform` to the module of every compile for `platform` made inside the block, at `stage`
    (`transform` returns the new module, or None to leave XLA's as it is); with `only_module`, only modules of
    that name. On XLA:GPU, which calls the stages on the compiling thread, only this thread's compiles: a
    compile another thread runs meanwhile passes untouched. Compiles through `transforming` are serialized."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    if platform in PLUGIN_PLATFORMS:  # one registry in the plugin library, whatever jax calls the platform
        platform = "gpu"
    run = StageRun(transform, stage, platform, only_module=only_module,
                   only_thread=threading.get_ident() if platform == "gpu" else None)
    with _LOCK:
        _register(stage, platform)
        previous = _ACTIVE.get((stage, platform))
        _ACTIVE[(stage, platform)] = run
        try:
            yield run
        finally:
            if previous is None:
                _ACTIVE.pop((stage, platform), None)
                _unregister(stage, platform)
            else:
                _ACTIVE[(stage, platform)] = previous
