"""XLA's real GPU compiler, deviceless, driven by hlopt's own driver (`runtime.xla_gpu_path.gpu_driver`).

The compile runs in a child process (`python -m hlopt.runtime.xla_gpu_path.gpu_driver`, or the file itself) with a python
that has `jax-cuda12-plugin==0.10.2`, found in this order:
1. `HLOPT_XLA_GPU_PYTHON` (`XLA_GPU_PYTHON` is honoured too);
2. this interpreter, when the plugin is installed here (`pip install 'hlopt[gpu-compile]'`);
3. the venv `python -m hlopt.runtime.xla_gpu_path.xla_gpu install` creates (`HLOPT_XLA_GPU_VENV`, default
   `~/.cache/hlopt/xla-gpu-venv`): only the plugin, on top of this interpreter's packages.
The child never makes the plugin a jax backend (it uses the PJRT C API with `JAX_PLATFORMS=cpu`), and the
plugin never loads into this process, so jax's CPU backend here is left exactly as it was.

Target configs come from the package (`hlopt.cost_model.devices.SPEC_DIR`), shipped with hlopt.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hlopt.cost_model.devices import target_aliases, target_spec_file
from hlopt.cost_model.xla_estimates import XlaEstimateTimes, estimate_of, launch_kind, xla_estimates
from hlopt.hlo.ir import Computation, Module

__all__ = [
    "gpu_python", "available", "TARGETS", "INSTALL_COMMAND",
    "GpuCompilerMissing", "DriverResult", "run_driver", "spec_path", "check_target", "LaunchCount", "XlaEstimate",
    "XlaPassTime", "parse_pass_metadata",
    "XlaEstimateLatency", "estimate", "estimate_of", "launch_kind", "xla_estimates", "XlaEstimateTimes", "KEEP_OUR_FUSIONS", "default_layouts", "module_for_xla_gpu",
    "install", "load_executable", "local_target", "target_of_device_kind", "require_compiler",
]

#: target name -> its GpuTargetConfig's name in the package's specs folder (from `cost_model.devices`, the one
#: resolver of target names).
TARGETS = {alias: target_spec_file(key).stem for alias, key in target_aliases().items()}
#: The one command that makes the GPU compiler available (see the module docstring for the alternative).
INSTALL_COMMAND = "pip install 'hlopt[gpu-compile]'  (or: python -m hlopt.runtime.xla_gpu_path.xla_gpu install)"
PLUGIN_REQUIREMENT = "jax-cuda12-plugin==0.10.2"
#: XLA:GPU passes switched off so that it compiles hlopt's fusions as they are: its own fusion passes,
#: the deduplicator (it would share fused computations between fusions, which XLA's verifier rejects) and
#: layout assignment (it clears the layouts inside pre-existing fusions, and later passes abort on them;
#: `default_layouts` gives every shape the layout it would assign).
KEEP_OUR_FUSIONS = "priority-fusion,multi_output_fusion,rename_fusions,computation-deduplicator,layout-assignment"
_DRIVER = Path(__file__).resolve().with_name("gpu_driver.py")


class GpuCompilerMissing(RuntimeError):
    """No python with jax-cuda12-plugin: the message names the install command."""


# ----------------------------------------------------------------------------- the compiler's environment


def default_venv() -> Path:
    """Where `install` puts the compiler's venv."""
    return Path(os.environ.get("HLOPT_XLA_GPU_VENV") or Path.home() / ".cache" / "hlopt" / "xla-gpu-venv")


def plugin_installed() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except (ImportError, ValueError):
        return False


def gpu_python() -> Path | None:
    """The python that runs the driver (see the module docstring), or None when there is none."""
    named = os.environ.get("HLOPT_XLA_GPU_PYTHON") or os.environ.get("XLA_GPU_PYTHON")
    if named:
        return Path(named) if Path(named).exists() else None
    if plugin_installed():
        return Path(sys.executable)
    venv_python = default_venv() / "bin" / "python"
    return venv_python if venv_python.exists() else None


def available() -> bool:
    """True when a python with the plugin is there (it is not started)."""
    return gpu_python() is not None


