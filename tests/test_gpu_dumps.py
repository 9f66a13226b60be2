"""XLA:GPU's optimized modules (deviceless compile through ../shared/tools) parse, verify and round-trip.

Skipped where the tool's venv is not set up (`../shared/tools/setup_xla_gpu.sh /tmp/xla-gpu-venv`).
"""

from __future__ import annotations

import pytest
from corpus import corpus_texts

from hlopt import hlo, runtime

NAMES = ["transformer_train_step", "mlp_grad", "scan_rnn", "shmap_grad_accumulation"]


@pytest.mark.parametrize("name", NAMES)
def test_xla_gpu_optimized_module_round_trips(name):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.xla_gpu import available, xla_gpu_compile

    if not available():
        pytest.skip("XLA GPU deviceless tool not set up")
    entry = next(e for e in corpus_texts() if e.id == name)
    try:
        report = xla_gpu_compile(entry.text)
    except RuntimeError as e:
        pytest.skip(f"XLA:GPU cannot compile {name}: {str(e).splitlines()[-1]}")
    text = report["optimized_text"]
    module = hlo.parse(text, filename=f"{name}.gpu.after_optimizations.txt")
    hlo.verify(module)
    assert runtime.xla_canonical_text(module.to_text()) == runtime.xla_canonical_text(text)
