"""Run XLA's real GPU compiler deviceless through ../shared/tools/xla_gpu_compile.py (see its README).

Set up once with `../shared/tools/setup_xla_gpu.sh /tmp/xla-gpu-venv`; XLA_GPU_PYTHON overrides the venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["xla_gpu_compile", "TOOL", "available", "corpus_programs"]

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT.parent / "shared" / "tools" / "xla_gpu_compile.py"
PYTHON = os.environ.get("XLA_GPU_PYTHON", "/tmp/xla-gpu-venv/bin/python")


def available() -> bool:
    """True when the tool and its venv are present."""
    return TOOL.exists() and Path(PYTHON).exists()


def xla_gpu_compile(hlo_text: str, spec: str = "h100_sxm", disable_passes: str | None = None) -> dict:
    """The tool's JSON report for this module (plus `optimized_text`)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.hlo"
        src.write_text(hlo_text)
        cmd = [PYTHON, str(TOOL), str(src), "--spec", spec, "--out", tmp, "--json"]
        if disable_passes:
            cmd += ["--disable-passes", disable_passes]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if run.returncode:
            raise RuntimeError(f"xla_gpu_compile failed:\n{run.stderr[-2000:]}")
        report = json.loads(run.stdout)
        report["optimized_text"] = (Path(tmp) / "optimized.hlo").read_text()
        return report


def corpus_programs(names: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, unoptimized HLO) of single-device corpus programs."""
    sys.path.insert(0, str(ROOT / "tests"))
    import conftest  # noqa: F401 - 8 CPU devices, set before jax is imported
    from corpus import corpus_texts

    return [(e.id, e.text) for e in corpus_texts(optimized=False)
            if e.devices == 1 and (names is None or e.id in names)]
