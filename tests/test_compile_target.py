"""runtime.compile(module, target="h100"): XLA's GPU compiler, deviceless, through the shared tool's venv."""

from __future__ import annotations

import pytest

import hlo
import runtime
from runtime import xla_gpu

TEXT = """HloModule add_tanh

ENTRY main {
  a = f32[256,256] parameter(0)
  b = f32[256,256] parameter(1)
  c = f32[256,256] add(a, b)
  d = f32[256,256] tanh(c)
  ROOT e = f32[256,256] multiply(d, a)
}
"""


def test_unknown_target_and_missing_venv(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="unknown target"):
        runtime.compile(TEXT, target="tpu9")
    monkeypatch.setenv("HLOPT_XLA_GPU_PYTHON", str(tmp_path / "nope" / "python"))
    if xla_gpu.gpu_tool().exists():
        with pytest.raises(RuntimeError, match="setup_xla_gpu.sh"):
            runtime.compile(TEXT, target="h100")


@pytest.mark.skipif(not xla_gpu.available(), reason="no XLA:GPU venv (../shared/tools/setup_xla_gpu.sh)")
def test_compile_for_h100_deviceless():
    result = runtime.compile(hlo.parse(TEXT), target="h100")
    assert isinstance(result, xla_gpu.GpuCompileResult)
    assert result.fusion_count == 1  # add, tanh, multiply: one loop fusion
    assert result.optimized.instruction_count() >= 3
    assert any(t > 0 for t in result.fusion_exec_time_us.values()), result.fusion_exec_time_us
    assert "h100" in result.summary()