def _require_python() -> Path:
    python = gpu_python()
    if python is None:
        named = os.environ.get("HLOPT_XLA_GPU_PYTHON") or os.environ.get("XLA_GPU_PYTHON")
        where = f"HLOPT_XLA_GPU_PYTHON={named} does not exist; " if named else ""
        raise GpuCompilerMissing(f"XLA:GPU compiler not installed ({where}needs {PLUGIN_REQUIREMENT}): "
                                 f"run {INSTALL_COMMAND}")
    return python


def require_compiler() -> Path:
    """The python that runs the driver; GpuCompilerMissing naming the install command without one."""
    return _require_python()


def install(venv: Path | None = None) -> Path:
    """Create the compiler's venv (this interpreter's packages plus the plugin, about 30 s); its python."""
    venv = venv or default_venv()
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", PLUGIN_REQUIREMENT], check=True)
    subprocess.run([str(python), str(_DRIVER), "--check"], check=True, capture_output=True)
    return python


# ----------------------------------------------------------------------------- the driver


def check_target(target: str) -> str:
    """The spec name of a target; ValueError naming the known ones otherwise."""
    return target_spec_file(target).stem


def spec_path(target: str) -> Path:
    """The GpuTargetConfig text proto the package ships for a target."""
    return target_spec_file(target)


@dataclass(frozen=True)
class XlaPassTime:
    """One run of one of XLA's HLO passes (an entry of its HloModuleMetadataProto's pass_metadata)."""

    pipeline: str
    name: str
    seconds: float  # wall clock, from the pass's start and end timestamps
    changed: bool


@dataclass
class DriverResult:
    """One XLA:GPU compile: XLA's final module, the serialized executable, memory statistics."""

    target: str
    devices: int
    final_text: str
    executable: bytes = field(repr=False)
    memory: dict[str, int]
    warnings: list[str]
    compile_seconds: float
    disabled_passes: str = ""
    backend_only: bool = False
    _module: Module | None = field(default=None, repr=False)
    #: XLA's HloCostAnalysis totals of the final module ("flops", "bytes_accessed", "transcendentals", ...;
    #: "source" names where they came from: the deviceless executable has no cost analysis of its own).
    cost_analysis: dict[str, Any] = field(default_factory=dict)
    #: how long each of XLA's HLO passes took, in the order they ran (`run_driver(..., pass_times=True)`;
    #: empty otherwise)
    pass_times: list[XlaPassTime] = field(default_factory=list)

    @property
    def final(self) -> Module:
        """XLA's final module, parsed (once)."""
        if self._module is None:
            from hlopt.hlo.parser import parse

            self._module = parse(self.final_text, filename=f"<XLA:GPU {self.target} final module>")
        return self._module


def run_driver(text: str, target: str, devices: int = 1, disable_passes: str = "", xla_flags: str = "",
               backend_only: bool = False, timeout: float = 600, pass_times: bool = False) -> DriverResult:
    """Compile HLO text with XLA:GPU for `devices` GPUs of `target`, deviceless, in a child process.
    GpuCompilerMissing without the compiler; RuntimeError with XLA's message when XLA refuses or aborts.
    XLA options reach XLA through `xla_flags` only: the XLA_FLAGS environment (which usually holds XLA:CPU's
    host device count, unknown to the GPU compiler) is not passed on. `pass_times`: also read how long each of
    XLA's HLO passes took (`DriverResult.pass_times`, from the module metadata XLA dumps; no module is dumped)."""
    if pass_times and "--xla_dump_to" in xla_flags:
        raise ValueError("pass_times dumps XLA's module metadata into a folder of its own: leave --xla_dump_to out")
    spec = spec_path(target)
    python = _require_python()
    with tempfile.TemporaryDirectory(prefix="hlopt-xla-gpu-") as tmp:
        src = Path(tmp) / "in.hlo"
        src.write_text(text)
        dump = Path(tmp) / "xla-dump"
        if pass_times:
            xla_flags = _with_metadata_dump(xla_flags, dump)
        cmd = [str(python), str(_DRIVER), str(src), "--spec", str(spec), "--devices", str(devices),
               "--out", tmp, f"--disable-passes={disable_passes}", f"--xla-flags={xla_flags}"]
        if backend_only:
            cmd.append("--backend-only")
        env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("XLA_FLAGS", None)  # flags reach XLA per compile (--xla-flags), not through the environment
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"XLA:GPU compile for {target} took more than {timeout:.0f} s") from None
        if run.returncode:
            raise RuntimeError(f"XLA:GPU compile for {target} failed: {_driver_error(run)}")
        info = json.loads((Path(tmp) / "driver.json").read_text())
        times = [t for f in sorted(dump.glob("*.metadata.textproto")) for t in parse_pass_metadata(f.read_text())] \
            if pass_times else []
        return DriverResult(target, devices, (Path(tmp) / "final.hlo").read_text(),
                            (Path(tmp) / "executable.bin").read_bytes(), info["memory"], info["warnings"],
                            info["compile_seconds"], disable_passes, backend_only,
                            cost_analysis=info.get("cost_analysis", {}), pass_times=times)


