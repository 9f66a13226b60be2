"""scheduler/bounds.py: the simulator's lower bound holds for every order and is tighter than the basic one."""

from __future__ import annotations

import random

import pytest
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.scheduler.async_ops import STREAM_MODELS, stream_model
from hlopt.scheduler.bounds import single_stream_bound
from hlopt.scheduler.costs import estimator_for
from hlopt.scheduler.simulator import simulate
from hlopt.scheduler.synthetic import synthetic_module


def _random_topological_order(comp, rng: random.Random) -> list:
    """A random order respecting operand and control edges (what any schedule must respect)."""
    preds = {i: set(i.operands) | set(i.control_predecessors) for i in comp.instructions}
    done: set = set()
    order = []
    ready = [i for i, p in preds.items() if not p]
    while ready:
        inst = ready.pop(rng.randrange(len(ready)))
        order.append(inst)
        done.add(inst)
        ready.extend(u for u in set(inst.users) | set(inst.control_successors)
                     if u not in done and u not in ready and preds[u] <= done)
    assert len(order) == len(comp.instructions)
    return order


@pytest.mark.parametrize("pattern,ratio,limit", [("fsdp", 4.0, 1), ("mixed", 1.0, 1), ("data-parallel", 2.0, 2),
                                                 ("pipeline", 1.0, 1)])
@pytest.mark.parametrize("model", STREAM_MODELS)
def test_bound_holds_for_random_orders(pattern: str, ratio: float, limit: int, model: str) -> None:
    module = synthetic_module(3, pattern, hidden=512, batch=512, comm_ratio=ratio)
    run_pipeline(module, "async-collective-creator")
    est = estimator_for("analytical")
    limits = {"default": limit}
    rng = random.Random(0)
    with stream_model(model):
        bound = simulate(module.entry, est, limits=limits).lower_bound_us
        for _ in range(200):
            result = simulate(module.entry, est, _random_topological_order(module.entry, rng), limits)
            assert result.lower_bound_us == pytest.approx(bound)
            assert result.makespan_us >= bound - 1e-6
            assert result.basic_lower_bound_us <= bound


def test_bound_tighter_than_basic_on_fsdp_prologue() -> None:
    """One stream per collective type: the first all-gather feeds all compute, nothing can run during it,
    which the basic bound ignores. On XLA:GPU's one collective stream the serialized collectives already
    make the basic bound tight, and the schedule is within 1% of it."""
    module = synthetic_module(4, "fsdp", comm_ratio=4.0)
    pipeline = "async-collective-creator,latency-hiding-scheduler{heuristic=start-delay,fill_windows=true%s}"
    run_pipeline(module, pipeline % ",stream_model=per-type")
    with stream_model("per-type"):
        result = simulate(module.entry, estimator_for("analytical"))
    assert result.lower_bound_us > 1.01 * result.basic_lower_bound_us
    assert result.makespan_us >= result.lower_bound_us - 1e-6
    module = synthetic_module(4, "fsdp", comm_ratio=4.0)
    run_pipeline(module, pipeline % "")
    result = simulate(module.entry, estimator_for("analytical"))
    assert result.basic_lower_bound_us <= result.lower_bound_us <= result.makespan_us + 1e-6
    assert result.makespan_us <= 1.01 * result.lower_bound_us


def test_single_stream_bound_uses_heads_and_tails() -> None:
    # a job of 5 released at 10 ends at 15 at the earliest, whatever the other does
    assert single_stream_bound([(10.0, 0.0, 5.0), (0.0, 7.0, 5.0)]) == pytest.approx(15.0)
    assert single_stream_bound([(3.0, 4.0, 5.0), (3.0, 4.0, 5.0)]) == pytest.approx(3.0 + 10.0 + 4.0)
    assert single_stream_bound([]) == 0.0
