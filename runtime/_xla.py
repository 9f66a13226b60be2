"""The one module that touches jaxlib internals: XLA's HLO parser/printer, compile, execute, cost analysis.

jaxlib 0.10.2 (pinned) compiles StableHLO, so HLO text goes text -> HloModuleProto (XLA's parser) ->
StableHLO (`hlo_to_stablehlo`) -> `Client.compile_and_load`. Multi-device modules compile with SPMD
partitioning over `num_partitions` devices (Shardy when the module carries `xla.sdy` attributes) or with
`num_replicas` replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "XlaError", "xla_parse", "xla_canonical_text", "xla_fingerprint_text", "cost_analysis",
    "CompiledModule", "compile_text", "cpu_devices", "cpu_client", "platform_devices", "gpu_devices",
    "add_disabled_passes", "full_hlo_text", "computation_full_text", "lowered_full_text", "mlir_to_hlo_text",
]


class XlaError(RuntimeError):
    """XLA rejected a module (parse, compile or run); the message is XLA's, trimmed."""


def _trim(e: BaseException, lines: int = 8) -> str:
    text = str(e).strip().splitlines()
    return "\n".join(text[:lines]) + ("\n..." if len(text) > lines else "")


def xla_parse(text: str) -> Any:
    """XLA's own parse of HLO text (a jaxlib HloModule); XlaError if XLA rejects it."""
    from jaxlib import _hlo

    try:
        return _hlo.hlo_module_from_text(text)
    except Exception as e:  # noqa: BLE001 - jaxlib raises plain RuntimeError/ValueError
        raise XlaError(f"XLA's HLO parser rejected the module:\n{_trim(e)}") from None


def xla_canonical_text(text: str) -> str:
    """XLA's parse of `text` printed back by XLA (`HloModule.to_string()`): the oracle for our printer."""
    return xla_parse(text).to_string()


def xla_fingerprint_text(text: str) -> str:
    """XLA's canonical print with canonicalized names (insensitive to instruction naming)."""
    from jaxlib import _hlo

    return xla_parse(text).to_string(_hlo.HloPrintOptions.canonical())


def xla_proto_module(proto: bytes) -> Any:
    """A jaxlib HloModule from a serialized HloModuleProto (what XLA's transformation stages hand over)."""
    from jaxlib import _hlo

    return _hlo.HloModule.from_serialized_hlo_module_proto(proto)


def full_hlo_text(module: Any) -> str:
    """A jaxlib HloModule printed with every literal in full (XLA's default print elides large constants
    as `{...}`, which would parse back as a module without their values)."""
    from jaxlib import _hlo

    options = _hlo.HloPrintOptions()
    options.print_large_constants = True
    return module.to_string(options)


def computation_full_text(computation: Any) -> str:
    """An XlaComputation's HLO text with every literal in full."""
    return computation.as_hlo_text(print_large_constants=True)


def lowered_full_text(lowered: Any) -> str:
    """The unoptimized HLO text of a jax `Lowered` with every literal in full (`Lowered.as_text(dialect="hlo")`
    elides large constants)."""
    return computation_full_text(lowered.compiler_ir(dialect="hlo"))


def mlir_to_hlo_text(text: str) -> str:
    """The HLO text (every literal in full) of a StableHLO or MHLO module written as MLIR text (what jax's
    `Lowered.as_text()` gives by default), converted by jaxlib; XlaError if jaxlib cannot read it."""
    from jax._src.lib import _jax

    try:
        computation = _jax.mlir.mlir_module_to_xla_computation(text, use_tuple_args=False, return_tuple=False)
    except Exception as e:  # noqa: BLE001 - jaxlib raises plain RuntimeError/ValueError
        raise XlaError(f"jaxlib could not convert the StableHLO/MHLO module to HLO:\n{_trim(e)}") from None
    return computation_full_text(computation)


def _refuse_elided(text: str) -> None:
    """ElidedLiteralError naming the constant when HLO text holds an elided literal (XLA would run it as zeros)."""
    if "{...}" not in text:
        return
    from hlopt.hlo.literal import check_no_elided_constants
    from hlopt.hlo.parser import parse

    check_no_elided_constants(parse(text), "compile")


