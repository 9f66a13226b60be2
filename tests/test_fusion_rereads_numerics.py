"""Re-reads of a fused operand, numerics: the modules of test_fusion_rereads.py run on XLA:CPU before and
after priority-fusion and multi-output-fusion (same inputs); the structure checks are in test_fusion_rereads.py."""

from __future__ import annotations

import pytest
from hlopt.passes.framework.pipeline import run_pipeline
from test_fusion_rereads import (
    BITCAST_SIBLINGS,
    COLUMN_VARIANCE,
    DOUBLE_USE,
    LOOP_SIBLINGS,
    ONE_KERNEL,
    ROW_VARIANCE,
    TRANSPOSING_PRODUCER,
    TWO_KERNELS,
)

from hlopt import hlo, runtime


@pytest.mark.parametrize("text", [COLUMN_VARIANCE, ROW_VARIANCE, LOOP_SIBLINGS, BITCAST_SIBLINGS,
                                  TRANSPOSING_PRODUCER, DOUBLE_USE],
                         ids=["column-variance", "row-variance", "loop-siblings", "bitcast-siblings",
                              "transposing-producer", "double-use"])
def test_fused_module_computes_the_same(text):
    before = hlo.parse(text)
    after = before.clone()
    run_pipeline(after, "priority-fusion,multi-output-fusion")
    assert runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-4).ok


def test_the_two_variants_xla_rates_compute_the_same():
    assert runtime.run_and_compare(hlo.parse(TWO_KERNELS), hlo.parse(ONE_KERNEL), rtol=1e-4, atol=1e-4).ok
