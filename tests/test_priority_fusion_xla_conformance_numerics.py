"""Numerics of priority-fusion on XLA's own pass-test inputs (tests/xla_conformance/priority_fusion.py): every run
that changes a case's module is executed before and after on XLA:CPU with the same inputs (runtime.compile inlines
the fusions). Cases XLA:CPU cannot run (custom calls, elided constants, arrays of hundreds of MB) are skipped with
the reason."""

from __future__ import annotations

import pytest
from test_priority_fusion_xla_conformance import DIFFERING
from xla_conformance.numerics import check
from xla_conformance.priority_fusion import CASES


@pytest.mark.parametrize("case", [c for c in CASES if any(r.changed for r in c.runs)], ids=lambda c: c.name)
def test_case_numerics(case):
    if "verifier error" in DIFFERING.get(case.name, ""):
        pytest.skip("hlopt's result does not verify (listed in DIFFERING)")
    reason = check(case, rtol=1e-4, atol=1e-4)
    if reason:
        pytest.skip(reason)
