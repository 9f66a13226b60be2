"""runtime: capture HLO from JAX, compile and run HLO on XLA (CPU here), compare results.

Three ways a module runs, chosen from its header:
- single device: inputs and outputs are plain arrays;
- SPMD (`num_partitions=N` with shardings, as `jax.jit` of sharded code produces): inputs and outputs
  are global arrays; XLA partitions them;
- per device (already-partitioned modules such as XLA's optimized SPMD dumps, or `replica_count=N`):
  every input is either one array (the same on each device) or an array with a leading axis of N
  (one slice per device); every output comes back with a leading axis of N.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hlo.ir import Module
from runtime._xla import CompiledModule, XlaError, compile_text, xla_canonical_text
from runtime.compare import Comparison, compare
from runtime.hook import Hook, hook, install, uninstall
from runtime.inputs import random_array, random_inputs
from runtime.jit import jit
from runtime.reentry import cpu_fusion_kinds_only, needs_reentry, prepare_for_reentry, synchronous_collectives

__all__ = [
    "capture", "capture_text", "capture_optimized_text", "compile", "execute", "Executable", "XlaError",
    "random_inputs", "random_array", "compare", "Comparison", "xla_canonical_text", "run_and_compare",
    "execution_mode", "jit", "hook", "Hook", "install", "uninstall",
]


def _lowered(fn: Callable, args: Sequence, kwargs: dict) -> Any:
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args, **kwargs)


def capture_text(fn: Callable, *args: Any, **kwargs: Any) -> str:
    """The unoptimized HLO text of `jax.jit(fn)` for these arguments (pytrees and shardings kept)."""
    return _lowered(fn, args, kwargs).as_text(dialect="hlo")


def capture_optimized_text(fn: Callable, *args: Any, **kwargs: Any) -> str:
    """XLA:CPU's after-optimization HLO text of `jax.jit(fn)` for these arguments."""
    return _lowered(fn, args, kwargs).compile().as_text()


def capture(fn: Callable, *args: Any, **kwargs: Any) -> Module:
    """The unoptimized HLO of `jax.jit(fn)` for these arguments, parsed."""
    from hlo.parser import parse

    return parse(capture_text(fn, *args, **kwargs), filename=f"<capture of {getattr(fn, '__name__', 'fn')}>")


def _is_shardy(module: Module) -> bool:
    fa = module.config.get("frontend_attributes") or {}
    if any(str(k).startswith("xla.sdy") for k in fa):
        return True
    return any(str(i.get("custom_call_target", "")).startswith("xla.sdy") for i in module.entry.instructions)


def execution_mode(module: Module, devices: int | None = None) -> tuple[str, int, int]:
    """("single" | "spmd" | "per-device", replicas, partitions) for this module."""
    replicas = int(module.config.get("replica_count", 1))
    partitions = int(module.config.get("num_partitions", 1))
    if partitions == 1 and _is_shardy(module):
        partitions = _sdy_mesh_devices(module)
    if devices is not None and devices > 1 and replicas * partitions == 1:
        partitions = devices if _has_sharding(module) else 1
        replicas = 1 if partitions > 1 else devices
    if replicas * partitions == 1:
        return "single", 1, 1
    if partitions > 1 and not module.entry.name.endswith("_spmd") and _has_sharding(module):
        return "spmd", replicas, partitions
    return "per-device", replicas, partitions


def _sdy_mesh_devices(module: Module) -> int:
    """Devices of the largest Shardy mesh in the header (`#sdy.mesh<["data"=8]>` -> 8)."""
    import re

    text = str((module.config.get("frontend_attributes") or {}).get("xla.sdy.meshes", ""))
    best = 1
    for mesh in re.findall(r"#sdy\.mesh<\[([^\]]*)\]", text):
        n = 1
        for size in re.findall(r"=\s*(\d+)", mesh):
            n *= int(size)
        best = max(best, n)
    return best


def _has_sharding(module: Module) -> bool:
    return _is_shardy(module) or any("sharding" in i.attrs for i in module.entry.instructions)


