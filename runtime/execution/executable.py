"""Compile and run HLO on XLA:CPU (a local GPU with `compile(target=...)`), and compare two modules' outputs.

Three ways a module runs, chosen by `execution_mode` from its header and annotations:
- "single": one device; inputs and outputs are plain arrays.
- "spmd": a module with shardings still to partition, as `jax.jit` of sharded code (shard_map or
  sharded arguments) lowers it, with Shardy (`xla.sdy` attributes; devices read off the mesh) or GSPMD
  (`sharding={devices=[...]...}`; devices read off the tilings) -- jax prints no `num_partitions`.
  Inputs and outputs are GLOBAL arrays; XLA partitions them over `num_partitions` devices.
- "per-device": modules that are already per device: XLA's optimized SPMD dumps (entry `*_spmd`,
  `num_partitions=N`), `replica_count=N` modules, or any module run with `devices=N` and no shardings.
  Every input is either one array of the parameter's shape (the same on every device) or an array with a
  leading axis of N (slice d goes to device d); every output comes back with a leading axis of N
  (slice d from device d). Device d is `jax.devices("cpu")[d]`, i.e. replica d // partitions,
  partition d % partitions.
Outputs are always flattened in tuple order (a tuple root gives one array per leaf).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hlopt.hlo.attributes import Raw
from hlopt.hlo.ir import Instruction, Module
from hlopt.hlo.shape import TupleShape
from hlopt.hlo.sharding_syntax import Sharding, parse_sharding
from hlopt.runtime._xla import (
    CompiledModule,
    compile_text,
    gpu_devices,
)
from hlopt.runtime.execution.compare import Comparison, compare
from hlopt.runtime.execution.inputs import random_inputs
from hlopt.runtime.execution.reentry import (
    cpu_fusion_kinds_only,
    needs_reentry,
    prepare_for_reentry,
    synchronous_collectives,
)


def _is_shardy(module: Module) -> bool:
    fa = module.config.get("frontend_attributes") or {}
    if any(str(k).startswith("xla.sdy") for k in fa):
        return True
    return any(str(i.get("custom_call_target", "")).startswith("xla.sdy") for i in module.entry.instructions)


def execution_mode(module: Module, devices: int | None = None) -> tuple[str, int, int]:
    """("single" | "spmd" | "per-device", replicas, partitions) for this module (see the module docstring);
    `devices` runs a module with no device count of its own on that many devices."""
    replicas = int(module.config.get("replica_count", 1))
    partitions = int(module.config.get("num_partitions", 1))
    if replicas * partitions == 1:  # jax prints no device count: read it off the mesh / shardings
        partitions = _sdy_mesh_devices(module) if _is_shardy(module) else _gspmd_devices(module)
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
    text = str((module.config.get("frontend_attributes") or {}).get("xla.sdy.meshes", ""))
    best = 1
    for mesh in re.findall(r"#sdy\.mesh<\[([^\]]*)\]", text):
        n = 1
        for size in re.findall(r"=\s*(\d+)", mesh):
            n *= int(size)
        best = max(best, n)
    return best


def _gspmd_devices(module: Module) -> int:
    """Devices the GSPMD shardings of a module span (`{devices=[8,1]<=[8]}` -> 8; 1 if none)."""
    best = 1
    for inst in module.instructions():
        if "sharding" in inst.attrs:
            best = max([best, *(s.device_count for s in _leaves(parse_sharding(str(inst.attrs["sharding"]))))])
    return best


def _leaves(sharding: Sharding | list) -> list[Sharding]:
    """The shardings of a (nested) tuple sharding's leaves."""
    if isinstance(sharding, list):
        return [leaf for element in sharding for leaf in _leaves(element)]
    return [sharding]


def _has_sharding(module: Module) -> bool:
    return _is_shardy(module) or any("sharding" in i.attrs for i in module.entry.instructions)