def cpu_devices(n: int | None = None) -> list[Any]:
    """The first n CPU devices (all if None); XlaError if fewer exist."""
    return platform_devices("cpu", n)


def gpu_devices() -> list[Any]:
    """This machine's GPUs as jax sees them (CUDA or ROCm); [] when there is none or no GPU plugin."""
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:  # jax: "Unknown backend gpu" / no devices of that platform
        return []


def platform_devices(platform: str, n: int | None = None) -> list[Any]:
    """The first n devices of a jax platform ("cpu", "gpu", "cuda", ...); XlaError if fewer exist."""
    import jax

    try:
        devices = jax.devices(platform)
    except RuntimeError as e:
        raise XlaError(f"no {platform} devices: {_trim(e, 2)}") from None
    if n is not None and len(devices) < n:
        hint = (f": set XLA_FLAGS=--xla_force_host_platform_device_count={n} before jax is imported"
                if platform == "cpu" else "")
        raise XlaError(f"{n} {platform.upper()} devices needed but {len(devices)} exist{hint}")
    return devices if n is None else devices[:n]


def cpu_client() -> Any:
    """jaxlib's CPU client (the one jax uses)."""
    return cpu_devices(1)[0].client


def cost_analysis(text: str) -> dict[str, float]:
    """XLA's HloCostAnalysis of a module (flops, transcendentals, bytes accessed, ...) on the CPU client."""
    from jax._src.lib import _jax

    module = xla_parse(text)
    try:
        return dict(_jax.hlo_module_cost_analysis(cpu_client(), module))
    except Exception as e:  # noqa: BLE001
        raise XlaError(f"XLA's cost analysis failed:\n{_trim(e)}") from None


def _initialize_cpu_custom_calls() -> None:
    """LAPACK targets (cholesky, qr, eigh, ...) register lazily in jax; a module using them needs them now."""
    from jax._src.lax import linalg

    linalg.initialize_lapack()


def _exact_dtypes() -> Any:
    """A context in which jax keeps 64-bit arrays as they are (jax narrows them unless x64 is enabled)."""
    from jax._src import config

    return config.enable_x64(True)