def _with_metadata_dump(xla_flags: str, dump: Path) -> str:
    """`xla_flags` plus what makes XLA dump its module metadata (the passes it ran, with their timestamps) into
    `dump`, and no module (no module is named by the empty pattern)."""
    return f"{xla_flags} --xla_dump_to={dump} --xla_dump_module_metadata=true --xla_dump_hlo_module_re=^$".strip()


def parse_pass_metadata(text: str) -> list[XlaPassTime]:
    """The `pass_metadata` entries of an HloModuleMetadataProto in text format (XLA's
    `module_*.metadata.textproto` dump), in order; ValueError naming the line where an entry lacks a field."""
    out: list[XlaPassTime] = []
    depth = 0
    fields: dict[str, str] | None = None
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.endswith("{"):
            depth += 1
            if depth == 1 and line[:-1].strip() == "pass_metadata":
                fields, start = {}, number
        elif line == "}":
            depth -= 1
            if depth == 0 and fields is not None:
                out.append(_pass_time(fields, start))
                fields = None
        elif depth == 1 and fields is not None and ":" in line:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip().strip('"'))
    return out


def _pass_time(fields: dict[str, str], line: int) -> XlaPassTime:
    """One `pass_metadata` entry (its scalar fields as text) as an XlaPassTime."""
    stamps = []
    for key in ("start_timestamp_usec", "end_timestamp_usec"):
        if not fields.get(key, "").isdigit():
            raise ValueError(f"line {line}: pass_metadata entry without {key} (a number of microseconds)")
        stamps.append(int(fields[key]))
    if not fields.get("pass_name"):
        raise ValueError(f"line {line}: pass_metadata entry without pass_name")
    return XlaPassTime(fields.get("pipeline_name", ""), fields["pass_name"], (stamps[1] - stamps[0]) / 1e6,
                       fields.get("module_changed") == "true")


def _driver_error(run: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("gpu_driver: error:")]
    if lines:
        return lines[-1].removeprefix("gpu_driver: error:").strip()
    checks = [ln for ln in run.stderr.splitlines() if "Check failed:" in ln]
    if checks:  # an XLA CHECK: its message, without the log prefix and the stack frames
        return f"XLA aborted (status {run.returncode}): {checks[-1][checks[-1].index('Check failed:'):][:600]}"
    tail = [ln for ln in run.stderr.splitlines() if ln.strip() and "cudart_stub" not in ln][-6:]
    return f"the compiler process ended with status {run.returncode} (XLA aborted?):\n" + "\n".join(tail)


# ----------------------------------------------------------------------------- XLA's own estimates
# (read by cost_model.xla_estimates: launch_kind, xla_estimates, estimate_of, XlaEstimateTimes)

def executed_computations(module: Module) -> list[tuple[Computation, int]]:
    """(computation, times run per execution) of the entry and every while body/condition, conditional
    branch and call reached from it (branches counted once: the branch taken is unknown)."""
    from hlopt.cost_model.model import trip_count

    out, todo = [], [(module.entry, 1)]
    while todo:
        comp, times = todo.pop(0)
        out.append((comp, times))
        for inst in comp.instructions:
            if inst.opcode == "while":
                n = trip_count(inst)
                todo += [(inst.attrs["body"], times * n), (inst.attrs["condition"], times * (n + 1))]
            elif inst.opcode in ("conditional", "call"):
                todo += [(c, times) for c in inst.called_computations]
    return out


