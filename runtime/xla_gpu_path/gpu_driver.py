"""hlopt's XLA:GPU driver: XLA's real GPU compiler, deviceless, through the CUDA plugin's PJRT C API.

Runs in an environment that has `jax-cuda12-plugin==0.10.2` (the `gpu-compile` extra). `hlopt compile` and
`runtime.xla_gpu_path.reemit` run it in its own process (started by `hlopt.runtime.xla_gpu_path.xla_gpu`), so that the plugin never loads
into the caller's jax and an XLA abort does not take the caller down. The hook's GPU route calls it in process
(`register_xla_transform`, `compile_deviceless(..., backend_only=True)`), where jax has loaded the plugin
already (a GPU backend or jax's compile-only topology client):

    python -m hlopt.runtime.xla_gpu_path.gpu_driver IN.hlo --spec SPEC.txtpb --out DIR [--devices N]
        [--disable-passes a,b] [--xla-flags "--xla_x=1 --xla_y=false"] [--backend-only]
    python -m hlopt.runtime.xla_gpu_path.gpu_driver --check        # exit 0 when the plugin loads

Writes DIR/final.hlo (XLA's final module, fusions carrying XLA's per-fusion estimates in their
backend_config when the target has cost-model data), DIR/executable.bin (the serialized executable) and
DIR/driver.json (memory statistics, XLA's cost analysis, warnings, compile seconds). Errors: exit status 2 and one line
`gpu_driver: error: ...` on stderr.

Why the C API: jax's compile path takes StableHLO, which cannot carry HLO fusions or a schedule, and
jaxlib has no deviceless compile for a plugin; `PJRT_Compile` takes an `HloModuleProto` and a
`PJRT_TopologyDescription` made from the target config, and needs no device. The function-table slots and
argument structs below follow `xla/pjrt/c/pjrt_c_api.h` (append-only ABI) at the XLA revision that
jax 0.10.2 pins: keep jax and jax-cuda12-plugin at 0.10.2.

This file imports nothing from hlopt, so it also runs as a plain script in a venv without hlopt.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Slots in PJRT_Api's table of functions (after struct_size, extension_start, pjrt_api_version).
_ERROR_DESTROY, _ERROR_MESSAGE, _PLUGIN_INITIALIZE = 0, 1, 3
_EXECUTABLE_DESTROY, _EXECUTABLE_OPTIMIZED_PROGRAM, _EXECUTABLE_SERIALIZE = 40, 48, 49
_EXECUTABLE_COST_ANALYSIS = 46  # PJRT_Executable_GetCostAnalysis (after SizeOfGeneratedCodeInBytes)
_TOPOLOGY_CREATE, _TOPOLOGY_DESTROY, _COMPILE, _EXECUTABLE_MEMORY_STATS = 82, 83, 89, 96
_API_HEADER_BYTES = 40  # size_t struct_size, void* extension_start, PJRT_Api_Version (3 x 8 bytes)
_NAMED_VALUE_STRING = 0  # PJRT_NamedValue_Type::PJRT_NamedValue_kString
_MEMORY_FIELDS = ("generated_code", "argument", "output", "alias", "temp", "host_generated_code",
                  "host_argument", "host_output", "host_alias", "host_temp", "peak_memory", "total_size")

_P, _SIZE, _STR = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p


def _args(name: str, *fields: tuple[str, Any]) -> type[ctypes.Structure]:
    """A PJRT_*_Args struct: every one starts with struct_size and extension_start."""
    return type(name, (ctypes.Structure,), {"_fields_": [("struct_size", _SIZE), ("extension_start", _P),
                                                         *fields]})


_ErrorArgs = _args("ErrorArgs", ("error", _P), ("message", _P), ("message_size", _SIZE))
_PointerArgs = _args("PointerArgs", ("pointer", _P))
_NamedValue = _args("NamedValue", ("name", _STR), ("name_size", _SIZE), ("type", ctypes.c_int),
                    ("value", _STR), ("value_size", _SIZE))
_TopologyArgs = _args("TopologyArgs", ("name", _STR), ("name_size", _SIZE), ("options", _P),
                      ("num_options", _SIZE), ("topology", _P))
_Program = _args("Program", ("code", _P), ("code_size", _SIZE), ("format", _STR), ("format_size", _SIZE))
_CompileArgs = _args("CompileArgs", ("topology", _P), ("program", _P), ("options", _STR),
                     ("options_size", _SIZE), ("client", _P), ("executable", _P))
_ProgramArgs = _args("ProgramArgs", ("executable", _P), ("program", _P))
_SerializeArgs = _args("SerializeArgs", ("executable", _P), ("bytes", _P), ("bytes_size", _SIZE),
                       ("serialized", _P), ("deleter", _P))


class _NamedValueData(ctypes.Union):
    """PJRT_NamedValue's value union."""

    _fields_ = [("string_value", _P), ("int64_value", ctypes.c_int64), ("int64_array_value", _P),
                ("float_value", ctypes.c_float), ("bool_value", ctypes.c_bool)]