@dataclass
class CompiledModule:
    """A loaded XLA executable and how its inputs and outputs are laid out over devices."""

    executable: Any
    devices: list[Any]
    num_replicas: int
    num_partitions: int
    spmd: bool

    @property
    def num_devices(self) -> int:
        """Devices the executable runs on."""
        return len(self.devices)

    def compiled_text(self) -> str:
        """XLA's optimized module (as compiled for device 0)."""
        return full_hlo_text(self.executable.hlo_modules()[0])

    def parameter_shardings(self) -> list[Any] | None:
        """OpSharding per parameter (None for single-device)."""
        return self.executable.get_parameter_shardings() if self.num_devices > 1 else None

    def execute_per_device(self, per_device_inputs: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run with explicit per-device inputs ([param][device]); returns [output][device]."""
        with _exact_dtypes():
            return self._execute_per_device(per_device_inputs)

    def _device_arguments(self, per_device_inputs: list[list[np.ndarray]]) -> list[Any]:
        """The inputs put on the devices ([param][device]), one jax array per parameter."""
        import jax
        from jax._src.sharding_impls import GSPMDSharding

        args = []
        for shards in per_device_inputs:
            bufs = [jax.device_put(np.asarray(x), d) for x, d in zip(shards, self.devices, strict=True)]
            if self.num_devices == 1:
                args.append(bufs[0])
            else:
                sharding = GSPMDSharding.get_replicated(self.devices)
                args.append(jax.make_array_from_single_device_arrays(bufs[0].shape, sharding, bufs))
        return args

    def _execute_per_device(self, per_device_inputs: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        args = self._device_arguments(per_device_inputs)
        try:
            results = self.executable.execute_sharded(args)
            outs = results.disassemble_into_single_device_arrays()
        except Exception as e:  # noqa: BLE001
            raise XlaError(f"XLA failed to run the module:\n{_trim(e)}") from None
        return [[np.asarray(buf) for buf in per_output] for per_output in outs]

    def time_per_device_us(self, per_device_inputs: list[list[np.ndarray]], repeat: int = 20) -> float:
        """Median wall time of one run, in us, with the inputs already on the devices ([param][device])."""
        import statistics
        import time

        import jax

        with _exact_dtypes():
            args = self._device_arguments(per_device_inputs)
            times = []
            for _ in range(repeat + 1):  # the first run warms up
                start = time.perf_counter()
                outs = self.executable.execute_sharded(args).disassemble_into_single_device_arrays()
                jax.block_until_ready(outs)
                times.append(time.perf_counter() - start)
        return statistics.median(times[1:]) * 1e6

    def execute_global(self, inputs: list[np.ndarray], global_out_shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Run an SPMD executable on global arrays, sharded as XLA chose; returns global outputs."""
        with _exact_dtypes():
            return self._execute_global(inputs, global_out_shapes)

    def _execute_global(self, inputs: list[np.ndarray], global_out_shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        import jax
        from jax._src.sharding_impls import GSPMDSharding

        in_shardings = self.executable.get_parameter_shardings()
        out_shardings = self.executable.get_output_shardings()
        args = [jax.device_put(np.asarray(x), GSPMDSharding(self.devices, s)) for x, s in zip(inputs, in_shardings,
                                                                                               strict=True)]
        try:
            results = self.executable.execute_sharded(args)
            outs = results.disassemble_into_single_device_arrays()
        except Exception as e:  # noqa: BLE001
            raise XlaError(f"XLA failed to run the module:\n{_trim(e)}") from None
        arrays = []
        for bufs, sharding, shape in zip(outs, out_shardings, global_out_shapes, strict=True):
            arr = jax.make_array_from_single_device_arrays(shape, GSPMDSharding(self.devices, sharding), bufs)
            arrays.append(np.asarray(arr))
        return arrays


def compile_text(text: str, num_replicas: int = 1, num_partitions: int = 1, spmd: bool | None = None,
                 shardy: bool = False, platform: str = "cpu", disable_passes: str = "") -> CompiledModule:
    """Compile HLO text for num_replicas x num_partitions devices of `platform` (XLA:CPU by default);
    `disable_passes` (comma-separated XLA pass names) goes to XLA as `xla_disable_hlo_passes`."""
    from jax._src import compiler
    from jax._src.lib import _jax

    _refuse_elided(text)
    module = xla_parse(text)
    if platform == "cpu":
        _initialize_cpu_custom_calls()
    n = num_replicas * num_partitions
    devices = platform_devices(platform, n)
    try:
        mlir = _jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    except Exception as e:  # noqa: BLE001
        raise XlaError(f"XLA could not convert the module to StableHLO:\n{_trim(e)}") from None
    options = compiler.get_compile_options(
        num_replicas=num_replicas, num_partitions=num_partitions,
        device_assignment=np.array(devices).reshape(num_replicas, num_partitions),
    )
    spmd = num_partitions > 1 if spmd is None else spmd
    options.executable_build_options.use_spmd_partitioning = spmd
    options.executable_build_options.use_shardy_partitioner = shardy
    add_disabled_passes(options, disable_passes)
    client = devices[0].client
    try:
        exe = client.compile_and_load(mlir, _jax.DeviceList(tuple(devices)), options)
    except Exception as e:  # noqa: BLE001
        raise XlaError(f"XLA could not compile the module:\n{_trim(e)}") from None
    return CompiledModule(exe, devices, num_replicas, num_partitions, spmd)


def add_disabled_passes(options: Any, passes: str) -> None:
    """Add comma-separated XLA pass names to a CompileOptions' `xla_disable_hlo_passes`."""
    if not passes:
        return
    debug = options.executable_build_options.debug_options
    have = [p for p in debug.xla_disable_hlo_passes.split(",") if p]
    debug.xla_disable_hlo_passes = ",".join(have + [p for p in passes.split(",") if p and p not in have])
