"""while-loop-all-reduce-code-motion, numerics: the tests that run modules on XLA (before and after, same inputs);
the structure checks without jax are in test_while_loop_all_reduce_code_motion.py."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.hlo.ir import Module
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.passes.framework.registry import create_pass, registered_passes
from test_while_loop_all_reduce_code_motion import (  # the module texts and helpers the structure tests use
    ACCUMULATE,
    FOO,
    FORWARDING,
    G4,
    MULTI_DUS,
    NESTED,
    PASS,
    REDUCERS,
    SCATTER,
    _collectives_in_loops,
    _count,
    _ds_dus_module,
    _dus_module,
    _ops,
    _rs_module,
    _run,
    _scaled_module,
    _select_module,
    _unchanged,
    loop_module,
)

from hlopt import hlo, runtime


def _moved(text: str, *, rtol: float = 1e-4, atol: float = 1e-4, **options: object) -> Module:
    """Run the pass on `text` (it must change), check the body lost its collectives' worth of work and
    that the outputs match on XLA:CPU; return the rewritten module."""
    before = hlo.parse(text)
    after = before.clone()
    assert _run(after, **options)
    result = runtime.run_and_compare(before, after, rtol=rtol, atol=atol)
    assert result.ok, str(result)
    return after


def _forced_xla_move(text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """Outputs before and after the rewrite XLA would make (the replication requirement switched off)."""
    from hlopt.passes.collectives import while_loop_all_reduce_code_motion as wl

    before = hlo.parse(text)
    after = before.clone()
    with monkeypatch.context() as mp:
        mp.setattr(wl._Matcher, "_replicated", lambda self, inst, ar: True)
        assert _run(after)
    inputs = runtime.random_inputs(before, 0, per_device=4)
    return runtime.execute(before, inputs), runtime.execute(after, inputs)


def _setup(text: str, name: str, **options: object) -> tuple[Module, bool]:
    before = hlo.parse(text)
    after = before.clone()
    changed = create_pass(name, **options).run(after)
    hlo.verify(after)
    if changed:
        result = runtime.run_and_compare(before, after, rtol=2e-2, atol=5e-2)
        assert result.ok, str(result)
    return after, changed


def test_accumulation_moves_and_keeps_attributes():
    m = _moved(ACCUMULATE)
    body = m.computation("body")
    assert _count(body) == 0
    (w,) = _ops(m.entry, "while")
    assert w.frontend_attributes == {"foo": "bar"}
    init3 = w.operand(0).operand(2)
    assert init3.opcode == "constant" and not init3.attrs["literal"].to_numpy().any()
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.attrs["channel_id"] == 6 and ar.attrs["use_global_device_ids"] is True  # a new id, as XLA:GPU
    assert ar.attrs["replica_groups"].groups() == [[0, 1, 2, 3]] and ar.attrs["to_apply"].name == "sum"
    assert ar.metadata["op_name"] == "grad/psum" and ar.frontend_attributes == {"collective_group_key": "g0"}
    (add,) = ar.users
    assert add.operand(0).name == "x1" and m.entry.root.operand(2) is add


def test_dead_channel_all_reduce_in_the_body_goes_though_dce_keeps_it():
    # outside SPMD a channel all-reduce has a side effect, so DCE keeps it dead; XLA's pass finds a dead
    # collective movable with no accumulations and removes it (ReplaceInstruction removes it anyway)
    text = loop_module(["f32[8]"], f"  %dead = f32[8] all-reduce(%v1), channel_id=3, {G4}, to_apply=%sum",
                       ["%v1"], ["%x0"], ["f32[8]"])
    kept = hlo.parse(text)
    run_pipeline(kept, "dce")
    assert _count(kept.computation("body")) == 1
    m = _moved(text)
    assert _count(m.computation("body")) == 0 and _count(m.entry) == 0


def test_default_channel_id_only_with_one_partition():
    text = ACCUMULATE.replace("channel_id=5, ", "").replace("use_global_device_ids=true, ", "")
    m = _moved(text)
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.attrs["channel_id"] == 1  # XLA's default channel id
    # with partitions a channel id would make it cross-replica-and-partition (sum over partitions too)
    m2 = hlo.parse(text.replace("replica_count=4", "replica_count=4, num_partitions=2"))
    assert _run(m2)
    (ar2,) = _ops(m2.entry, "all-reduce")
    assert ar2.get("channel_id") is None


def test_forwarding_through_convert_transpose_slice_broadcast():
    m = _moved(FORWARDING, rtol=2e-2, atol=5e-2)  # one all-reduce is in bf16
    assert _count(m.computation("body")) == 0
    moved = sorted(i.shape.to_text(layout=False) for i in _ops(m.entry, "all-reduce"))
    # ar2 accumulates into two slots: one moved all-reduce per slot, as XLA
    assert moved == ["bf16[8,4]", "f32[2,4,8]", "f32[2,8]", "f32[4,8]", "f32[4,8]"]
    by_id: dict[int, set[str]] = {}
    for i in _ops(m.entry, "all-reduce"):
        by_id.setdefault(i.attrs["channel_id"], set()).add(i.shape.to_text(layout=False))
    assert len(by_id) == 5  # each moved collective its own id, as XLA:GPU (jaxlib 0.10.2)
    kept = _moved(FORWARDING, rtol=2e-2, atol=5e-2, unique_channel_ids=False)
    by_id = {}
    for i in _ops(kept.entry, "all-reduce"):
        by_id.setdefault(i.attrs["channel_id"], set()).add(i.shape.to_text(layout=False))
    assert 3 in by_id and all(len(shapes) == 1 for shapes in by_id.values())  # one layout per channel id


def test_forwarding_through_reshape_and_bitcast():
    text = loop_module(["f32[4,8]", "f32[4,8]"], f"""  %ar = f32[4,8] all-reduce(%v1), {G4}, to_apply=%sum
  %r = f32[32] reshape(%ar)
  %bc = f32[4,8] bitcast(%r)
  %new = f32[4,8] add(%bc, %v2)""", ["%v1", "%new"], ["%x0", "%x1"], ["f32[4,8]", "f32[4,8]"])
    m = _moved(text)
    assert _count(m.computation("body")) == 0 and _count(m.entry) == 1


def test_several_accumulators_mixed_with_non_movable():
    text = loop_module(
        ["f32[8]", "f32[8]", "f32[8]", "f32[8]", "f32[8]"],
        f"""  %ar1 = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %new1 = f32[8] add(%ar1, %v2)
  %ar2 = f32[8] all-reduce(%v1), replica_groups={{{{0,1}},{{2,3}}}}, channel_id=7, to_apply=%sum
  %new2 = f32[8] add(%v3, %ar2)
  %ar3 = f32[8] all-reduce(%v1), {G4}, to_apply=%max
  %new3 = f32[8] add(%ar3, %v4)
  %ar4 = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %a4 = f32[8] add(%ar4, %v5)
  %new4 = f32[8] add(%a4, %ar4)""",
        ["%v1", "%new1", "%new2", "%new3", "%new4"], ["%x0", "%x1", "%x1", "%x1", "%x1"], ["f32[8]", "f32[8]"])
    m = _moved(text)
    remaining = sorted((i.attrs["to_apply"].name, i.name) for i in _ops(m.computation("body"), "all-reduce"))
    assert remaining == [("max", "ar3"), ("sum", "ar4")]  # MAX accumulation, repeated accumulation stay
    moved = [i for i in _ops(m.entry, "all-reduce")]
    assert sorted(i.get("channel_id") for i in moved) == [8, 9]  # ids no instruction used, as XLA:GPU
    assert any(i.attrs["replica_groups"].groups() == [[0, 1], [2, 3]] for i in moved)


def test_nested_loops_hoist_through_both():
    m = _moved(NESTED)
    assert _count(m.computation("ibody")) == 0 and _count(m.computation("obody")) == 0
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.operand(0).opcode == "get-tuple-element" and ar.operand(0).operand(0).opcode == "while"


def test_shared_body_rewrites_every_while():
    st = "(s32[], f32[8], f32[8])"
    text = ACCUMULATE.replace(f"  ROOT %w = {st} while(%init), condition=%cond, body=%body, "
                              f'frontend_attributes={{foo="bar"}}',
                              f"  %w = {st} while(%init), condition=%cond, body=%body\n"
                              f"  %a1 = f32[8] get-tuple-element(%w), index=2\n"
                              f"  %init2 = {st} tuple(%zero, %x1, %a1)\n"
                              f"  ROOT %w2 = {st} while(%init2), condition=%cond, body=%body")
    m = _moved(text)
    assert _count(m.entry, "while") == 2 and _count(m.entry) == 2 and _count(m.computation("body")) == 0
    assert not _run(hlo.parse(text), require_flat_control_flow=True)


def test_while_in_a_computation_called_twice():
    text = ACCUMULATE.replace("ENTRY %main {", "%bar {").replace(
        "  ROOT %w = (s32[], f32[8], f32[8]) while(%init), condition=%cond, body=%body, "
        'frontend_attributes={foo="bar"}',
        "  %w = (s32[], f32[8], f32[8]) while(%init), condition=%cond, body=%body\n"
        "  ROOT %r = f32[8] get-tuple-element(%w), index=2") + """
