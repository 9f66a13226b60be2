"""tree-reduction-rewriter, numerics: the modules of test_tree_reduction_rewriter.py run on XLA CPU before and
after, same inputs (the sum is taken in another order: equal up to rounding)."""

from __future__ import annotations

import pytest
from test_tree_reduction_rewriter import BATCHED, CHANNEL_SUM, _run

from hlopt import runtime


@pytest.mark.parametrize("text", [CHANNEL_SUM, BATCHED], ids=["channel-sum", "batched"])
def test_split_reduction_computes_the_same(text):
    before, m, r = _run(text)
    assert r.changed
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-4).ok
