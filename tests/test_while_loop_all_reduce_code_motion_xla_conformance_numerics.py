"""Numerics of while-loop-all-reduce-code-motion on XLA's own pass-test inputs
(tests/xla_conformance/while_loop_all_reduce_code_motion.py): every run that changes a case's module is executed
before and after on XLA:CPU with the same inputs, on 4 replicas where the test sets no device count (its
collectives name 4 devices), trip-count parameters 3. Cases XLA:CPU cannot run (custom calls, elided constants)
are skipped with the reason."""

from __future__ import annotations

import pytest
from xla_conformance.numerics import check
from xla_conformance.while_loop_all_reduce_code_motion import CASES

_BIG = {"ReduceScatterAccumulate", "ReduceScatterTransposeAccumulate", "ReduceScatterTransposeConvertAccumulate",
        "ReduceScatterConvertAccumulate", "AllReduceSliceAccumulate", "DynamicSliceAllReduceDynamicUpdateSliceAccumulate"}


def _params():
    for c in CASES:
        if any(r.changed for r in c.runs):
            yield pytest.param(c, id=c.name, marks=pytest.mark.slow if c.name in _BIG else ())


#: a bf16 all-reduce summed 7 times in the loop before, once after: bf16 rounding of sums up to ~20 (ulp 0.125)
_TOLERANCE = {"DynamicSliceAllReduceDynamicUpdateSliceAccumulate": (0.1, 1.0)}


@pytest.mark.parametrize("case", list(_params()))
def test_case_numerics(case):
    rtol, atol = _TOLERANCE.get(case.name, (2e-2, 5e-2))  # bf16 collectives in some cases
    reason = check(case, rtol=rtol, atol=atol)
    if reason:
        pytest.skip(reason)