class XlaEstimateLatency(XlaEstimateTimes):
    """A `cost_model.estimator.LatencyEstimator` on XLA's own per-instruction estimates
    (`cost_model.xla_estimates.XlaEstimateTimes`), a while loop its body and condition simulated (on the
    current stream model, XLA:GPU's by default), times the trip count. `scheduler.replay` replays a final
    module on the same estimates independently of the simulator (tests/test_stream_replay.py)."""

    def __init__(self, target: str, launch_us: float, devices: int) -> None:
        super().__init__(target, launch_us, devices)
        self._computations: dict[Computation, float] = {}

    def computation_us(self, comp: Computation) -> float:
        """The simulated makespan of one execution of `comp` in its own order."""
        from hlopt.scheduler.simulator import simulate

        if comp not in self._computations:
            self._computations[comp] = simulate(comp, self).makespan_us
        return self._computations[comp]

    def computation_time_us(self, comp: Computation) -> float:
        """A loop body's (or called computation's) simulated time."""
        return self.computation_us(comp)


@dataclass
class LaunchCount:
    """Kernel launches of one computation, by kind."""

    computation: str
    times: int
    fusion: int = 0
    custom_call: int = 0
    collective: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        """All launches."""
        return self.fusion + self.custom_call + self.collective + self.other


@dataclass
class XlaEstimate:
    """XLA's view of a final module: launches and its own per-fusion estimates."""

    launches: list[LaunchCount]
    fusion_us: dict[str, float]  # "computation/fusion" -> XLA's estimate (`estimate_of`) x times run
    unestimated: list[str]  # launches with no estimate of XLA's (library calls, collectives, ...)
    launch_us: float  # per-launch overhead used
    simulated_us: float = 0.0  # the entry computation simulated on XLA's estimates (`XlaEstimateLatency`)

    @property
    def static_launches(self) -> int:
        """Launches in the module text."""
        return sum(c.total for c in self.launches)

    @property
    def dynamic_launches(self) -> int:
        """Launches per execution (while bodies times their trip counts)."""
        return sum(c.total * c.times for c in self.launches)

    @property
    def fusion_time_us(self) -> float:
        """Sum of XLA's estimates over fusions, times trip counts."""
        return sum(self.fusion_us.values())

    @property
    def summed_us(self) -> float:
        """Fusion estimates times trip counts plus launch overhead, collectives left out."""
        return self.fusion_time_us + self.dynamic_launches * self.launch_us

    @property
    def modeled_us(self) -> float:
        """The figure ours and XLA's compare on: the module simulated in its order on XLA:GPU's streams (one
        compute stream, the async collectives one after another on the collective stream,
        `scheduler.async_ops`) on XLA's estimates plus launch overhead."""
        return self.simulated_us

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"static_launches": self.static_launches, "dynamic_launches": self.dynamic_launches,
                "fusion_time_us": round(self.fusion_time_us, 3), "modeled_us": round(self.modeled_us, 3),
                "summed_us": round(self.summed_us, 3),
                "launch_overhead_us": self.launch_us, "unestimated_launches": len(self.unestimated),
                "per_computation": [{"computation": c.computation, "times": c.times, "fusion": c.fusion,
                                     "custom-call": c.custom_call, "collective": c.collective, "other": c.other}
                                    for c in self.launches]}


def estimate(module: Module, target: str = "h100", devices: int | None = None) -> XlaEstimate:
    """XLA's estimates read off a final module (see `XlaEstimate`); `devices` sizes the collectives
    XLA gives no estimate of (default: the module's replica_count x num_partitions)."""
    from hlopt.cost_model.devices import get_device

    try:
        launch_us = float(get_device(target).kernel_launch_us)
    except (KeyError, ValueError):
        launch_us = 1.0
    launches, fusion_us, unestimated = [], {}, []
    for comp, times in executed_computations(module):
        count = LaunchCount(comp.name, times)
        for inst in comp.instructions:
            kind = launch_kind(inst)
            if kind is None:
                continue
            setattr(count, kind.replace("-", "_"), getattr(count, kind.replace("-", "_")) + 1)
            chosen = estimate_of(inst) if kind == "fusion" else None
            if chosen is not None:
                fusion_us[f"{comp.name}/{inst.name}"] = chosen * times
            else:
                unestimated.append(inst.name)
        launches.append(count)
    if devices is None:
        devices = int(module.config.get("replica_count", 1)) * int(module.config.get("num_partitions", 1))
    simulated = XlaEstimateLatency(target, launch_us, devices).computation_us(module.entry)
    return XlaEstimate(launches, fusion_us, unestimated, launch_us, simulated)


