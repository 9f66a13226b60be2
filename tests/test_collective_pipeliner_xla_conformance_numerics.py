"""Numerics of collective-pipeliner on XLA's own pass-test inputs (tests/xla_conformance/collective_pipeliner.py):
every run that changes a case's module is executed before and after on XLA:CPU with the same inputs. The marker
custom-calls of a run that is not the last and the host-offloading custom-calls (identities on values) are
replaced by their operands first; cases whose module
XLA:CPU cannot run (send/recv, other custom-calls) or hlopt's verifier refuses are skipped with the reason.
Every module runs with its test's device counts (4 replicas x 2 partitions; 1 x 8 for the forward permutes;
the backward permutes' 4 x 8 are more than the 8 CPU devices and are skipped). The inputs run in f32 (every
bf16 made f32: XLA:CPU rounds a bf16 value differently when the rewrite moves it between fusions) and compare
to 1e-5."""

from __future__ import annotations

import pytest
from hlopt.passes.collectives.collective_pipeliner import (
    INSERTED_BY_PREVIOUS_STEP,
    SUNK_BY_PREVIOUS_STEP,
    is_marker,
)
from xla_conformance.collective_pipeliner import CASES, run_case

from hlopt import hlo, runtime

#: custom-calls that only a later pipeliner run removes, or no backend runs
_NOT_RUNNABLE = ("custom-call", "send", "recv", "send-done", "recv-done")


#: custom-calls that are identities on values: the pipeliner's markers (a later run removes them) and XLA's
#: host-offloading annotations (they only say where a value lives)
_IDENTITIES = (SUNK_BY_PREVIOUS_STEP, INSERTED_BY_PREVIOUS_STEP, "MoveToDevice", "MoveToHost")


def _without_markers(module) -> None:  # noqa: ANN001 - a Module
    """Replace the identity custom-calls (`_IDENTITIES`) by their operand."""
    for comp in module.computations:
        for inst in list(comp.instructions):
            if any(is_marker(inst, t) for t in _IDENTITIES):
                inst.replace_all_uses_with(inst.operand(0))
                if comp.root is inst:
                    comp.set_root(inst.operand(0))
                comp.remove_with_unused_operands(inst)


def _runnable(module) -> str:  # noqa: ANN001 - a Module
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode in _NOT_RUNNABLE:
                return f"%{inst.name} ({inst.opcode}) does not run on XLA:CPU"
    return ""


#: the largest array a case may hold to be run here (8 devices share the machine's memory)
_MAX_ELEMENTS = 1 << 22

#: inputs whose result the transformation XLA's test asks for does not keep, and why
NOT_PRESERVED = {
    "push_ag_over": "a hand-written level-1 input whose store indices run -3..-1: every dynamic-update-slice "
                    "clamps to row 0, so delaying a store one iteration (what level 1 does, trusting the level-0 "
                    "run to have proved the index in range) changes which store lands last",
}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_numerics(case):
    if case.name in NOT_PRESERVED:
        pytest.skip(NOT_PRESERVED[case.name])
    if case.replicas * case.partitions > 8:
        pytest.skip(f"{case.replicas} replicas x {case.partitions} partitions: more than 8 devices")
    outcome = run_case(case, keep_modules=True, f32=True)
    if not outcome.modules:
        pytest.skip("no run changed the module")
    largest = max((i.shape.numel for c in hlo.parse(case.text).computations for i in c.instructions
                   if not i.shape.is_tuple), default=0)
    if largest > _MAX_ELEMENTS:
        pytest.skip(f"an array of {largest} elements: too large to run on 8 CPU devices here")
    try:
        hlo.verify(hlo.parse(case.text))
    except hlo.HloVerifyError as e:
        pytest.skip(f"hlopt's verifier refuses the input: {str(e).splitlines()[1].strip()}")
    ran = 0
    for before, after in outcome.modules:
        _without_markers(before)
        _without_markers(after)
        reason = _runnable(before) or _runnable(after)
        if reason:
            continue
        for m in (before, after):  # the test's module config (see the module docstring)
            m.config["replica_count"], m.config["num_partitions"] = case.replicas, case.partitions
        result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-5)
        assert result.ok, str(result)
        ran += 1
    if not ran:
        pytest.skip(reason)
