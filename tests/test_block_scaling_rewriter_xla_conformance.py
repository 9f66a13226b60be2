"""block-scaling-rewriter against XLA's own pass tests (tests/xla_conformance/block_scaling_rewriter.py): every
case, with the test's configuration, gives the `changed` XLA's test asserts and its FileCheck structure. Cases
that still differ are listed with why; a listed case that starts agreeing, or an unlisted one that stops, fails
(the README's agreement table is this count). Numerics: tests/test_block_scaling_rewriter.py checks the same
expansions against a numpy reference (XLA:CPU cannot run the custom calls themselves)."""

from __future__ import annotations

import pytest
from xla_conformance.block_scaling_rewriter import CASES
from xla_conformance.common import assert_agreement, assert_case, checks_on_input, run_case

#: cases hlopt does not agree with yet, and why
DIFFERING: dict[str, str] = {}


def test_the_asset_is_whole():
    assert len(CASES) == 10 and len({c.name for c in CASES}) == 10
    assert all(c.path.is_file() and c.runs and c.checks for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case):
    assert_case(case, DIFFERING, run_case)


@pytest.mark.parametrize("case", [c for c in CASES if any(r.changed for r in c.runs)],
                         ids=lambda c: c.name)
def test_checks_tell_the_rewrite_apart(case):
    assert len(checks_on_input(case)) < len(case.checks)  # some check fails on the input


def test_agreement():
    assert_agreement(CASES, DIFFERING, run_case, at_least=0.95)
