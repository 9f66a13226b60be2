"""XLA:GPU's optimized modules (deviceless compile through hlopt's driver) parse, verify and round-trip, and the
benchmark report built from them (corpus/xla_reference.py) agrees with hlopt's own reading of XLA's final module.

Marked `xla_gpu`: skipped where the compiler is not installed (`python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install`).
"""

from __future__ import annotations

import pytest
from hlopt.corpus.programs import corpus_texts
from hlopt.runtime.xla_gpu_path import xla_gpu

from hlopt import hlo, runtime

NAMES = ["transformer_train_step", "mlp_grad", "scan_rnn", "shmap_grad_accumulation"]
needs_compiler = pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")


def _compile(name: str) -> dict:
    from hlopt.corpus.xla_reference import xla_gpu_compile

    entry = next(e for e in corpus_texts() if e.id == name)
    try:
        return xla_gpu_compile(entry.text, devices=entry.devices)
    except RuntimeError as e:
        pytest.skip(f"XLA:GPU cannot compile {name}: {str(e).splitlines()[-1]}")


@pytest.mark.xla_gpu
@needs_compiler
@pytest.mark.parametrize("name", NAMES)
def test_xla_gpu_optimized_module_round_trips(name):
    text = _compile(name)["optimized_text"]
    module = hlo.parse(text, filename=f"{name}.gpu.after_optimizations.txt")
    hlo.verify(module)
    assert runtime.xla_canonical_text(module.to_text()) == runtime.xla_canonical_text(text)


@pytest.mark.xla_gpu
@needs_compiler
def test_report_matches_hlopt_reading_of_the_final_module():
    """Kernel counts, per-fusion estimates x trips and XLA's cost analysis of scan_rnn (a while loop)."""
    report = _compile("scan_rnn")
    final = hlo.parse(report["optimized_text"])
    est = xla_gpu.estimate(final, "h100")
    assert report["kernels"]["static"]["total"] == est.static_launches
    assert report["kernels"]["dynamic"]["total"] > report["kernels"]["static"]["total"]  # the loop runs more
    assert any(f["times"] > 1 for f in report["fusions"])
    modeled = sum(xla_gpu.estimate_of(i) or 0.0 for c, t in xla_gpu.executed_computations(final)
                  for i in c.instructions if i.opcode == "fusion" for _ in range(t))
    assert report["fusion_exec_time_us_sum_x_trips"]["default"] == pytest.approx(modeled, abs=1e-3)
    cost = report["cost_analysis"]
    assert cost["flops"] > 0 and cost["bytes_accessed"] > 0
    assert "HloCostAnalysis" in report["cost_analysis_source"]