@dataclass
class Executable:
    """A module compiled by XLA, with what is needed to feed it and read its outputs."""

    compiled: CompiledModule
    mode: str
    param_shapes: list[Any]
    output_shapes: list[Any]
    #: `compile(target=...)` on a GPU host through hlopt's XLA:GPU path: its `reemit.ReemitResult` (the
    #: modules, XLA's estimates of ours and of its default compile, which one the guard kept); None otherwise
    reemit: Any = None

    @property
    def num_devices(self) -> int:
        """Devices it runs on."""
        return self.compiled.num_devices

    @property
    def platform(self) -> str:
        """The platform of its devices ("cpu", "cuda", "rocm")."""
        return self.compiled.devices[0].platform

    def compiled_text(self) -> str:
        """XLA's optimized module."""
        return self.compiled.compiled_text()

    def time_us(self, inputs: Sequence[np.ndarray], repeat: int = 20) -> float:
        """Median time of one run on its devices, in us (inputs transferred once, before timing);
        single-device and per-device modules."""
        if self.mode == "spmd":
            raise ValueError("time_us times single-device and per-device modules")
        n = self.num_devices
        return self.compiled.time_per_device_us(
            [[_device_slice(x, shape, d, n) for d in range(n)] for x, shape in zip(inputs, self.param_shapes,
                                                                                   strict=True)], repeat)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run on `inputs` (see the module docstring for the layout per mode)."""
        if len(inputs) != len(self.param_shapes):
            raise ValueError(f"the module takes {len(self.param_shapes)} argument(s), got {len(inputs)}")
        if self.mode == "spmd":
            args = [_as_param_type(x, shape) for x, shape in zip(inputs, self.param_shapes, strict=True)]
            return self.compiled.execute_global(args, [tuple(s.dims) for s in self.output_shapes])
        n = self.num_devices
        per_device = [[_device_slice(x, shape, d, n) for d in range(n)]
                      for x, shape in zip(inputs, self.param_shapes, strict=True)]
        outs = self.compiled.execute_per_device(per_device)
        if self.mode == "single":
            return [o[0] for o in outs]
        return [np.stack(o) for o in outs]


def _as_param_type(x: Any, shape: Any) -> np.ndarray:
    """`x` as an array of the parameter's element type (f64 data for an f32 parameter is converted)."""
    want = shape.element_type.numpy if shape.is_array else None
    return np.asarray(x) if want is None else np.asarray(x, dtype=want)


def _device_slice(x: np.ndarray, shape: Any, device: int, n: int) -> np.ndarray:
    """Device `device`'s argument for a parameter (the whole array, or its slice `device`)."""
    x = _as_param_type(x, shape)
    dims = tuple(shape.dims)
    if x.shape == dims:
        return x
    if n > 1 and x.shape == (n, *dims):
        return x[device]
    raise ValueError(f"argument of shape {x.shape} does not fit parameter {shape} "
                     + (f"(nor {n} per-device slices of it)" if n > 1 else ""))


def _prepared_text(module: Module, mode: str, partitions: int) -> str:
    """The text to compile; a per-device module on several partitions is marked `sharding={manual}`
    throughout, so XLA's SPMD partitioner (which XLA:CPU requires for partitions) leaves it as it is
    (its own shardings would be partitioned again, and `partition-id` is refused on unmanual code)."""
    if mode != "per-device":
        return module.to_text()
    has_sharding = any("sharding" in i.attrs for i in module.instructions())
    partitioned = partitions > 1
    if not has_sharding and not partitioned:
        return module.to_text()
    marked = module.clone()
    if partitioned:
        _copy_loop_invariants(marked)
        _split_variadic_all_reduces(marked)
    for inst in marked.instructions():
        if partitioned:
            inst.attrs["sharding"] = Raw("{manual}")
        else:
            inst.attrs.pop("sharding", None)
    return marked.to_text()


