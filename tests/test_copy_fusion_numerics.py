"""copy-fusion, numerics: the modules of test_copy_fusion.py run on XLA CPU before and after, same inputs."""

from __future__ import annotations

import pytest
from test_copy_fusion import COPIES_OF_A_FUSION, COPIES_OF_A_LONE_BROADCAST, COPIES_THROUGH_A_GTE, _run

from hlopt import runtime


@pytest.mark.parametrize("text", [COPIES_OF_A_FUSION, COPIES_THROUGH_A_GTE, COPIES_OF_A_LONE_BROADCAST],
                         ids=["fusion", "through-gte", "lone-broadcast"])
def test_copy_fusion_computes_the_same(text):
    before, m, r = _run(text)
    assert r.changed
    assert runtime.run_and_compare(before, m, rtol=0, atol=0).ok