# ----------------------------------------------------------------------------- with a GPU


def target_of_device_kind(device_kind: str) -> str | None:
    """hlopt's target name for a jax device kind ("NVIDIA H100 80GB HBM3" -> "h100"), None for others."""
    kind = device_kind.lower()
    for name in ("h100", "h200", "b200", "a100"):
        if name in kind:
            return name
    return None


def local_target() -> str | None:
    """The target name of this machine's first GPU (from jax's device kind), None without a known one."""
    from hlopt.runtime._xla import gpu_devices

    devices = gpu_devices()
    return target_of_device_kind(devices[0].device_kind) if devices else None


def load_executable(serialized: bytes, module: Module, platform: str = "gpu") -> Any:
    """A serialized executable (`DriverResult.executable`, or any jaxlib serialization) loaded on this
    machine's devices of `platform` as a `runtime.Executable` for the module it was compiled from (single
    and per-device modules). It must have been compiled for these devices (a deviceless H100 executable
    loads on an H100); XlaError otherwise."""
    from hlopt.runtime._xla import CompiledModule, XlaError, platform_devices
    from hlopt.runtime.execution.executable import executable_from, execution_mode
    from jax._src import compiler
    from jax._src.lib import _jax

    mode, replicas, partitions = execution_mode(module)
    if mode == "spmd":
        raise ValueError("load_executable takes single-device and per-device modules")
    devices = platform_devices(platform, replicas * partitions)
    options = compiler.get_compile_options(num_replicas=replicas, num_partitions=partitions,
                                           device_assignment=np.array(devices).reshape(replicas, partitions))
    try:
        loaded = devices[0].client.deserialize_executable(serialized, _jax.DeviceList(tuple(devices)), options)
    except Exception as e:  # noqa: BLE001 - jaxlib raises plain RuntimeError/ValueError
        raise XlaError(f"XLA could not load the executable on {platform}: {str(e).splitlines()[0][:300]}") from None
    compiled = CompiledModule(loaded, devices, replicas, partitions, partitions > 1)
    return executable_from(compiled, mode, module)


# ----------------------------------------------------------------------------- with a GPU (experimental)


def default_layouts(module: Module) -> Module:
    """`module` (changed in place) with every array shape in the default row-major layout and no
    `entry_computation_layout`: the form XLA:GPU takes with layout assignment off."""
    from hlopt.hlo.shape import TupleShape

    def fix(shape):
        if shape.is_tuple:
            return TupleShape(tuple(fix(e) for e in shape.elements))
        return shape.with_default_layout() if shape.rank and shape.dtype not in ("token", "opaque") else shape

    for inst in module.instructions():
        inst.shape = fix(inst.shape)
    module.config.pop("entry_computation_layout", None)
    return module


def module_for_xla_gpu(module: Module, keep_fusions: bool = False) -> tuple[Module, str]:
    """What a real XLA:GPU compile is given for an hlopt module, and the XLA passes to switch off.

    By default every fusion is inlined and XLA:GPU fuses by itself, with its layout assignment on: the
    safe form. With `keep_fusions`, a module with fusions keeps them: default layouts and
    `KEEP_OUR_FUSIONS` off (XLA:GPU rejects pre-fused modules with its layout assignment on). That form is
    experimental; the deviceless re-emission (`runtime.xla_gpu_path.reemit`) is the way to keep our fusions."""
    from hlopt.runtime.execution.reentry import cpu_fusion_kinds_only

    if not any(i.opcode == "fusion" for i in module.instructions()):
        return module, ""
    if not keep_fusions:
        return cpu_fusion_kinds_only(module, keep_fusions=False), ""
    return default_layouts(module.clone()), KEEP_OUR_FUSIONS


def main(argv: list[str] | None = None) -> int:
    """`python -m hlopt.runtime.xla_gpu_path.xla_gpu install [VENV]` creates the compiler's venv."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "install":
        print("usage: python -m hlopt.runtime.xla_gpu_path.xla_gpu install [VENV]", file=sys.stderr)
        return 2
    python = install(Path(argv[1]) if len(argv) > 1 else None)
    print(f"XLA:GPU compiler ready: {python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
