"""XLA's while-loop-all-reduce-code-motion cases (../shared/xla_cases/while_loop_all_reduce_code_motion):
each case with INDEX.md's pass configuration gives INDEX.md's expected result; the runnable ones are also
executed before and after on 4 XLA:CPU replicas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hlopt.hlo.ir import Instruction, Module
from hlopt.passes.framework.registry import create_pass

from hlopt import hlo, runtime

PASS = "while-loop-all-reduce-code-motion"
CASES = Path(__file__).resolve().parents[2] / "shared" / "xla_cases" / "while_loop_all_reduce_code_motion"

pytestmark = pytest.mark.skipif(not CASES.is_dir(), reason="../shared/xla_cases/while_loop_all_reduce_code_motion absent")


def _load(name: str) -> Module:
    return hlo.parse_file(CASES / name)


def _run(m: Module, **options: object) -> bool:
    changed = create_pass(PASS, **options).run(m)
    hlo.verify(m)
    return changed


def _ops(comp, opcode: str) -> list[Instruction]:
    return [i for i in comp.instructions if i.opcode == opcode]


def _loop(m: Module) -> Instruction:
    (w,) = _ops(m.entry, "while")
    return w


def _is_zero_buffer(inst: Instruction, dims: tuple[int, ...]) -> bool:
    """A zero constant of `dims` (hlopt writes large ones as broadcast(constant(0)))."""
    if tuple(inst.shape.dims) != dims:
        return False
    if inst.opcode == "broadcast":
        inst = inst.operand(0)
        return inst.opcode == "constant" and inst.attrs["literal"].scalar() == 0
    return inst.opcode == "constant" and not inst.attrs["literal"].to_numpy().any()


def _gte_of(inst: Instruction, loop: Instruction, index: int) -> bool:
    return inst.opcode == "get-tuple-element" and inst.operand(0) is loop and inst.attrs["index"] == index


def _same_trip_inputs(m: Module, devices: int, trip: int = 3, seed: int = 0) -> list[np.ndarray]:
    """Per-device random inputs, except scalar s32 parameters (trip counts): `trip` on every device."""
    rng = np.random.default_rng(seed)
    out = []
    for p in m.entry.parameters:
        if p.shape.dtype == "s32" and p.shape.rank == 0:
            out.append(np.array(trip, np.int32))
        else:
            out.append(np.stack([runtime.random_array(p.shape, rng) for _ in range(devices)]))
    return out


def _numerics(before: Module, after: Module, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    for m in (before, after):
        m.config["replica_count"] = 4
    result = runtime.run_and_compare(before, after, rtol=rtol, atol=atol, inputs=_same_trip_inputs(before, 4))
    assert result.ok, str(result)


def test_all_reduce_accumulate():
    m = _load("AllReduceAccumulate.hlo")
    assert _run(m, unique_channel_ids=False)  # the unit test keeps the loop's id; jaxlib 0.10.2 takes a new one
    w = _loop(m)
    body = w.attrs["body"]
    assert not _ops(body, "all-reduce")
    (acc,) = [i for i in _ops(body, "add") if i.shape.rank == 2]
    assert {o.attrs.get("index") for o in acc.operands} == {2, 3}  # the unreduced gte.2 into slot 3
    assert _is_zero_buffer(w.operand(0).operand(3), (1024, 1024))
    (ar,) = _ops(m.entry, "all-reduce")
    assert _gte_of(ar.operand(0), w, 3)
    assert ar.attrs["replica_groups"].groups() == [[0, 1, 2, 3]]
    assert ar.attrs["channel_id"] == 1 and ar.attrs["use_global_device_ids"] is True
    assert not ar.get("constrain_layout")
    assert ar.attrs["to_apply"] is m.computation("reduction")
    (add,) = ar.users
    assert add.opcode == "add" and add.operand(0).name == "accumulation_buffer" and add.operand(1) is ar
    assert m.entry.root.opcode == "tuple" and m.entry.root.operand(3) is add


@pytest.mark.slow
def test_all_reduce_accumulate_numerics():
    before = _load("AllReduceAccumulate.hlo")
    after = before.clone()
    assert _run(after)
    _numerics(before, after)


def test_reduce_scatter_accumulate():
    m = _load("ReduceScatterAccumulate.hlo")
    assert _run(m, enable_reduce_scatter=True)
    w = _loop(m)
    body, cond = w.attrs["body"], w.attrs["condition"]
    wide = (4096, 1024)
    assert not _ops(body, "reduce-scatter")
    assert tuple(body.parameters[0].shape.elements[3].dims) == wide
    assert tuple(cond.parameters[0].shape.elements[3].dims) == wide
    assert tuple(body.root.shape.elements[3].dims) == wide
    (acc,) = [i for i in _ops(body, "add") if i.shape.rank == 2]
    assert tuple(acc.shape.dims) == wide
    assert _is_zero_buffer(w.operand(0).operand(3), wide)
    (rs,) = _ops(m.entry, "reduce-scatter")
    assert _gte_of(rs.operand(0), w, 3) and tuple(rs.shape.dims) == (1024, 1024)
    assert rs.attrs["dimensions"] == (0,) and rs.attrs["replica_groups"].groups() == [[0, 1, 2, 3]]
    assert rs.attrs["use_global_device_ids"] is True and rs.attrs["to_apply"] is m.computation("reduction")
    (add,) = rs.users
    assert add.opcode == "add" and add.operand(0).name == "accumulation_buffer"


def test_reduce_scatter_accumulate_disabled_by_default():
    m = _load("ReduceScatterAccumulate.hlo")
    text = m.to_text()
    assert not _run(m)
    assert m.to_text() == text


@pytest.mark.slow
def test_reduce_scatter_accumulate_numerics():
    before = _load("ReduceScatterAccumulate.hlo")
    after = before.clone()
    assert _run(after, enable_reduce_scatter=True)
    _numerics(before, after)


def test_type_cast_all_reduce_accumulate():
    m = _load("TypeCastAllReduceAccumulate.hlo")
    assert _run(m)
    w = _loop(m)
    body = w.attrs["body"]
    (acc,) = [i for i in _ops(body, "add") if i.shape.rank == 2]
    conv1 = acc.operand(0)
    assert conv1.opcode == "convert" and conv1.operand(0).opcode == "convert"
    assert conv1.operand(0).operand(0).attrs["index"] == 2 and acc.operand(1).attrs["index"] == 3
    assert _is_zero_buffer(w.operand(0).operand(3), (1024, 1024))
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.shape.dtype == "bf16" and ar.operand(0).opcode == "convert"
    assert _gte_of(ar.operand(0).operand(0), w, 3) and ar.operand(0).operand(0).shape.dtype == "f32"
    (back,) = ar.users
    assert back.opcode == "convert" and back.shape.dtype == "f32"
    (add,) = back.users
    assert add.opcode == "add" and add.shape.dtype == "f32"


@pytest.mark.slow
def test_type_cast_numerics():
    before = _load("TypeCastAllReduceAccumulate.hlo")
    after = before.clone()
    assert _run(after)
    _numerics(before, after, rtol=2e-2, atol=5e-2)


def test_repeatedly_accumulated_all_reduce_is_unchanged():
    m = _load("RepeatedlyAccumulatedAllReduce.hlo")
    text = m.to_text()
    assert not _run(m)
    assert m.to_text() == text


def test_reduce_scatter_transpose_accumulate_with_setup():
    m = _load("ReduceScatterTransposeAccumulate.hlo")
    assert _run(m, enable_reduce_scatter=True, run_setup_passes=True)
    w = _loop(m)
    assert not _ops(w.attrs["body"], "reduce-scatter")
    assert _is_zero_buffer(w.operand(0).operand(3), (1024, 4096))
    (rs,) = _ops(m.entry, "reduce-scatter")
    assert _gte_of(rs.operand(0), w, 3) and rs.attrs["dimensions"] == (1,)
    assert rs.attrs["replica_groups"].groups() == [[0, 1, 2, 3]] and rs.attrs["use_global_device_ids"] is True
    assert rs.attrs["to_apply"] is m.computation("reduction")
    assert rs.users[0].opcode == "add"


def test_reduce_scatter_transpose_accumulate_needs_setup():
    m = _load("ReduceScatterTransposeAccumulate.hlo")
    assert not _run(m, enable_reduce_scatter=True)


@pytest.mark.slow
def test_reduce_scatter_transpose_numerics():
    before = _load("ReduceScatterTransposeAccumulate.hlo")
    after = before.clone()
    assert _run(after, enable_reduce_scatter=True, run_setup_passes=True)
    _numerics(before, after)


def test_single_all_reduce_dus():
    m = _load("SingleAllReduceDUS.hlo")
    before = m.clone()
    assert _run(m)
    w = _loop(m)
    body = w.attrs["body"]
    assert not _ops(body, "all-reduce")
    (dus,) = _ops(body, "dynamic-update-slice")
    assert dus.operand(1).operand(0).opcode == "reduce"  # the local value is stored
    (ar,) = _ops(m.entry, "all-reduce")
    assert _gte_of(ar.operand(0), w, 2) and ar.shape.to_text(layout=False) == "f32[16]"
    assert ar.attrs["to_apply"] is m.computation("reduction")
    assert m.entry.root.opcode == "tuple" and m.entry.root.operand(2) is ar
    _numerics(before, m)


def test_multiple_dus_and_convert():
    m = _load("MultipleDUSAndConvert.hlo")
    assert _run(m)
    w = _loop(m)
    assert not _ops(w.attrs["body"], "all-reduce")
    (ar,) = _ops(m.entry, "all-reduce")
    conv = ar.operand(0)
    assert conv.opcode == "convert" and conv.shape.to_text(layout=False) == "f16[16,1]"
    sl = conv.operand(0)
    assert sl.opcode == "slice" and sl.attrs["slice"] == ((0, 16, 1), (0, 1, 1))
    gte = sl.operand(0)
    assert _gte_of(gte, w, 3) and gte.shape.to_text(layout=False) == "f32[16,64]"
    assert ar.shape.to_text(layout=False) == "f16[16,1]" and ar.attrs["to_apply"] is m.computation("reduction")
    (back,) = ar.users
    assert back.opcode == "convert" and back.shape.to_text(layout=False) == "f32[16,1]"
    (dus,) = back.users
    assert dus.opcode == "dynamic-update-slice" and dus.operand(0) is gte and dus.operand(1) is back
    zeros = dus.operands[2:]
    assert all(z.opcode == "constant" and z.shape.dtype == "s64" and z.attrs["literal"].scalar() == 0 for z in zeros)
    assert m.entry.root.operand(3) is dus


def test_scalar_all_reduce_stays_when_used_as_scaling_factor():
    m = _load("ScalarAllReduceStaysInBodyWhenUsedAsScalingFactor.hlo")
    before = m.clone()
    assert _run(m)
    body = _loop(m).attrs["body"]
    assert [i.shape.to_text(layout=False) for i in _ops(body, "all-reduce")] == ["s32[]"]
    assert [i.shape.to_text(layout=False) for i in _ops(m.entry, "all-reduce")] == ["f32[128,128]"]
    assert any(o.opcode == "broadcast" and o.operand(0).opcode == "convert"
               and o.operand(0).operand(0).opcode == "all-reduce"
               for mul in _ops(body, "multiply") for o in mul.operands)
    _numerics(before, m)


def test_all_reduce_outside_called_computation_hoisted():
    m = _load("AllReduceOutsideCalledComputationHoisted.hlo")
    before = m.clone()
    assert _run(m)
    w = _loop(m)
    init = w.operand(0)
    assert [o.name for o in init.operands[:2]] == ["cst_0", "param_0"]
    const = init.operand(2)
    assert const.opcode == "constant" and const.attrs["literal"].to_text() == "{0, 0, 0, 0}"
    (ar,) = _ops(m.entry, "all-reduce")
    assert _gte_of(ar.operand(0), w, 2)
    assert ar.attrs["channel_id"] == 1  # XLA's default channel id
    assert ar.attrs["replica_groups"].groups() == [[0, 1, 2, 3]] and ar.attrs["to_apply"] is m.computation("reduction")
    (add,) = ar.users
    assert add.opcode == "add" and add.operand(0).name == "param_1" and add.operand(1) is ar
    root = m.entry.root
    assert root.opcode == "tuple" and _gte_of(root.operand(0), w, 0) and _gte_of(root.operand(1), w, 1)
    assert root.operand(2) is add
    assert not any(i.name == "init" for i in m.entry.instructions)  # the old init is gone, as in XLA
    body = w.attrs["body"]
    (call,) = _ops(body, "call")
    (acc,) = [i for i in _ops(body, "add") if i.shape.rank == 1]
    assert acc.operand(0) is call and acc.operand(1).attrs["index"] == 2
    _numerics(before, m)
