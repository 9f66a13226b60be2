"""A pre-compile hook for JAX: every `jax.jit` compile goes through an hlopt pipeline first.

    with runtime.hook("call-inliner,simplify"):
        train_step(params, batch)          # compiled from the optimized HLO

The one JAX internal patched is `jax._src.compiler.backend_compile_and_load` (jax 0.10.2): the hook
converts the StableHLO module jax hands to XLA into HLO, runs the pipeline, and gives XLA the result. A
pass that fails is reported as a warning and the unmodified module is compiled, unless `strict=True`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Hook", "hook", "install", "uninstall", "CompileRecord", "HookWarning"]


class HookWarning(UserWarning):
    """A pipeline failed inside the hook; the unmodified module was compiled instead."""


@dataclass
class CompileRecord:
    """What the hook did to one compiled module."""

    module: str
    pipeline: str
    instructions_before: int
    instructions_after: int
    passes: list[Any] = field(default_factory=list)  # PassRecord
    seconds: float = 0.0
    fell_back: str | None = None
    modeled_us_before: float | None = None
    modeled_us_after: float | None = None

    def summary(self) -> str:
        """One line."""
        status = f"fell back ({self.fell_back})" if self.fell_back else "optimized"
        modeled = ""
        if self.modeled_us_before is not None and self.modeled_us_after is not None:
            modeled = f", modeled {self.modeled_us_before:.1f} -> {self.modeled_us_after:.1f} us"
        return (f"{self.module}: {status} by {self.pipeline!r}: {self.instructions_before} -> "
                f"{self.instructions_after} instructions in {self.seconds * 1e3:.1f} ms{modeled}")


class Hook:
    """A pipeline applied to every module jax compiles while installed."""

    def __init__(self, pipeline: str = "default", strict: bool = False, verify_each: bool = False,
                 device: str | None = "h100"):
        self.pipeline = pipeline
        self.strict = strict
        self.verify_each = verify_each
        self.device = device
        self.records: list[CompileRecord] = []

    def transform(self, hlo_text: str, name: str, for_cpu: bool = False) -> str:
        """The pipeline applied to one module's HLO text (the input text back on a lenient failure);
        `for_cpu` also inlines the fusions XLA:CPU cannot take (saving a parse/print of the result)."""
        import hlo
        from passes.pipeline import Pipeline

        start = time.perf_counter()
        module = hlo.parse(hlo_text, filename=f"<jax module {name}>")
        record = CompileRecord(name, self.pipeline, module.instruction_count(), module.instruction_count())
        record.modeled_us_before = _modeled(module, self.device)
        try:
            result = Pipeline.parse(self.pipeline, verify_each=self.verify_each, check_changed=False).run(module)
            record.passes = result.records
            record.instructions_after = module.instruction_count()
            record.modeled_us_after = _modeled(module, self.device)
            if for_cpu:
                from runtime.reentry import cpu_fusion_kinds_only

                module = cpu_fusion_kinds_only(module)
            out = module.to_text()
        except Exception as e:  # noqa: BLE001 - a training run must not die because an optimization failed
            if self.strict:
                raise
            record.fell_back = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            warnings.warn(f"hlopt: pipeline failed on {name}; compiling the unmodified module: {e}", HookWarning,
                          stacklevel=3)
            out = hlo_text
        record.seconds = time.perf_counter() - start
        self.records.append(record)
        return out


def _modeled(module, device: str | None) -> float | None:
    if device is None:
        return None
    try:
        from cost_model import module_time_us

        return module_time_us(module, device)
    except Exception:  # noqa: BLE001 - the estimate is informational only
        return None


_lock = threading.Lock()
_active: list[Hook] = []
_original = None


def _patched_backend_compile_and_load(backend, module, executable_devices, options, host_callbacks):
    hooks = list(_active)
    if not hooks or host_callbacks:
        return _original(backend, module, executable_devices, options, host_callbacks)
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir

    from runtime._xla import xla_parse

    name = ir.StringAttr(module.operation.attributes["sym_name"]).value
    bytecode = _module_bytecode(module)
    computation = _jax.mlir.mlir_module_to_xla_computation(bytecode, use_tuple_args=False, return_tuple=False)
    text = computation.as_hlo_text()
    on_cpu = getattr(backend, "platform", "cpu") == "cpu"
    for i, h in enumerate(hooks):
        text = h.transform(text, name, for_cpu=on_cpu and i == len(hooks) - 1)
    if on_cpu and len(hooks) > 1 and hooks[-1].records[-1].fell_back:  # an earlier hook's fusions remain
        text = _for_cpu(text)
    new_module = _jax.mlir.hlo_to_stablehlo(xla_parse(text).as_serialized_hlo_module_proto())
    return backend.compile_and_load(new_module, executable_devices=executable_devices, compile_options=options)


def _for_cpu(text: str) -> str:
    """XLA:CPU re-fuses by itself and cannot take every fusion through StableHLO: inline ours."""
    import hlo
    from runtime.reentry import cpu_fusion_kinds_only

    module = hlo.parse(text)
    prepared = cpu_fusion_kinds_only(module)
    return text if prepared is module else prepared.to_text()


def _module_bytecode(module) -> bytes:
    from jax._src.interpreters import mlir

    return mlir.module_to_bytecode(module)


def install(h: Hook) -> Hook:
    """Route jax compiles through `h` until `uninstall(h)`."""
    global _original
    from jax._src import compiler

    with _lock:
        if _original is None:
            _original = compiler.backend_compile_and_load
            compiler.backend_compile_and_load = _patched_backend_compile_and_load
        _active.append(h)
    return h


def uninstall(h: Hook) -> None:
    """Stop routing compiles through `h` (restores jax when no hook is left)."""
    global _original
    from jax._src import compiler

    with _lock:
        if h in _active:
            _active.remove(h)
        if not _active and _original is not None:
            compiler.backend_compile_and_load = _original
            _original = None


@contextlib.contextmanager
def hook(pipeline: str = "default", strict: bool = False, verify_each: bool = False) -> Iterator[Hook]:
    """A context under which every jax compile runs `pipeline` first."""
    h = install(Hook(pipeline, strict, verify_each))
    try:
        yield h
    finally:
        uninstall(h)