@dataclass
class Executable:
    """A module compiled by XLA, with what is needed to feed it and read its outputs."""

    compiled: CompiledModule
    mode: str
    param_shapes: list[Any]
    output_shapes: list[Any]

    @property
    def num_devices(self) -> int:
        """Devices it runs on."""
        return self.compiled.num_devices

    def compiled_text(self) -> str:
        """XLA's optimized module."""
        return self.compiled.compiled_text()

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run on `inputs` (see the module docstring for the layout per mode)."""
        if len(inputs) != len(self.param_shapes):
            raise ValueError(f"the module takes {len(self.param_shapes)} argument(s), got {len(inputs)}")
        if self.mode == "spmd":
            return self.compiled.execute_global(list(inputs), [tuple(s.dims) for s in self.output_shapes])
        n = self.num_devices
        per_device = [[_device_slice(x, shape, d, n) for d in range(n)]
                      for x, shape in zip(inputs, self.param_shapes, strict=True)]
        outs = self.compiled.execute_per_device(per_device)
        if self.mode == "single":
            return [o[0] for o in outs]
        return [np.stack(o) for o in outs]


def _device_slice(x: np.ndarray, shape: Any, device: int, n: int) -> np.ndarray:
    x = np.asarray(x)
    dims = tuple(shape.dims)
    if x.shape == dims:
        return x
    if n > 1 and x.shape == (n, *dims):
        return x[device]
    raise ValueError(f"argument of shape {x.shape} does not fit parameter {shape} "
                     + (f"(nor {n} per-device slices of it)" if n > 1 else ""))


def _prepared_text(module: Module, mode: str) -> str:
    if mode != "per-device" or not any("sharding" in i.attrs for c in module.computations for i in c.instructions):
        return module.to_text()
    stripped = module.clone()  # shardings of an already-partitioned module would be partitioned again
    for inst in stripped.instructions():
        inst.attrs.pop("sharding", None)
    return stripped.to_text()


def compile(module: Module | str, devices: int | None = None, keep_fusions: bool = False) -> Executable:  # noqa: A001
    """Compile a module (or HLO text) for XLA:CPU; `devices` overrides the device count of the header.

    Fusions are inlined for XLA:CPU unless `keep_fusions` (then entry-computation kLoop fusions stay)."""
    if isinstance(module, str):
        from hlo.parser import parse

        module = parse(module)
    mode, replicas, partitions = execution_mode(module, devices)
    if needs_reentry(module):
        module = prepare_for_reentry(module)
    module = synchronous_collectives(cpu_fusion_kinds_only(module, keep_fusions))
    text = _prepared_text(module, mode)
    compiled = compile_text(text, replicas, partitions, spmd=partitions > 1,
                            shardy=mode == "spmd" and _is_shardy(module))
    params = [p.shape for p in module.entry.parameters]
    outputs = module.entry.root.shape.leaves() if module.entry.root.shape.is_tuple else [module.entry.root.shape]
    return Executable(compiled, mode, params, outputs)


def execute(module: Module | str | Executable, inputs: Sequence[np.ndarray], devices: int | None = None) -> list[np.ndarray]:
    """Run a module (or compiled Executable) on XLA:CPU; outputs flattened in tuple order."""
    exe = module if isinstance(module, Executable) else compile(module, devices)
    return exe.execute(inputs)


def run_and_compare(before: Module, after: Module, seed: int = 0, rtol: float = 1e-5, atol: float = 1e-5,
                    devices: int | None = None, inputs: Sequence[np.ndarray] | None = None) -> Comparison:
    """Execute `before` and `after` on the same inputs and compare every output (XLA's RunAndCompare)."""
    mode, replicas, partitions = execution_mode(before, devices)
    if inputs is None:
        per_device = replicas * partitions if mode == "per-device" else None
        inputs = random_inputs(before, seed, per_device=per_device)
    expected = execute(before, inputs, devices)
    actual = execute(after, inputs, devices)
    return compare(expected, actual, rtol, atol)
