"""Where latency-hiding-scheduler puts async starts and dones (structure; numerics in
test_async_placement_numerics.py).

XLA:GPU's scheduler runs with aggressive policies: an async start with no async op above it is delayed (bottom-up)
to the top of its computation (kStartAtZeroDepth), and a done is scheduled as soon as its users are (kScheduleDone:
right before the first user). Both keep the overlap window as wide as the data allows, whatever the latency
estimate: a collective that runs longer than estimated stays hidden (the pipelined loop bodies of
benchmarks/pipeline_vs_xla.py: a gradient all-reduce estimated at 74 us by hlopt's model, 109 us by XLA's)."""

from __future__ import annotations

import pytest
from hlopt.hlo.parser import parse
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.scheduler.async_ops import done_of, is_async_start
from hlopt.scheduler.costs import estimator_for
from hlopt.scheduler.fill import Timeline, sink_dones
from hlopt.scheduler.graph import ScheduleGraph

DOT = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
GROUP = "replica_groups={{0,1,2,3,4,5,6,7}}"
HEAD = """HloModule m, replica_count=8

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}
"""


def chain(n: int) -> str:
    """Four matmul + tanh steps on an [n, n] value, %t0 -> %t4."""
    return "\n".join(f"""  %d{k} = f32[{n},{n}] dot(%t{k - 1}, %t{k - 1}), {DOT}
  %t{k} = f32[{n},{n}] tanh(%d{k})""" for k in range(1, 5))


def one_all_reduce(n: int = 2048) -> str:
    """A gradient all-reduce read only at the end, beside a chain of four matmuls (each about as long as the
    collective by hlopt's estimates, together four times longer); the all-reduce needs nothing computed."""
    return HEAD + f"""
ENTRY %main (g: f32[1024,1024], x: f32[{n},{n}]) -> (f32[1024,1024], f32[{n},{n}]) {{
  %g = f32[1024,1024] parameter(0)
  %t0 = f32[{n},{n}] parameter(1)
  %ar = f32[1024,1024] all-reduce(%g), {GROUP}, to_apply=%sum
{chain(n)}
  %m = f32[1024,1024] multiply(%ar, %ar)
  ROOT %out = (f32[1024,1024], f32[{n},{n}]) tuple(%m, %t4)
}}
"""


def two_all_reduces(n: int = 2048) -> str:
    """Two independent all-reduces beside the chain (one collective stream: one after the other)."""
    return HEAD + f"""
ENTRY %main (g: f32[1024,1024], h: f32[1024,1024], x: f32[{n},{n}]) -> (f32[1024,1024], f32[1024,1024], f32[{n},{n}]) {{
  %g = f32[1024,1024] parameter(0)
  %h = f32[1024,1024] parameter(1)
  %t0 = f32[{n},{n}] parameter(2)
  %ar1 = f32[1024,1024] all-reduce(%g), {GROUP}, to_apply=%sum
  %ar2 = f32[1024,1024] all-reduce(%h), {GROUP}, to_apply=%sum
{chain(n)}
  %m1 = f32[1024,1024] multiply(%ar1, %ar1)
  %m2 = f32[1024,1024] multiply(%ar2, %ar2)
  ROOT %out = (f32[1024,1024], f32[1024,1024], f32[{n},{n}]) tuple(%m1, %m2, %t4)
}}
"""


def chained_all_reduces(n: int = 2048) -> str:
    """The second all-reduce reads the first one's result: its start has an async op above it."""
    return HEAD + f"""
ENTRY %main (g: f32[1024,1024], x: f32[{n},{n}]) -> (f32[1024,1024], f32[{n},{n}]) {{
  %g = f32[1024,1024] parameter(0)
  %t0 = f32[{n},{n}] parameter(1)
  %ar1 = f32[1024,1024] all-reduce(%g), {GROUP}, to_apply=%sum
  %e = f32[1024,1024] exponential(%ar1)
  %ar2 = f32[1024,1024] all-reduce(%e), {GROUP}, to_apply=%sum
{chain(n)}
  %m = f32[1024,1024] multiply(%ar2, %ar2)
  ROOT %out = (f32[1024,1024], f32[{n},{n}]) tuple(%m, %t4)
}}
"""


def scheduled(text: str, spec: str = "latency-hiding-scheduler"):
    module = parse(text)
    run_pipeline(module, f"async-collective-creator,{spec}")
    return module


def names(module) -> list[str]:
    return [i.name for i in module.entry.instructions]


