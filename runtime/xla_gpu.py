"""`runtime.compile(module, target="h100")`: XLA's real GPU compiler, deviceless, in a separate process.

The compile runs `../shared/tools/xla_gpu_compile.py` in its own venv (jax-cuda12-plugin; create it with
`../shared/tools/setup_xla_gpu.sh /tmp/xla-gpu-venv`). `HLOPT_XLA_GPU_PYTHON` names that venv's python
(default `/tmp/xla-gpu-venv/bin/python`; `XLA_GPU_PYTHON` is honoured too), `HLOPT_XLA_GPU_TOOL` the tool.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlopt.hlo.ir import Module

__all__ = ["GpuCompileResult", "compile_for_target", "gpu_python", "gpu_tool", "available", "TARGETS",
           "KEEP_OUR_FUSIONS", "default_layouts", "module_for_xla_gpu", "check_target"]

_ROOT = Path(__file__).resolve().parents[1]
#: target name -> the tool's --spec (a file in ../shared/gpu_specs).
TARGETS = {"h100": "h100_sxm", "h100_sxm": "h100_sxm"}
#: XLA:GPU passes switched off so that it compiles hlopt's fusions as they are: its own fusion passes,
#: the deduplicator (it would share fused computations between fusions, which XLA's verifier rejects) and
#: layout assignment (it clears the layouts inside pre-existing fusions, and later passes abort on them;
#: `default_layouts` gives every shape the layout it would assign).
KEEP_OUR_FUSIONS = "priority-fusion,multi_output_fusion,rename_fusions,computation-deduplicator,layout-assignment"


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
    `KEEP_OUR_FUSIONS` off, as the deviceless comparison does (XLA:GPU rejects pre-fused modules with its
    layout assignment on). That form is experimental for execution: with layout assignment off, XLA:CPU
    miscomputes some dots, and on a GPU it is checked only by `benchmarks/gpu_run.py`."""
    from hlopt.runtime.reentry import cpu_fusion_kinds_only

    if not any(i.opcode == "fusion" for i in module.instructions()):
        return module, ""
    if not keep_fusions:
        return cpu_fusion_kinds_only(module, keep_fusions=False), ""
    return default_layouts(module.clone()), KEEP_OUR_FUSIONS


def gpu_python() -> Path:
    """The python of the venv that has jax-cuda12-plugin."""
    return Path(os.environ.get("HLOPT_XLA_GPU_PYTHON") or os.environ.get("XLA_GPU_PYTHON")
                or "/tmp/xla-gpu-venv/bin/python")


def gpu_tool() -> Path:
    """The deviceless-compile script."""
    return Path(os.environ.get("HLOPT_XLA_GPU_TOOL") or _ROOT.parent / "shared" / "tools" / "xla_gpu_compile.py")


def available() -> bool:
    """True when the tool and its venv are present."""
    return gpu_python().exists() and gpu_tool().exists()


@dataclass
class GpuCompileResult:
    """XLA:GPU's view of one module: its optimized module and its own estimates."""

    target: str
    optimized: Module
    optimized_text: str
    fusion_count: int
    kernel_launches: int | None
    fusion_exec_time_us: dict[str, float]
    report: dict[str, Any] = field(repr=False)

    def summary(self) -> str:
        """One line."""
        est = ", ".join(f"{m} {t:.1f} us" for m, t in self.fusion_exec_time_us.items()) or "no estimates"
        return (f"{self.optimized.name} on {self.target}: {self.fusion_count} fusions, "
                f"{self.kernel_launches} kernel launches; XLA estimates {est}")


def check_target(target: str) -> str:
    """The tool's spec name for a target; ValueError naming the known ones otherwise."""
    spec = TARGETS.get(target.lower())
    if spec is None:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(sorted(TARGETS))}")
    return spec


def compile_for_target(text: str, target: str, devices: int = 1, timeout: float = 600) -> GpuCompileResult:
    """Compile HLO text with XLA's GPU compiler for `target`, deviceless; raise RuntimeError on failure."""
    from hlopt import hlo

    spec = check_target(target)
    python, tool = gpu_python(), gpu_tool()
    if not tool.exists():
        raise RuntimeError(f"deviceless XLA:GPU compile tool not found at {tool} (set HLOPT_XLA_GPU_TOOL)")
    if not python.exists():
        setup = tool.parent / "setup_xla_gpu.sh"
        raise RuntimeError(f"no python with jax-cuda12-plugin at {python}: create it with `{setup} "
                           f"/tmp/xla-gpu-venv` or point HLOPT_XLA_GPU_PYTHON at one")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.hlo"
        src.write_text(text)
        cmd = [str(python), str(tool), str(src), "--spec", spec, "--devices", str(devices), "--out", tmp, "--json"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if run.returncode:
            raise RuntimeError(f"XLA:GPU compile for {target} failed:\n{run.stderr[-2000:]}")
        report = json.loads(run.stdout)
        optimized_text = (Path(tmp) / "optimized.hlo").read_text()
    fusions = report.get("fusions", [])
    static = report.get("kernels", {}).get("static", {})
    return GpuCompileResult(target, hlo.parse(optimized_text, filename=f"<XLA:GPU {target}>"), optimized_text,
                            len(fusions), static.get("total"), dict(report.get("fusion_exec_time_us_sum") or {}),
                            report)