def _split_variadic_all_reduces(module: Module) -> None:
    """Replace every all-reduce of several operands by one all-reduce per operand and a tuple of them, in
    place (the same values): jaxlib's import validates the variadic op's tuple sharding against each of its
    results, and XLA's SPMD partitioner takes only single-operand all-reduces in manual mode."""
    for comp in module.computations:
        for inst in list(comp.instructions):
            if inst.opcode != "all-reduce" or not isinstance(inst.shape, TupleShape):
                continue
            parts = []
            for operand in inst.operands:
                part = inst.clone(name=module.unique_name(inst.name), operands=[operand])
                part.shape = operand.shape
                parts.append(comp.add(part, before=inst))
            tuple_ = comp.add(Instruction("tuple", inst.shape, parts, name=module.unique_name(inst.name)),
                              before=inst)
            comp.replace_instruction(inst, tuple_)


def _copy_loop_invariants(module: Module) -> None:
    """Pass every loop-invariant while element through a copy, in place: jaxlib's HLO->StableHLO import
    prunes the elements a body passes through unchanged but keeps the loop's tuple sharding whole, and then
    refuses the loop ("has 4 leaf nodes while this sharding has 5"). The copy computes the same value."""
    for inst in list(module.instructions()):
        if inst.opcode != "while":
            continue
        body = inst.attrs["body"]
        root = body.root
        if root.opcode != "tuple" or len(body.parameters) != 1:
            continue
        param = body.parameters[0]
        for index, operand in enumerate(root.operands):
            if (operand.opcode == "get-tuple-element" and operand.operand(0) is param
                    and operand.attrs["index"] == index):
                copy = body.add(Instruction("copy", operand.shape, [operand], name=module.unique_name("invariant")),
                                before=root)
                root.set_operand(index, copy)


def compile(module: Module | str, devices: int | None = None, keep_fusions: bool = False,  # noqa: A001
            target: str | None = None, deviceless: bool | None = None, pipeline: str | None = None,
            xla_flags: str = "", gpu_route: str | None = None) -> Any:
    """Compile a module (or HLO text) for XLA:CPU; `devices` overrides the device count of the header.

    Fusions are inlined for XLA:CPU unless `keep_fusions` (then entry-computation kLoop fusions stay).

    `target="h100"` compiles for XLA:GPU instead, in one of two ways:
    - on a machine with a GPU (jax sees one; `deviceless` not True): an `Executable` that runs on the local
      GPU(s). `gpu_route="hlopt"` (the default for single-device and per-device modules): the very compile of
      the deviceless case below, for the local GPU's model, its kept executable loaded on the local GPU(s)
      (`Executable.reemit` holds the `ReemitResult`), as `hlopt compile` + `runtime.load` would.
      `gpu_route="inline"` (the default for a module with shardings still to partition, which hlopt's path
      cannot load yet, and with `keep_fusions`): XLA:GPU compiles it alone, our fusions inlined, unless
      `keep_fusions` (then XLA compiles ours with its fusion passes and layout assignment off: experimental,
      see `runtime.xla_gpu_path.xla_gpu.module_for_xla_gpu`).
    - without one (or `deviceless=True`): the XLA:GPU path of `runtime.xla_gpu_path.reemit`, deviceless, through
      hlopt's driver (`runtime.xla_gpu_path.xla_gpu`; install: `xla_gpu.INSTALL_COMMAND`): hlopt's passes, XLA:GPU's
      HLO passes with its generic fusion and scheduler off, hlopt's fusion and schedule (`pipeline`,
      default `reemit.AFTER_XLA`), XLA:GPU's backend only. A `reemit.ReemitResult` comes back: the
      scheduled module handed to the backend, XLA's final module, the serialized executable, and the
      report (XLA's estimates for ours and for its default compile, their ratio, fidelity).
      `xla_flags` ("--xla_a=1 --xla_b=false") reach every XLA:GPU run."""
    if target is not None:
        from hlopt.runtime.xla_gpu_path.xla_gpu import check_target

        check_target(target)
        if deviceless is None:
            deviceless = not gpu_devices()
        if deviceless:
            from hlopt.runtime.xla_gpu_path.reemit import AFTER_XLA, compile_for_gpu

            _refuse_elided_text(module if isinstance(module, str) else module.to_text())
            return compile_for_gpu(module, target, devices, after=pipeline or AFTER_XLA, xla_flags=xla_flags)
        module = _parsed(module)
        route = gpu_route or default_gpu_route(module, devices, keep_fusions)
        if route not in GPU_ROUTES:
            raise ValueError(f"gpu_route={route!r}: expected one of {', '.join(GPU_ROUTES)}")
        if route == "hlopt":
            return _compile_on_gpu_through_hlopt(module, devices, pipeline, xla_flags)
        return _compile_on_gpu(module, devices, keep_fusions)
    module = _parsed(module)
    mode, replicas, partitions = execution_mode(module, devices)
    if needs_reentry(module):
        module = prepare_for_reentry(module)
    module = synchronous_collectives(cpu_fusion_kinds_only(module, keep_fusions))
    text = _prepared_text(module, mode, partitions)
    compiled = compile_text(text, replicas, partitions, spmd=partitions > 1,
                            shardy=mode == "spmd" and _is_shardy(module))
    return executable_from(compiled, mode, module)