_NamedValueOut = _args("NamedValueOut", ("name", _P), ("name_size", _SIZE), ("type", ctypes.c_int),
                       ("data", _NamedValueData), ("value_size", _SIZE))
_CostArgs = _args("CostArgs", ("executable", _P), ("num_properties", _SIZE), ("properties", _P))
_MemoryArgs = _args("MemoryArgs", ("executable", _P), *[(f, ctypes.c_int64) for f in _MEMORY_FIELDS])


class DriverError(RuntimeError):
    """XLA (or the plugin) refused the request; the message is XLA's."""


class _Plugin:
    """The CUDA plugin's PJRT C API, loaded from the installed `jax_plugins.xla_cuda12`."""

    def __init__(self) -> None:
        try:
            spec = importlib.util.find_spec("jax_plugins.xla_cuda12")
        except ImportError:  # no jax_plugins package at all
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise DriverError("jax-cuda12-plugin is not installed in this environment")
        library = Path(list(spec.submodule_search_locations)[0]) / "xla_cuda_plugin.so"
        api = ctypes.CFUNCTYPE(_P)(("GetPjrtApi", ctypes.CDLL(str(library))))()
        api_size = _SIZE.from_address(api).value
        self._table = (_P * ((api_size - _API_HEADER_BYTES) // 8)).from_address(api + _API_HEADER_BYTES)
        self.call(_PLUGIN_INITIALIZE, _args("InitArgs")())

    def call(self, slot: int, args: ctypes.Structure) -> Any:
        """Call function `slot` with `args`; DriverError with the plugin's message on failure."""
        args.struct_size = ctypes.sizeof(args)
        error = ctypes.CFUNCTYPE(_P, _P)(self._table[slot])(ctypes.addressof(args))
        if error:
            raise DriverError(self._consume_error(error))
        return args

    def _consume_error(self, error: int) -> str:
        message = _ErrorArgs(error=error)
        message.struct_size = ctypes.sizeof(message)
        ctypes.CFUNCTYPE(_P, _P)(self._table[_ERROR_MESSAGE])(ctypes.addressof(message))
        text = ctypes.string_at(message.message, message.message_size).decode(errors="replace")
        ctypes.CFUNCTYPE(_P, _P)(self._table[_ERROR_DESTROY])(ctypes.addressof(message))
        return text

    def topology(self, target_config: str, devices: int) -> int:
        """A PJRT_TopologyDescription for `devices` GPUs described by a GpuTargetConfig text proto."""
        values = [(b"target_config", target_config.encode()), (b"topology", f"1x1x{devices}".encode())]
        named = (_NamedValue * len(values))(*[
            _NamedValue(ctypes.sizeof(_NamedValue), None, k, len(k), _NAMED_VALUE_STRING, v, len(v))
            for k, v in values])
        args = _TopologyArgs(name=b"", name_size=0, options=ctypes.addressof(named), num_options=len(values))
        return self.call(_TOPOLOGY_CREATE, args).topology

    def compile(self, topology: int, module_proto: bytes, options: bytes) -> int:
        """PJRT_Compile of an HloModuleProto; the PJRT_Executable."""
        code = ctypes.create_string_buffer(module_proto, len(module_proto))
        program = _Program(ctypes.sizeof(_Program), None, ctypes.addressof(code), len(module_proto), b"hlo", 3)
        args = _CompileArgs(topology=topology, program=ctypes.addressof(program), options=options,
                            options_size=len(options))
        return self.call(_COMPILE, args).executable

    def optimized_program(self, executable: int) -> tuple[bytes, str]:
        """The executable's optimized module: (serialized proto, format name)."""
        program = _Program(ctypes.sizeof(_Program), None, None, 0, b"hlo", 3)
        self.call(_EXECUTABLE_OPTIMIZED_PROGRAM, _ProgramArgs(executable=executable,
                                                             program=ctypes.addressof(program)))
        buffer = ctypes.create_string_buffer(program.code_size)  # first call only sets code_size
        program.code = ctypes.addressof(buffer)
        self.call(_EXECUTABLE_OPTIMIZED_PROGRAM, _ProgramArgs(executable=executable,
                                                             program=ctypes.addressof(program)))
        return buffer.raw[:program.code_size], ctypes.string_at(program.format, program.format_size).decode()

    def serialize(self, executable: int) -> bytes:
        """PJRT_Executable_Serialize: the executable as bytes."""
        args = self.call(_EXECUTABLE_SERIALIZE, _SerializeArgs(executable=executable))
        data = ctypes.string_at(args.bytes, args.bytes_size)
        if args.deleter:
            ctypes.CFUNCTYPE(None, _P)(args.deleter)(args.serialized)
        return data

    def memory_stats(self, executable: int) -> dict[str, int]:
        """PJRT_Executable_GetCompiledMemoryStats, the non-zero fields."""
        stats = self.call(_EXECUTABLE_MEMORY_STATS, _MemoryArgs(executable=executable))
        return {f"{f}_bytes": getattr(stats, f) for f in _MEMORY_FIELDS if getattr(stats, f)}

    def cost_analysis(self, executable: int) -> dict[str, float]:
        """PJRT_Executable_GetCostAnalysis: XLA:GPU's HloCostAnalysis totals of the executable (flops,
        bytes accessed, ...), numeric properties only."""
        args = self.call(_EXECUTABLE_COST_ANALYSIS, _CostArgs(executable=executable))
        values = (_NamedValueOut * args.num_properties).from_address(args.properties) if args.num_properties \
            else []
        readers = {1: lambda d: float(d.int64_value), 3: lambda d: float(d.float_value),
                   4: lambda d: float(d.bool_value)}
        return {ctypes.string_at(v.name, v.name_size).decode(): readers[v.type](v.data)
                for v in values if v.type in readers}

    def destroy(self, slot: int, pointer: int) -> None:
        """Destroy an executable or a topology."""
        self.call(slot, _PointerArgs(pointer=pointer))


# ----------------------------------------------------------------------------- the xla_transform extension
# `xla/pjrt/c/pjrt_c_api_xla_transform_extension.h` (extension version 1): XLA calls a registered callback with the
# module at its PRE_SCHEDULER / POST_SCHEDULER stage (`xla/service/xla_transform.cc`, ApplyXlaTransforms). The
# registry is global to the plugin library, not per client: a transformation registered here applies to every
# compile of the plugin in this process, jax's compile-only (topology) client included, which refuses jax's own
# `register_xla_transform_c_api`.
_EXTENSION_TYPE_XLA_TRANSFORM = 24  # PJRT_Extension_Type_XlaTransform
_XLA_TRANSFORM_VERSION = 1  # PJRT_API_XLA_TRANSFORM_EXTENSION_VERSION
STAGE_NUMBERS = {"pre-scheduler": 0, "post-scheduler": 1}  # PJRT_XlaTransform_PipelineStage


class _TransformString(ctypes.Structure):
    _fields_ = [("data", _P), ("size", _SIZE)]


class _TransformHeader(ctypes.Structure):
    """PJRT_XlaTransform_version_and_error."""

    _fields_ = [("api_version", ctypes.c_int64), ("data", _P), ("cleanup_fn", _P), ("has_error", ctypes.c_bool),
                ("code", ctypes.c_int), ("error_msg", _TransformString)]


class _TransformArgs(ctypes.Structure):
    """PJRT_XlaTransform_Args."""

    _fields_ = [("struct_size", _SIZE), ("header", _TransformHeader), ("hlo_module", _TransformString),
                ("transformed_hlo_module", _TransformString), ("changed", ctypes.c_bool)]


_TRANSFORM_FN = ctypes.CFUNCTYPE(None, _P, ctypes.POINTER(_TransformArgs))
_DTOR_FN = ctypes.CFUNCTYPE(None, _P)


class _TransformCallbacks(ctypes.Structure):
    """PJRT_XlaTransform_Callbacks."""

    _fields_ = [("version", ctypes.c_int64), ("dtor", _DTOR_FN), ("transform_hlo_module", _TRANSFORM_FN)]


_RegisterTransformArgs = type("RegisterTransformArgs", (ctypes.Structure,), {"_fields_": [
    ("struct_size", _SIZE), ("name", _STR), ("name_size", _SIZE), ("stage", ctypes.c_int),
    ("callbacks", ctypes.POINTER(_TransformCallbacks))]})
_ClearTransformArgs = type("ClearTransformArgs", (ctypes.Structure,), {"_fields_": [
    ("struct_size", _SIZE), ("stage", ctypes.c_int), ("name", _STR), ("name_size", _SIZE),
    ("callbacks", ctypes.POINTER(_TransformCallbacks)), ("cleared", ctypes.c_bool)]})
_KEEP_ALIVE: list[Any] = []  # registered callbacks live as long as the process (the C API keeps pointers)


def plugin_api() -> int:
    """The CUDA plugin's PJRT_Api pointer (the library loaded once per process: jax's, where jax loaded it)."""
    try:
        spec = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DriverError("jax-cuda12-plugin is not installed in this environment")
    library = Path(list(spec.submodule_search_locations)[0]) / "xla_cuda_plugin.so"
    return ctypes.CFUNCTYPE(_P)(("GetPjrtApi", ctypes.CDLL(str(library))))()


def _extension(api: int, kind: int) -> int | None:
    """The address of the plugin's extension of type `kind` (PJRT_Extension_Base chain), None without it."""
    ext = _P.from_address(api + 8).value
    while ext:
        if ctypes.c_int.from_address(ext + 8).value == kind:
            return ext
        ext = _P.from_address(ext + 16).value
    return None


def clear_xla_transform(name: str, stage: str = "post-scheduler") -> bool:
    """Unregister the transformation registered under `name` at `stage`; whether there was one (XLA then stops
    serializing every module for it). DriverError when the plugin has no such extension."""
    ext = _extension(plugin_api(), _EXTENSION_TYPE_XLA_TRANSFORM)
    if ext is None or ctypes.c_size_t.from_address(ext).value < 40:  # no clear_xla_transform slot
        raise DriverError("the CUDA plugin's xla_transform extension cannot clear a transformation")
    clear = ctypes.CFUNCTYPE(_P, ctypes.POINTER(_ClearTransformArgs))(_P.from_address(ext + 32).value)
    encoded = name.encode()
    args = _ClearTransformArgs(ctypes.sizeof(_ClearTransformArgs), STAGE_NUMBERS[stage], encoded, len(encoded),
                               None, False)
    error = clear(ctypes.byref(args))
    if error:
        raise DriverError(f"clearing the {stage} transformation {name!r} failed (PJRT error {error:#x})")
    return bool(args.cleared)


def register_xla_transform(callback: Any, name: str, stage: str = "post-scheduler") -> None:
    """Register `callback(proto: bytes) -> bytes | None` with the plugin's xla_transform extension at `stage`
    (for the whole process, until `clear_xla_transform(name, stage)`; what it needs stays alive as long as the
    process). A callback that raises makes XLA's compile fail with its message. DriverError when the plugin has
    no such extension."""
    ext = _extension(plugin_api(), _EXTENSION_TYPE_XLA_TRANSFORM)
    if ext is None:
        raise DriverError("the CUDA plugin has no xla_transform extension")
    register = ctypes.CFUNCTYPE(_P, ctypes.POINTER(_RegisterTransformArgs))(_P.from_address(ext + 24).value)
    last: dict[int, Any] = {}  # per calling thread: compiles on two threads call back at the same time

    def transform(_callbacks: int, args_pointer: Any) -> None:
        args = args_pointer.contents
        try:
            out = callback(ctypes.string_at(args.hlo_module.data, args.hlo_module.size))
        except BaseException as e:  # noqa: BLE001 - an exception must not cross the C boundary
            message = ctypes.create_string_buffer(f"{type(e).__name__}: {e}".encode()[:4000])
            last[threading.get_ident()] = message
            args.header.has_error = True
            args.header.code = 13  # PJRT_Error_Code_INTERNAL
            args.header.error_msg = _TransformString(ctypes.addressof(message), len(message.value))
            return
        if out is None:
            args.changed = False
            return
        buffer = ctypes.create_string_buffer(out, len(out))
        last[threading.get_ident()] = buffer  # XLA parses it when the callback returns: the thread's latest lives
        args.transformed_hlo_module = _TransformString(ctypes.addressof(buffer), len(out))
        args.changed = True

    function = _TRANSFORM_FN(transform)
    callbacks = _TransformCallbacks(_XLA_TRANSFORM_VERSION, _DTOR_FN(0), function)
    encoded = name.encode()
    args = _RegisterTransformArgs(ctypes.sizeof(_RegisterTransformArgs), encoded, len(encoded),
                                  STAGE_NUMBERS[stage], ctypes.pointer(callbacks))
    _KEEP_ALIVE.extend([function, callbacks, encoded, args, last])
    error = register(ctypes.byref(args))
    if error:
        raise DriverError(f"registering the {stage} transformation failed (PJRT error {error:#x})")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """A protobuf varint at `at`: (value, index after it)."""
    value, shift = 0, 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def module_proto_of(program: bytes, program_format: str) -> bytes:
    """The HloModuleProto inside an optimized program (`hlo_with_config` wraps it as field 1)."""
    if program_format != "hlo_with_config":
        return program
    if program[0] != 0x0A:  # field 1, length-delimited
        raise DriverError(f"unexpected HloModuleProtoWithConfig layout (first byte {program[0]:#x})")
    size, start = _varint(program, 1)
    return program[start:start + size]


#: executable_build_options (field 3 of CompileOptionsProto) { run_backend_only (field 11): true }.
#: Appended to a serialized CompileOptionsProto it merges into the existing message (jaxlib has no setter).
RUN_BACKEND_ONLY = bytes([3 << 3 | 2, 2, 11 << 3 | 0, 1])


def parse_xla_flags(flags: str) -> dict[str, Any]:
    """`--xla_a=1 --xla_b --xla_c=false` -> {"xla_a": 1, "xla_b": True, "xla_c": False}."""
    out: dict[str, Any] = {}
    for flag in flags.split():
        if not flag.startswith("--"):
            raise DriverError(f"XLA flag {flag!r} does not start with '--'")
        name, _, value = flag[2:].partition("=")
        out[name] = _flag_value(value) if _ else True
    return out


def _flag_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def compile_options(devices: int, disable_passes: str, flags: dict[str, Any], backend_only: bool,
                    cost_stats: bool) -> bytes:
    """The serialized CompileOptionsProto for one compile."""
    from jax._src import compiler

    options = compiler.get_compile_options(num_replicas=1, num_partitions=devices)
    flags = dict(flags)
    disabled = [p for p in (disable_passes, str(flags.pop("xla_disable_hlo_passes", ""))) if p]
    if disabled:
        options.executable_build_options.debug_options.xla_disable_hlo_passes = ",".join(disabled)
    overrides = [(name, value) for name, value in flags.items()]
    options.env_option_overrides = [*overrides, ("xla_gpu_collect_cost_model_stats", cost_stats)]
    serialized = options.SerializeAsString()
    return serialized + RUN_BACKEND_ONLY if backend_only else serialized


#: How XLA prints a constant whose values it left out; its parser reads it back as made-up values.
_ELIDED_CONSTANT = "constant({...})"


def _full_print_options():
    """XLA's print options with every constant in full (its default print elides large ones as `{...}`,
    which its parser reads back as made-up values: the final module goes on to step 3 and step 4)."""
    from jaxlib import _hlo

    options = _hlo.HloPrintOptions()
    options.print_large_constants = True
    return options


def compile_deviceless(hlo_text: str, target_config: str, devices: int = 1, disable_passes: str = "",
                       xla_flags: str = "", backend_only: bool = False, final_only: bool = False) -> dict[str, Any]:
    """Compile HLO text for `devices` GPUs of the target; {final_text, executable, memory, warnings,
    cost_analysis}. `final_only`: the final module's text alone (no serialized executable, memory or cost
    analysis: what the hook's stage needs of its backend-only compile)."""
    from jaxlib import _hlo

    if _ELIDED_CONSTANT in hlo_text:  # XLA's parser would fill the constant with made-up values
        raise DriverError("the module holds a constant whose values were elided (constant({...})); print it with "
                          "its large constants (an XLA dump made with --xla_dump_large_constants)")
    try:
        proto = _hlo.hlo_module_from_text(hlo_text).as_serialized_hlo_module_proto()
    except Exception as e:  # noqa: BLE001 - jaxlib raises plain RuntimeError/ValueError
        raise DriverError("XLA's HLO parser rejected the module: " + " | ".join(str(e).splitlines()[:4])) from None
    flags = parse_xla_flags(xla_flags)
    plugin = _Plugin()
    topology = plugin.topology(target_config, devices)
    warnings: list[str] = []
    try:
        executable = None
        for cost_stats in (True, False):  # A100: XLA's cost models have no sm_80 data ("Cannot find key")
            options = compile_options(devices, disable_passes, flags, backend_only, cost_stats)
            try:
                executable = plugin.compile(topology, proto, options)
                break
            except DriverError as e:
                if not cost_stats or "Cannot find key: sm_" not in str(e):
                    raise
                warnings.append(f"no per-fusion estimates for this target: with them XLA fails with '{e}'")
        program, program_format = plugin.optimized_program(executable)
        serialized = b"" if final_only else plugin.serialize(executable)
        memory = {} if final_only else plugin.memory_stats(executable)
        cost = {} if final_only else _cost_of_executable(plugin, executable)
        plugin.destroy(_EXECUTABLE_DESTROY, executable)
    finally:
        plugin.destroy(_TOPOLOGY_DESTROY, topology)
    final = _hlo.HloModule.from_serialized_hlo_module_proto(module_proto_of(program, program_format))
    if cost is None:
        cost = _cost_of_final_module(final)
    return {"final_text": with_partitions(final.to_string(_full_print_options()), devices), "executable": serialized, "memory": memory,
            "warnings": warnings, "cost_analysis": cost}


def _cost_of_executable(plugin: _Plugin, executable: int) -> dict[str, Any] | None:
    """The executable's own cost analysis through the C API; None where the plugin has none (the CUDA
    plugin's deviceless PJRT_Executable answers "GetCostAnalysis is not supported" at 0.10.2)."""
    try:
        return {"source": "PJRT_Executable_GetCostAnalysis", **plugin.cost_analysis(executable)}
    except DriverError:
        return None


def _cost_of_final_module(final: Any) -> dict[str, Any]:
    """XLA's HloCostAnalysis totals of the final module, through jaxlib's `hlo_module_cost_analysis`
    (run by jaxlib's CPU client: XLA's generic HloCostAnalysis, not GpuHloCostAnalysis)."""
    import jax
    from jax._src.lib import _jax

    cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, final)
    return {"source": "hlo_module_cost_analysis (XLA HloCostAnalysis via jaxlib's CPU client)",
            **{k.replace(" ", "_"): float(v) for k, v in cost.items()}}


def with_partitions(text: str, devices: int) -> str:
    """The module text with `num_partitions=devices` in its header: the optimized module comes back
    without its config, and a per-device SPMD module read without it looks like a single-device one."""
    header, _, rest = text.partition("\n")
    if devices <= 1 or "num_partitions=" in header:
        return text
    name, comma, attrs = header.partition(",")
    return f"{name}, num_partitions={devices}{comma}{attrs}\n{rest}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hlopt.runtime.xla_gpu_path.gpu_driver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", help="HLO text module")
    p.add_argument("--spec", help="GpuTargetConfig text proto (.txtpb) of the target GPU")
    p.add_argument("--out", help="output folder")
    p.add_argument("--devices", type=int, default=1, help="SPMD partitions (GPUs)")
    p.add_argument("--disable-passes", default="", help="comma-separated XLA pass names")
    p.add_argument("--xla-flags", default="", help="XLA debug options, '--xla_a=1 --xla_b=false'")
    p.add_argument("--backend-only", action="store_true",
                   help="skip XLA's HLO passes (run_backend_only): for a scheduled, laid-out module")
    p.add_argument("--check", action="store_true", help="exit 0 when the plugin loads, and do nothing else")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command line entry (see the module docstring)."""
    os.environ["JAX_PLATFORMS"] = "cpu"  # the plugin is used through its C API only, never as a jax backend
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    a = _parser().parse_args(argv)
    try:
        if a.check:
            _Plugin()
            return 0
        if not (a.input and a.spec and a.out):
            raise DriverError("IN.hlo, --spec and --out are required")
        started = time.perf_counter()
        result = compile_deviceless(Path(a.input).read_text(), Path(a.spec).read_text(), a.devices,
                                    a.disable_passes, a.xla_flags, a.backend_only)
        seconds = time.perf_counter() - started
    except (DriverError, OSError) as e:
        print(f"gpu_driver: error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "final.hlo").write_text(result["final_text"])
    (out / "executable.bin").write_bytes(result["executable"])
    (out / "driver.json").write_text(json.dumps({"memory": result["memory"], "warnings": result["warnings"],
                                                 "cost_analysis": result["cost_analysis"],
                                                 "compile_seconds": round(seconds, 3)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
