"""hlopt.hlo.analysis: while-loop analysis (induction variable, range, trip count, affine indices) and replication
analysis, on hand-written modules. Structure only: this file imports no jax (checked in a child process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hlopt.hlo.analysis import (
    CollectiveReplication,
    DeviceConfig,
    LoopRange,
    ReplicationAnalysis,
    affine_in_induction_variable,
    collective_group_mode,
    device_config,
    induction_variable,
    is_induction_variable,
    loop_max_value,
    loop_range,
    replica_groups,
    trip_count,
)
from hlopt.hlo.ir import Instruction, Module

from hlopt import hlo

ROOT = Path(__file__).resolve().parents[1]


def _loop(start: int = 0, step: str = "add(%i, %one)", one: int = 1, compare: str = "compare(%ci, %n)",
          direction: str = "LT", bound: int = 16, body_extra: str = "", while_attrs: str = "") -> Module:
    """A module with one while over (s32[] i, f32[4] x)."""
    return hlo.parse(f"""HloModule m

%cond (cp: (s32[], f32[4])) -> pred[] {{
  %cp = (s32[], f32[4]) parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %n = s32[] constant({bound})
  ROOT %c = pred[] {compare}, direction={direction}
}}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {{
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4] get-tuple-element(%p), index=1
  %one = s32[] constant({one}){body_extra}
  %next = s32[] {step}
  ROOT %t = (s32[], f32[4]) tuple(%next, %x)
}}

ENTRY %e (a: f32[4]) -> (s32[], f32[4]) {{
  %a = f32[4] parameter(0)
  %s = s32[] constant({start})
  %init = (s32[], f32[4]) tuple(%s, %a)
  ROOT %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body{while_attrs}
}}
""")


def _while(m: Module) -> Instruction:
    return next(i for i in m.instructions() if i.opcode == "while")


def _inst(m: Module, name: str) -> Instruction:
    return next(i for i in m.instructions() if i.name == name)


# --------------------------------------------------------------------------- while-loop analysis
def test_counted_loop_from_zero():
    w = _while(_loop())
    assert induction_variable(w) == 0
    assert loop_range(w) == LoopRange(start=0, step=1, trip_count=16)
    assert loop_range(w).max_value == 15 and loop_max_value(w, 0) == 15
    assert trip_count(w) == 16


@pytest.mark.parametrize("kwargs,trips", [
    ({"start": 2, "one": 3, "direction": "LE", "bound": 10}, 3),            # 2, 5, 8
    ({"start": 10, "step": "subtract(%i, %one)", "one": 2, "direction": "GT", "bound": 0}, 5),  # 10..2
    ({"compare": "compare(%n, %ci)", "direction": "GT", "bound": 5}, 5),   # 5 > i
    ({"step": "add(%one, %i)", "one": 2, "direction": "NE", "bound": 6}, 3),
    ({"start": 5, "bound": 3}, 0),
    ({"start": 4, "direction": "EQ", "bound": 4}, 1),
])
def test_trip_counts(kwargs, trips):
    assert trip_count(_while(_loop(**kwargs))) == trips


def test_unknown_trip_counts():
    assert trip_count(_while(_loop(step="add(%one, %i)", one=4, direction="NE", bound=6))) is None  # skips 6
    assert trip_count(_while(_loop(one=-1))) is None                          # i < 16 counting down: unbounded
    no_ivar = _loop(step="multiply(%i, %one)", one=2)                          # not i + constant
    assert induction_variable(_while(no_ivar)) is None and trip_count(_while(no_ivar)) is None


def test_known_trip_count_wins():
    w = _while(_loop(while_attrs=', backend_config={"known_trip_count":{"n":"7"}}'))
    assert trip_count(w) == 7 and loop_range(w).trip_count == 16


def test_loop_max_value_only_for_zero_based_step_one_loops():
    assert loop_max_value(_while(_loop(direction="LE", bound=7)), 0) == 7
    assert loop_max_value(_while(_loop(start=1)), 0) is None
    assert loop_max_value(_while(_loop(one=2)), 0) is None
    assert loop_max_value(_while(_loop(start=5, bound=3)), 0) is None        # never runs


def test_affine_index_expressions():
    m = _loop(body_extra="""
  %three = s32[] constant(3)
  %two = s32[] constant(2)
  %rev = s32[] subtract(%three, %i)
  %rev1 = s32[] subtract(%rev, %one)
  %dbl = s32[] multiply(%i, %two)
  %dbl1 = s32[] add(%dbl, %one)
  %sq = s32[] multiply(%i, %i)
  %neg = s32[] negate(%i)""")
    p = _inst(m, "p")
    assert affine_in_induction_variable(_inst(m, "rev1"), p, 0) == (-1, 2)
    assert affine_in_induction_variable(_inst(m, "dbl1"), p, 0) == (2, 1)
    assert affine_in_induction_variable(_inst(m, "neg"), p, 0) == (-1, 0)
    assert affine_in_induction_variable(_inst(m, "sq"), p, 0) is None
    assert affine_in_induction_variable(_inst(m, "x"), p, 0) is None      # not an integer scalar
    assert is_induction_variable(_inst(m, "rev1"), p, 0, 2)                # (3 - i) - 1 == 2 - i
    assert not is_induction_variable(_inst(m, "rev1"), p, 0, 3)
    assert is_induction_variable(_inst(m, "i"), p, 0, 15)
    assert not is_induction_variable(_inst(m, "dbl1"), p, 0, 15)


# --------------------------------------------------------------------------- replication analysis
REPLICAS = """HloModule m, replica_count=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

