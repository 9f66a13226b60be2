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

from hlo.ir import Module

__all__ = ["GpuCompileResult", "compile_for_target", "gpu_python", "gpu_tool", "available", "TARGETS"]

_ROOT = Path(__file__).resolve().parents[1]
#: target name -> the tool's --spec (a file in ../shared/gpu_specs).
TARGETS = {"h100": "h100_sxm", "h100_sxm": "h100_sxm"}


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


def compile_for_target(text: str, target: str, devices: int = 1, timeout: float = 600) -> GpuCompileResult:
    """Compile HLO text with XLA's GPU compiler for `target`, deviceless; raise RuntimeError on failure."""
    import hlo

    spec = TARGETS.get(target.lower())
    if spec is None:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(sorted(TARGETS))}")
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