#: The jax platform `compile(target=...)` runs on when a GPU is present (tests point it at "cpu").
GPU_PLATFORM = "gpu"


#: `compile(target=..., gpu_route=...)` on a GPU host (see `compile`).
GPU_ROUTES = ("hlopt", "inline")


def default_gpu_route(module: Module, devices: int | None, keep_fusions: bool) -> str:
    """"hlopt", except for `keep_fusions` and for modules with shardings still to partition ("inline")."""
    if keep_fusions or execution_mode(module, devices)[0] == "spmd":
        return "inline"
    return "hlopt"


def _compile_on_gpu_through_hlopt(module: Module, devices: int | None, pipeline: str | None,
                                  xla_flags: str) -> Executable:
    """hlopt's XLA:GPU path for this machine's GPU model (deviceless, as `hlopt compile`), the executable the
    guard kept loaded on the local GPU(s)."""
    from hlopt.runtime._xla import platform_devices
    from hlopt.runtime.xla_gpu_path.reemit import AFTER_XLA, compile_for_gpu
    from hlopt.runtime.xla_gpu_path.xla_gpu import TARGETS, load_executable, local_target

    platform_devices(GPU_PLATFORM)  # XlaError in one line without one
    here = local_target()
    if here is None:
        raise ValueError(f"this machine's GPU is none of hlopt's targets ({', '.join(TARGETS)}): "
                         "compile(..., gpu_route='inline') compiles it with XLA:GPU alone")
    result = compile_for_gpu(module, here, devices, after=pipeline or AFTER_XLA, xla_flags=xla_flags)
    executable = load_executable(result.kept_result.executable, module, platform=GPU_PLATFORM)
    executable.reemit = result
    return executable


def _compile_on_gpu(module: Module | str, devices: int | None, keep_fusions: bool) -> Executable:
    """Compile for the local GPU(s) for real (see `compile`)."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import module_for_xla_gpu

    module = _parsed(module)
    mode, replicas, partitions = execution_mode(module, devices)
    if needs_reentry(module):
        module = prepare_for_reentry(module, keep_fusions=True)
    module, disabled = module_for_xla_gpu(synchronous_collectives(module), keep_fusions)
    text = _prepared_text(module, mode, partitions)
    compiled = compile_text(text, replicas, partitions, spmd=partitions > 1,
                            shardy=mode == "spmd" and _is_shardy(module), platform=GPU_PLATFORM,
                            disable_passes=disabled)
    return executable_from(compiled, mode, module)


def _parsed(module: Module | str) -> Module:
    """The module (parsed if text); ElidedLiteralError if a constant's values were elided (`{...}`)."""
    from hlopt.hlo.literal import check_no_elided_constants

    if isinstance(module, str):
        from hlopt.hlo.parser import parse

        module = parse(module)
    check_no_elided_constants(module, "compile")
    return module


def _refuse_elided_text(text: str) -> None:
    if "{...}" in text:
        _parsed(text)


def executable_from(compiled: CompiledModule, mode: str, module: Module) -> Executable:
    """The Executable wrapping a compiled module (inputs and outputs laid out as `module` declares)."""
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