ENTRY %e (x: f32[4]) -> (f32[4], f32[4], f32[4], u32[], s32[1], f32[4]) {
  %x = f32[4] parameter(0)
  %all = f32[4] all-reduce(%x), replica_groups={}, to_apply=%sum
  %pairs = f32[4] all-reduce(%x), replica_groups={{0,1},{2,3}}, to_apply=%sum
  %c = f32[4] constant({1, 2, 3, 4})
  %mixed = f32[4] add(%pairs, %c)
  %rid = u32[] replica-id()
  %table = s32[4] constant({0, 0, 1, 1})
  %offset = s32[1] dynamic-slice(%table, %rid), dynamic_slice_sizes={1}
  %noisy = f32[4] add(%all, %x)
  ROOT %t = (f32[4], f32[4], f32[4], u32[], s32[1], f32[4]) tuple(%all, %pairs, %mixed, %rid, %offset, %noisy)
}
"""


def test_replica_analysis_groups_and_device_ids():
    m = hlo.parse(REPLICAS)
    ra = ReplicationAnalysis(m, "replica")
    assert ra.converged
    assert ra.is_replicated(_inst(m, "all")) and ra.is_replicated(_inst(m, "c"))
    pairs = _inst(m, "pairs")
    assert not ra.is_replicated(pairs) and ra.replicated_within(pairs, [[0, 1], [2, 3]])
    assert not ra.replicated_within(pairs, [[0, 2], [1, 3]])
    assert ra.replicated_within(_inst(m, "mixed"), [[0, 1], [2, 3]])
    assert not ra.replicated_within(_inst(m, "rid"), [[0, 1]])
    offset = _inst(m, "offset")                                    # table[replica-id], evaluated per device
    assert ra.replicated_within(offset, [[0, 1], [2, 3]]) and not ra.is_replicated(offset)
    assert not ra.replicated_within(_inst(m, "noisy"), [[0, 1]])
    assert not ra.replicated_within(_inst(m, "all"), [[0, 7]])     # a device the axis does not have


def test_collective_modes_and_within_groups():
    m = hlo.parse(REPLICAS)
    pairs = _inst(m, "pairs")
    assert replica_groups(pairs) == [[0, 1], [2, 3]] and replica_groups(_inst(m, "all")) is None
    assert collective_group_mode(pairs) == "cross_replica"
    rep = CollectiveReplication(m)
    assert rep.devices == DeviceConfig(4, 1, True)
    assert rep.within_groups(_inst(m, "mixed"), pairs)             # equal within {0,1} and {2,3}
    assert not rep.within_groups(_inst(m, "mixed"), _inst(m, "all"))
    ra, pa = rep.analyses()
    assert ra is not None and pa is None                           # one partition: no partition analysis


PARTITIONS = """HloModule m, num_partitions=8

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

%cond (cp: (s32[], f32[2], f32[2])) -> pred[] {
  %cp = (s32[], f32[2], f32[2]) parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}

%body (p: (s32[], f32[2], f32[2])) -> (s32[], f32[2], f32[2]) {
  %p = (s32[], f32[2], f32[2]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %g = f32[2] get-tuple-element(%p), index=1
  %acc = f32[2] get-tuple-element(%p), index=2
  %ar = f32[2] all-reduce(%g), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%sum
  %sum_acc = f32[2] add(%acc, %ar)
  ROOT %t = (s32[], f32[2], f32[2]) tuple(%next, %g, %sum_acc)
}

ENTRY %e (x: f32[2], rep: f32[2]) -> (s32[], f32[2], f32[2]) {
  %x = f32[2] parameter(0)
  %rep = f32[2] parameter(1), sharding={replicated}
  %zero = s32[] constant(0)
  %init = (s32[], f32[2], f32[2]) tuple(%zero, %x, %rep)
  ROOT %w = (s32[], f32[2], f32[2]) while(%init), condition=%cond, body=%body
}
"""


def test_partition_analysis_through_a_loop():
    m = hlo.parse(PARTITIONS)
    assert device_config(m) == DeviceConfig(1, 8, True)
    pa = ReplicationAnalysis(m, "partition")
    assert pa.is_replicated(_inst(m, "rep")) and not pa.is_replicated(_inst(m, "x"))
    assert pa.is_replicated(_inst(m, "acc"))        # replicated init + all-reduced values, every iteration
    assert not pa.is_replicated(_inst(m, "g"))      # carried unchanged from a sharded parameter
    assert pa.is_replicated(_inst(m, "i"))
    assert collective_group_mode(_inst(m, "ar")) == "flattened"


def test_partition_analysis_sees_an_unreduced_accumulator():
    m = hlo.parse(PARTITIONS.replace("%sum_acc = f32[2] add(%acc, %ar)", "%sum_acc = f32[2] add(%acc, %g)"))
    assert not ReplicationAnalysis(m, "partition").is_replicated(_inst(m, "acc"))


def test_bad_axis_is_a_clear_error():
    with pytest.raises(ValueError, match="replica' or 'partition"):
        ReplicationAnalysis(hlo.parse(REPLICAS), "device")


def test_analyses_import_no_jax():
    code = ("import sys, hlopt.hlo.analysis, hlopt.passes.collectives.while_loop_all_reduce_code_motion; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')]; assert not bad, bad")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
