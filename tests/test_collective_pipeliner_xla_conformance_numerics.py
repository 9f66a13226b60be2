"""Numerics of collective-pipeliner on XLA's own pass-test inputs (tests/xla_conformance/collective_pipeliner.py):
every run that changes a case's module is executed before and after on XLA:CPU with the same inputs. The marker
custom-calls of a run that is not the last (identities) are replaced by their operands first; cases whose module
XLA:CPU cannot run (send/recv, other custom-calls) or hlopt's verifier refuses are skipped with the reason.
Every module runs with its test's device counts (4 replicas x 2 partitions; 1 x 8 for the forward permutes;
the backward permutes' 4 x 8 are more than the 8 CPU devices and are skipped). The inputs run in f32 (every
bf16 made f32: XLA:CPU rounds a bf16 value differently when the rewrite moves it between fusions) and compare
to 1e-5."""

from __future__ import annotations

import pytest
from hlopt.passes.collective_pipeliner import INSERTED_BY_PREVIOUS_STEP, SUNK_BY_PREVIOUS_STEP, is_marker
from xla_conformance.collective_pipeliner import CASES, run_case

from hlopt import hlo, runtime

#: custom-calls that only a later pipeliner run removes, or no backend runs
_NOT_RUNNABLE = ("custom-call", "send", "recv", "send-done", "recv-done")


def _without_markers(module) -> None:  # noqa: ANN001 - a Module
    """Replace the pipeliner's marker custom-calls (identities a later run removes) by their operand."""
    for comp in module.computations:
        for inst in list(comp.instructions):
            if is_marker(inst, SUNK_BY_PREVIOUS_STEP) or is_marker(inst, INSERTED_BY_PREVIOUS_STEP):
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


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_numerics(case):
    if case.replicas * case.partitions > 8:
        pytest.skip(f"{case.replicas} replicas x {case.partitions} partitions: more than 8 devices")
    outcome = run_case(case, keep_modules=True, f32=True)
    if not outcome.modules:
        pytest.skip("no run changed the module")
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
