"""Numerics of call-inliner on XLA's own pass-test inputs (tests/xla_conformance/call_inliner.py): every run that
changes a case's module is executed before and after on XLA:CPU with the same inputs; cases XLA:CPU cannot run
(custom calls, outfeed, async calls on other threads) are skipped with the reason."""

from __future__ import annotations

import pytest
from xla_conformance.call_inliner import CASES
from xla_conformance.numerics import check


@pytest.mark.parametrize("case", [c for c in CASES if any(r.changed for r in c.runs)], ids=lambda c: c.name)
def test_case_numerics(case):
    reason = check(case, rtol=0, atol=0)
    if reason:
        pytest.skip(reason)
