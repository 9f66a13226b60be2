"""horizontal-loop-fusion, numerics: the modules of test_horizontal_loop_fusion.py run on XLA CPU before and after,
same inputs."""

from __future__ import annotations

import pytest
from test_horizontal_loop_fusion import LOOP, PARAMETER_COPIES, UPDATES, _run

from hlopt import runtime


@pytest.mark.parametrize(("text", "fuse_first"), [(UPDATES, True), (UPDATES, False), (PARAMETER_COPIES, False),
                                                   (LOOP, False)],
                         ids=["fused-updates", "lone-updates", "parameter-copies", "loop-body"])
def test_horizontal_loop_fusion_computes_the_same(text, fuse_first):
    before, m, r = _run(text, fuse_first)
    assert r.changed
    assert runtime.run_and_compare(before, m, rtol=0, atol=0).ok