ENTRY %main {
  %p0 = f32[8] parameter(0)
  %p1 = f32[8] parameter(1)
  %c0 = f32[8] call(%p0, %p1), to_apply=%bar
  %c1 = f32[8] call(%p1, %p0), to_apply=%bar
  ROOT %s = f32[8] add(%c0, %c1)
}
"""
    m = _moved(text)
    assert _count(m.computation("bar")) == 1 and _count(m.entry) == 0


def test_calls_in_the_body():
    base = dict(state=["f32[8]", "f32[8]"], init=["%x0", "%x1"], params=["f32[8]", "f32[8]"], extra=FOO)
    producer = loop_module(body=f"""  %c = f32[8] call(%v1), to_apply=%foo
  %ar = f32[8] all-reduce(%c), {G4}, to_apply=%sum
  %acc = f32[8] add(%ar, %v2)""", ret=["%v1", "%acc"], **base)
    m = _moved(producer)
    assert _count(m.computation("body"), "call") == 1 and _count(m.entry) == 1
    _unchanged(loop_module(body="""  %c = f32[8] call(%v1), to_apply=%arfoo
  %acc = f32[8] add(%c, %v2)""", ret=["%v1", "%acc"], **base))
    _unchanged(loop_module(body=f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %b = f32[8] call(%v2), to_apply=%foo
  %acc = f32[8] add(%ar, %b)""", ret=["%v1", "%acc"], **base))
    _unchanged(loop_module(body=f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %acc = f32[8] add(%ar, %v2)
  %u = f32[8] call(%v2), to_apply=%foo""", ret=["%u", "%acc"], **base))


def test_select_with_zero_moves_when_the_predicate_is_replicated():
    text = _select_module("  %one = s32[] constant(1)\n  %pr = pred[] compare(%v0, %one), direction=EQ")
    m = _moved(text)
    assert _count(m.computation("body"), "select") == 1 and _count(m.computation("body")) == 0


def test_scalar_scaling_factor_stays_and_the_gradient_moves():
    m = _moved(_scaled_module(G4))
    body = m.computation("body")
    assert [i.shape.to_text(layout=False) for i in _ops(body, "all-reduce")] == ["s32[]"]
    assert [i.shape.to_text(layout=False) for i in _ops(m.entry, "all-reduce")] == ["f32[8]"]


def test_scatter_accumulation_is_refused_by_default_and_xla_move_changes_results():
    _unchanged(SCATTER)
    before = hlo.parse(SCATTER)
    after = before.clone()
    assert _run(after, unsafe_scatter_motion=True)  # XLA's rewrite
    assert _count(after.computation("body")) == 0 and _count(after.entry) == 1
    inputs = [np.zeros((4, 8), np.float32), np.array([1, 3], np.int32), np.ones((4, 2), np.float32)]
    expected, actual = runtime.execute(before, inputs), runtime.execute(after, inputs)
    assert not np.allclose(expected[1], actual[1])  # N * buffer + updates != buffer + updates


@pytest.mark.parametrize("reducer", ["max", "sum", "mul"])
def test_dus_form_moves_any_reduction(reducer):
    m = _moved(_dus_module(reducer))
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.shape.to_text(layout=False) == "f32[8]" and ar.attrs["to_apply"].name == reducer
    assert ar.attrs["channel_id"] == 1 and ar.operand(0).opcode == "get-tuple-element"


def test_dus_form_partial_region_and_reverse_index():
    m = _moved(_dus_module(buf="f32[12]", index="subtract(s32[] constant(7), %v0)"))
    (ar,) = _ops(m.entry, "all-reduce")
    sl = ar.operand(0)
    assert sl.opcode == "slice" and sl.attrs["slice"] == ((0, 8, 1),)
    (dus,) = ar.users
    assert dus.opcode == "dynamic-update-slice" and dus.operand(2).shape.dtype == "s64"


def test_dus_chain_with_converts():
    m = _moved(MULTI_DUS)
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.shape.to_text(layout=False) == "bf16[8,1]"
    conv = ar.operand(0)
    assert conv.opcode == "convert" and conv.operand(0).attrs["slice"] == ((0, 8, 1), (2, 3, 1))
    (back,) = ar.users
    (dus,) = back.users
    assert [o.attrs["literal"].scalar() for o in dus.operands[2:]] == [0, 2]


def test_dus_and_accumulation_in_one_body():
    text = _dus_module("sum", ret_extra="%acc").replace(
        "  %dus = f32[8] dynamic-update-slice(%v2, %upd, %v0)",
        f"  %dus = f32[8] dynamic-update-slice(%v2, %upd, %v0)\n"
        f"  %ar2 = f32[1] all-reduce(%upd), {G4}, channel_id=9, to_apply=%sum\n"
        f"  %acc = f32[1] add(%v3, %ar2)")
    text = text.replace("%upd = f32[1] reshape(%gl)", "%upd = f32[1] reshape(%loc)\n  %updg = f32[1] reshape(%gl)") \
        .replace("dynamic-update-slice(%v2, %upd, %v0)", "dynamic-update-slice(%v2, %updg, %v0)")
    m = _moved(text)
    assert _count(m.computation("body")) == 0 and _count(m.entry) == 2


def test_dynamic_slice_accumulation_with_offsets_replicated_in_groups():
    m = _moved(_ds_dus_module("{{0,1,2,3},{4,5,6,7}}"))
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.shape.to_text(layout=False) == "f32[2,4]"


def test_reduce_scatter_accumulation():
    text = _rs_module("  %acc = f32[2,8] add(%rs, %v2)")
    _unchanged(text)
    m = _moved(text, enable_reduce_scatter=True)
    (rs,) = _ops(m.entry, "reduce-scatter")
    assert rs.shape.to_text(layout=False) == "f32[2,8]" and rs.operand(0).shape.to_text(layout=False) == "f32[8,8]"


def test_reduce_scatter_with_scalar_predicate_select():
    sel = """  %one = s32[] constant(1)
  %pr = pred[] compare(%v0, %one), direction=NE
  %PB
  %z = f32[] constant(0)
  %zb = f32[2,8] broadcast(%z), dimensions={}
  %sel = f32[2,8] select(%pb, %rs, %zb)
  %acc = f32[2,8] add(%sel, %v2)"""
    m = _moved(_rs_module(sel.replace("%PB", "%pb = pred[2,8] broadcast(%pr), dimensions={}")),
               enable_reduce_scatter=True)
    assert _count(m.computation("body"), "reduce-scatter") == 0
    nonscalar = sel.replace("%PB", "%pp = pred[8] broadcast(%pr), dimensions={}\n"
                                   "  %pb = pred[2,8] broadcast(%pp), dimensions={1}")
    _unchanged(_rs_module(nonscalar), enable_reduce_scatter=True)


def test_setup_reorders_convert_and_transpose():
    conv = _rs_module("  %c = f32[2,8] convert(%rs)\n  %acc = f32[2,8] add(%c, %v2)", rs_dtype="bf16", to_apply="%sumh")
    _unchanged(conv, enable_reduce_scatter=True)
    m = _moved(conv, enable_reduce_scatter=True, run_setup_passes=True, rtol=2e-2, atol=5e-2)
    (rs,) = _ops(m.entry, "reduce-scatter")
    assert rs.shape.dtype == "f32" and rs.attrs["to_apply"].root.shape.dtype == "f32"
    tr = _rs_module("  %tr = f32[8,2] transpose(%rs), dimensions={1,0}\n  %acc = f32[8,2] add(%tr, %v2)",
                    acc_shape="f32[8,2]")
    _unchanged(tr, enable_reduce_scatter=True)
    m = _moved(tr, enable_reduce_scatter=True, run_setup_passes=True)
    (rs,) = _ops(m.entry, "reduce-scatter")
    assert rs.attrs["dimensions"] == (1,) and rs.operand(0).shape.to_text(layout=False) == "f32[8,8]"
    both = _rs_module("  %c = f32[2,8] convert(%rs)\n  %tr = f32[8,2] transpose(%c), dimensions={1,0}\n"
                      "  %acc = f32[8,2] add(%tr, %v2)", acc_shape="f32[8,2]", rs_dtype="bf16", to_apply="%sumh")
    _moved(both, enable_reduce_scatter=True, run_setup_passes=True, rtol=2e-2, atol=5e-2)


def test_setup_reorders_convert_of_all_reduce():
    text = loop_module(["f32[8]", "f32[8]"], f"""  %h = bf16[8] convert(%v1)
  %ar = bf16[8] all-reduce(%h), {G4}, to_apply=%sumh
  %c = f32[8] convert(%ar)
  %acc = f32[8] add(%c, %v2)""", ["%v1", "%acc"], ["%x0", "%x1"], ["f32[8]", "f32[8]"],
                       entry_root='%g = f32[8] get-tuple-element(%w), index=2\n  ROOT %m = f32[8] multiply(%g, %x0)')
    m = _moved(text, run_setup_passes=True, rtol=2e-2, atol=5e-2)
    (ar,) = _ops(m.entry, "all-reduce")
    assert ar.shape.dtype == "f32" and m.entry.root.opcode == "multiply" and m.entry.root.operand(0).opcode == "add"


@pytest.mark.parametrize("kind,options", [
    ("grad_accumulation", ""),
    ("losses", ""),
    ("reduce_scatter", "{enable_reduce_scatter=true}"),
])
def test_shard_map_training_loops(kind, options):
    if "call-inliner" not in registered_passes():
        pytest.skip("call-inliner is not available yet")
    from hlopt.corpus.loop_programs import scan_program

    fn, args = scan_program(kind, d=8, microbatches=4, batch=16)
    before = runtime.capture(fn, *args)
    after = before.clone()
    run_pipeline(after, "call-inliner," + PASS + options)
    assert _collectives_in_loops(before) == 1 and _collectives_in_loops(after) == 0
    result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)


def test_device_dependent_select_would_change_results(monkeypatch):
    text = _select_module("  %rid = u32[] replica-id()\n  %r0 = u32[] constant(0)\n"
                          "  %pr = pred[] compare(%rid, %r0), direction=EQ")
    expected, actual = _forced_xla_move(text, monkeypatch)
    assert not np.allclose(expected[2], actual[2])


def test_scaling_factor_from_other_groups_would_change_results(monkeypatch):
    expected, actual = _forced_xla_move(_scaled_module("replica_groups={{0,1},{2,3}}"), monkeypatch)
    assert not np.allclose(expected[2], actual[2])


def test_induction_variable_in_an_inner_dus_is_refused(monkeypatch):
    from hlopt.passes.collectives import while_loop_all_reduce_code_motion as wl

    text = MULTI_DUS.replace("%d1 = f32[1,6] dynamic-update-slice(%row, %upd, %c0, %c2)",
                             "%d1 = f32[1,6] dynamic-update-slice(%row, %upd, %c0, %v0)") \
        .replace("%n = s32[] constant(8)", "%n = s32[] constant(4)")
    _unchanged(text)  # hlopt: every iteration rewrites the whole row, so the region holds unreduced values
    before = hlo.parse(text)
    after = before.clone()
    with monkeypatch.context() as mp:
        mp.setattr(wl._Matcher, "_update_slice_sound", lambda self, *a: True)
        assert _run(after)  # XLA's rewrite
    inputs = runtime.random_inputs(before, 0, per_device=4)
    assert not np.allclose(runtime.execute(before, inputs)[3], runtime.execute(after, inputs)[3])


def test_reorder_reduce_transpose():
    tr = _rs_module("  %tr = f32[8,2] transpose(%rs), dimensions={1,0}\n  %acc = f32[8,2] add(%tr, %v2)",
                    acc_shape="f32[8,2]")
    m, changed = _setup(tr, "reorder-reduce-transpose")
    assert changed
    (add,) = [i for i in _ops(m.computation("body"), "add") if i.shape.rank == 2]
    rs = add.operand(0)
    assert rs.opcode == "reduce-scatter" and rs.operand(0).opcode == "transpose" and rs.attrs["dimensions"] == (1,)
    conv = _rs_module("  %c = f32[2,8] convert(%rs)\n  %tr = f32[8,2] transpose(%c), dimensions={1,0}\n"
                      "  %acc = f32[8,2] add(%tr, %v2)", acc_shape="f32[8,2]", rs_dtype="bf16", to_apply="%sumh")
    m, changed = _setup(conv, "reorder-reduce-transpose")
    (add,) = [i for i in _ops(m.computation("body"), "add") if i.shape.rank == 2]
    assert changed and add.operand(0).operand(0).operand(0).opcode == "convert"
    dus = _rs_module("  %tr = f32[8,2] transpose(%rs), dimensions={1,0}\n  %r = f32[1,8,2] reshape(%tr)\n"
                     "  %c0 = s32[] constant(0)\n  %z = f32[] constant(0)\n"
                     "  %acc = f32[2,8] add(%rs, %v2)\n"
                     "  %buf = f32[4,8,2] broadcast(%z), dimensions={}\n"
                     "  %d = f32[4,8,2] dynamic-update-slice(%buf, %r, %c0, %c0, %c0)")
    m, changed = _setup(dus, "reorder-reduce-transpose")
    assert changed and m.computation("body").instruction("d").operand(1).operand(0).opcode == "reduce-scatter"


def test_setup_only_rewrites_while_bodies():
    text = f"""HloModule entry_only, replica_count=4
{REDUCERS}
ENTRY %main {{
  %x = f32[8,8] parameter(0)
  %a = f32[8,2] parameter(1)
  %rs = f32[2,8] reduce-scatter(%x), channel_id=1, {G4}, use_global_device_ids=true, dimensions={{0}}, to_apply=%sum
  %tr = f32[8,2] transpose(%rs), dimensions={{1,0}}
  ROOT %acc = f32[8,2] add(%tr, %a)
}}
"""
    assert not _setup(text, "reorder-reduce-transpose")[1]
    assert not _setup(text.replace("%tr = f32[8,2] transpose(%rs), dimensions={1,0}", "%tr = f32[8,2] convert(%a)"),
                      "reorder-convert-reduce-add", enable_reduce_scatter=True)[1]


def test_reorder_convert_reduce_add():
    rs = _rs_module("  %c = f32[2,8] convert(%rs)\n  %acc = f32[2,8] add(%c, %v2)", rs_dtype="bf16", to_apply="%sumh")
    assert not _setup(rs, "reorder-convert-reduce-add")[1]  # reduce-scatter needs enable_reduce_scatter
    m, changed = _setup(rs, "reorder-convert-reduce-add", enable_reduce_scatter=True)
    (add,) = [i for i in _ops(m.computation("body"), "add") if i.shape.rank == 2]
    assert changed and add.operand(0).opcode == "reduce-scatter" and add.operand(0).shape.dtype == "f32"
    assert add.operand(0).operand(0).opcode == "convert"
    ar = loop_module(["f32[8]", "f32[8]"], f"""  %h = bf16[8] convert(%v1)
  %ar = bf16[8] all-reduce(%h), {G4}, to_apply=%sumh
  %c = f32[8] convert(%ar)
  %acc = f32[8] add(%c, %v2)""", ["%v1", "%acc"], ["%x0", "%x1"], ["f32[8]", "f32[8]"])
    m, changed = _setup(ar, "reorder-convert-reduce-add")
    assert changed and _ops(m.computation("body"), "all-reduce")[0].shape.dtype == "f32"


@pytest.mark.slow
def test_demo_training_step_moves_gradient_all_reduces():
    from hlopt.cli.demo_program import make_train_step

    step, args = make_train_step(microbatches=2, batch=8, seq=4, d_model=16, d_ff=32)
    before = runtime.capture(step, *args)
    after = before.clone()
    run_pipeline(after, "call-inliner,simplify," + PASS + ",simplify")
    assert _collectives_in_loops(after) < _collectives_in_loops(before)
    result = runtime.run_and_compare(before, after, rtol=2e-4, atol=1e-5)
    assert result.ok, str(result)
