"""scatter-simplifier, numerics: each simplified scatter (and the fusion of one) computes on XLA:CPU what the
original computes, with in-range and out-of-range indices; the structure is in test_scatter_simplifier.py."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.passes.framework.pipeline import run_pipeline
from test_scatter_simplifier import CASES, simplify

from hlopt import hlo, runtime


def _inputs(module: hlo.Module, seed: int) -> list[np.ndarray]:
    """Values 0..9 for the operand and updates, indices in -1..3 (some out of range: XLA skips those)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in module.entry.parameters:
        lo, hi = (-1, 4) if p.name == "i" else (0, 10)
        out.append(rng.integers(lo, hi, size=p.shape.dims).astype(np.int32))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_simplified_scatter_computes_the_same(name):
    before, m, changed = simplify(CASES[name][0])
    assert changed
    for seed in range(3):
        assert runtime.run_and_compare(before, m, inputs=_inputs(before, seed), rtol=0, atol=0).ok


def test_the_fusion_pipeline_fuses_a_simplified_scatter_that_computes_the_same():
    text = CASES["inserted_window_dim"][0].replace(
        "ROOT %r = s32[3,3] scatter(%x, %i, %u)",
        "%ii = s32[2,1] add(%i, %i)\n  %uu = s32[2,3] multiply(%u, %u)\n  ROOT %r = s32[3,3] scatter(%x, %ii, %uu)")
    m = hlo.parse(text)
    before = m.clone()
    run_pipeline(m, "fusion")
    hlo.verify(m)
    root = m.entry.root
    assert root.opcode == "fusion" and str(root.attrs["kind"]) == "kInput"
    body = {i.opcode for i in root.attrs["calls"].instructions}
    assert {"scatter", "add", "multiply", "reshape"} <= body
    for seed in range(3):
        assert runtime.run_and_compare(before, m, inputs=_inputs(before, seed), rtol=0, atol=0).ok
