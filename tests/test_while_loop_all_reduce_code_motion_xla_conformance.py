"""while-loop-all-reduce-code-motion against XLA's own pass tests
(tests/xla_conformance/while_loop_all_reduce_code_motion.py): every case, with the test's configuration, gives the
`changed` XLA's test asserts and its main structural assertions. Cases that still differ are listed with why; a
listed case that starts agreeing, or an unlisted one that stops, fails (the README's agreement table is this
count). Numerics: tests/test_while_loop_all_reduce_code_motion_xla_conformance_numerics.py."""

from __future__ import annotations

import pytest
from xla_conformance.common import Run, assert_agreement, assert_case, checks_on_input, run_case
from xla_conformance.while_loop_all_reduce_code_motion import CASES, SCATTER

#: cases hlopt does not agree with, and why
DIFFERING: dict[str, str] = {
    "ScatterAllReduceAccumulate": SCATTER,
    "ScatterAllReduceWithSelectAndConvert": SCATTER,
}


def test_the_asset_is_whole():
    assert len(CASES) == 65 and len({c.name for c in CASES}) == 65
    assert all(c.path.is_file() and c.runs for c in CASES)
    assert set(DIFFERING) <= {c.name for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case):
    assert_case(case, DIFFERING, run_case)


@pytest.mark.parametrize("case", [c for c in CASES if any(r.changed for r in c.runs) and c.checks],
                         ids=lambda c: c.name)
def test_checks_tell_the_rewrite_apart(case):
    assert len(checks_on_input(case)) < len(case.checks)  # some check fails on the input


@pytest.mark.parametrize("name", sorted(DIFFERING))
def test_the_scatter_cases_agree_with_the_unsafe_option(name):
    case = next(c for c in CASES if c.name == name)
    spec = case.runs[0].spec.replace("}", ",unsafe_scatter_motion=true}")
    assert run_case(type(case)(case.folder, case.name, (Run(spec, True),), case.checks)).agrees


def test_agreement():
    assert_agreement(CASES, DIFFERING, run_case, at_least=0.95)