def test_async_depth_from_top_is_xlas():
    """XLA's async depth: 0 down to a start, its latency from the done on (through plain edges unchanged)."""
    module = parse(chained_all_reduces())
    run_pipeline(module, "async-collective-creator")
    estimator = estimator_for("analytical")
    graph = ScheduleGraph(module.entry, estimator)
    depth = {n.inst.name: n.async_depth_from_top for n in graph.nodes}
    first = next(i for i in module.entry.instructions if i.name == "ar1-start")
    latency = estimator.latency(first, done_of(first))
    assert latency > 0
    assert depth["ar1-start"] == depth["d1"] == depth["t4"] == 0.0
    assert depth["ar1-done"] == depth["e"] == depth["ar2-start"] == pytest.approx(latency)
    assert depth["ar2-done"] > depth["ar2-start"]


def test_start_with_nothing_async_above_goes_to_the_top():
    """The start is issued before the first matmul, not one matmul before the done (the estimated latency),
    and the done stays right before its user."""
    order = names(scheduled(one_all_reduce()))
    assert order.index("ar-start") < order.index("d1")
    assert order.index("ar-done") == order.index("m") - 1
    assert order.index("ar-done") > order.index("t4")


def test_start_below_a_done_is_not_forced_up():
    """A start reading another collective's result has an async depth above 0: the rule leaves it to the
    latency estimate, and it never moves above the done it reads."""
    order = names(scheduled(chained_all_reduces()))
    assert order.index("ar1-start") < order.index("d1")
    assert order.index("ar1-done") < order.index("e") < order.index("ar2-start") < order.index("ar2-done")


@pytest.mark.parametrize("heuristic", ["xla-default", "xla-default+alone"])
def test_first_done_stays_before_the_next_start_and_no_later(heuristic):
    """One collective stream, overlap limit 1: the first done goes right before the second start (the next
    async op of its kind), the second done right before its user."""
    spec = "latency-hiding-scheduler" if "+" not in heuristic else \
        "latency-hiding-scheduler{alternative_heuristics='',fill_within_memory=false}"
    order = names(scheduled(two_all_reduces(), spec))
    assert order.index("ar1-start") < order.index("d1")
    assert order.index("ar1-done") == order.index("ar2-start") - 1
    assert order.index("ar2-done") == order.index("m2") - 1


def _timeline(text: str):
    module = scheduled(text)
    comp = module.entry
    return module, comp, Timeline(comp, estimator_for("analytical"), {"default": 1})


def test_sink_dones_moves_each_done_to_its_first_user_and_keeps_kind_order():
    module, comp, timeline = _timeline(two_all_reduces())
    by_name = {i.name: i for i in comp.instructions}
    order = list(comp.instructions)
    for name, after in (("ar1-done", "ar1-start"), ("ar2-done", "ar2-start")):  # hoist each done to its start
        order.remove(by_name[name])
        order.insert(order.index(by_name[after]) + 1, by_name[name])
    sunk = sink_dones(order, timeline)
    pos = {inst.name: i for i, inst in enumerate(sunk)}
    assert sorted(map(id, sunk)) == sorted(map(id, order))
    assert all(pos[op.name] < pos[inst.name] for inst in sunk for op in inst.operands)
    assert pos["ar1-done"] == pos["ar2-start"] - 1  # bounded by the next async op of its kind
    assert pos["ar2-done"] == pos["m2"] - 1  # bounded by its user
    assert timeline.makespan(sunk) <= timeline.makespan(order) + 1e-9
    starts = [i.name for i in sunk if is_async_start(i)]
    assert starts == [i.name for i in order if is_async_start(i)]
    assert sink_dones(sunk, timeline) == sunk


def test_sink_dones_wins_back_what_a_longer_collective_would_expose():
    """On the same order, a collective twice as long as estimated: done right after the estimated window
    exposes the difference, the sunk done hides it."""
    module, comp, timeline = _timeline(one_all_reduce())
    by_name = {i.name: i for i in comp.instructions}
    start = by_name["ar-start"]
    order = [by_name["g"], start, *(i for i in comp.instructions if i.name not in ("g", "ar-start", "ar-done"))]
    order.insert(order.index(by_name["d1"]) + 1, by_name["ar-done"])  # about the estimated latency in
    slower = Timeline(comp, _Scaled(estimator_for("analytical"), 2.0), {"default": 1})
    compute = sum(slower.cost)
    assert slower.run(order).makespan > compute + 0.25 * slower.latency[start]  # the done waits
    sunk = sink_dones(order, timeline)
    assert slower.run(sunk).makespan == pytest.approx(compute)  # hidden
    assert timeline.makespan(sunk) <= timeline.makespan(order) + 1e-9


class _Scaled:
    """An estimator whose collectives take `factor` times longer."""

    def __init__(self, base, factor: float):
        self.base, self.factor = base, factor

    def node_cost(self, inst):
        return self.base.node_cost(inst)

    def latency(self, start, done):
        return self.factor * self.base.latency(start, done)
