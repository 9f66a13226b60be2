"""while-loop-all-reduce-code-motion on our own modules, structure (no jax): the refusals (XLA's and
hlopt's extra ones) and the rewrites checked by structure alone. The rewrites run before and after on XLA:CPU
(4 replicas, or 8 partitions) with the same inputs, and the real programs (jax shard_map training loops on 8
CPU devices), are in test_while_loop_all_reduce_code_motion_numerics.py."""

from __future__ import annotations

import pytest
from hlopt.hlo.ir import Instruction, Module
from hlopt.passes.framework.registry import create_pass, registered_passes

from hlopt import hlo

PASS = "while-loop-all-reduce-code-motion"

REDUCERS = """
%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

%sumh (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %r = bf16[] add(%a, %b)
}

%isum (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %r = s32[] add(%a, %b)
}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] maximum(%a, %b)
}

%mul (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] multiply(%a, %b)
}
"""

G4 = "replica_groups={{0,1,2,3}}"


def loop_module(state: list[str], body: str, ret: list[str], init: list[str], params: list[str], *,
                trip: int = 3, start: int = 0, step: int = 1, header: str = "replica_count=4",
                cond_extra: str = "", extra: str = "", entry_extra: str = "", while_attrs: str = "",
                entry_root: str | None = None) -> str:
    """A module with one while over (s32[] counter, *state): `%v{i}` reads slot i in the body,
    `%x{i}` is entry parameter i, `ret` gives the body's new values of slots 1.."""
    shapes = ["s32[]", *state]
    st = "(" + ", ".join(shapes) + ")"
    gtes = "\n".join(f"  %v{i} = {t} get-tuple-element(%p), index={i}" for i, t in enumerate(shapes))
    ps = "\n".join(f"  %x{i} = {t} parameter({i})" for i, t in enumerate(params))
    root = entry_root or f"ROOT %w = {st} while(%init), condition=%cond, body=%body{while_attrs}"
    if entry_root:
        root = f"%w = {st} while(%init), condition=%cond, body=%body{while_attrs}\n  {entry_root}"
    return f"""HloModule m, {header}
{REDUCERS}
{extra}
%cond (cp: {st}) -> pred[] {{
  %cp = {st} parameter(0)
  %c0 = s32[] get-tuple-element(%cp), index=0{cond_extra}
  %n = s32[] constant({trip})
  ROOT %lt = pred[] compare(%c0, %n), direction=LT
}}

%body (p: {st}) -> {st} {{
  %p = {st} parameter(0)
{gtes}
  %inc = s32[] constant({step})
  %next = s32[] add(%v0, %inc)
{body}
  ROOT %t = {st} tuple(%next, {", ".join(ret)})
}}

ENTRY %main {{
{ps}
  %zero = s32[] constant({start})
{entry_extra}
  %init = {st} tuple(%zero, {", ".join(init)})
  {root}
}}
"""


def _run(m: Module, **options: object) -> bool:
    changed = create_pass(PASS, **options).run(m)
    hlo.verify(m)
    return changed


def _count(comp, opcode: str = "all-reduce") -> int:
    return sum(1 for i in comp.instructions if i.opcode == opcode)


def _ops(comp, opcode: str) -> list[Instruction]:
    return [i for i in comp.instructions if i.opcode == opcode]


def _unchanged(text: str, **options: object) -> None:
    m = hlo.parse(text)
    printed = m.to_text()
    assert not _run(m, **options)
    assert m.to_text() == printed


# --------------------------------------------------------------------------- accumulation
ACCUMULATE = loop_module(
    ["f32[8]", "f32[8]"],
    f"""  %fi = f32[] convert(%v0)
  %bi = f32[8] broadcast(%fi), dimensions={{}}
  %g = f32[8] multiply(%v1, %bi)
  %ar = f32[8] all-reduce(%g), channel_id=5, {G4}, use_global_device_ids=true, to_apply=%sum, metadata={{op_name="grad/psum"}}, frontend_attributes={{collective_group_key="g0"}}
  %acc = f32[8] add(%ar, %v2)""",
    ["%v1", "%acc"], ["%x0", "%x1"], ["f32[8]", "f32[8]"], while_attrs=', frontend_attributes={foo="bar"}')


def test_registered_with_xla_options():
    cls = registered_passes()[PASS]
    p = cls()
    assert (p.enable_reduce_scatter, p.run_setup_passes, p.require_flat_control_flow) == (False, False, False)
    assert "reorder-convert-reduce-add" in registered_passes() and "reorder-reduce-transpose" in registered_passes()


FORWARDING = loop_module(
    ["f32[4,8]", "f32[8,4]", "f32[2,8]", "f32[4,8]", "f32[2,4,8]", "f32[4,8]"],
    f"""  %fi = f32[] convert(%v0)
  %bi = f32[4,8] broadcast(%fi), dimensions={{}}
  %g = f32[4,8] multiply(%v1, %bi)
  %h = bf16[4,8] convert(%g)
  %ar = bf16[4,8] all-reduce(%h), {G4}, to_apply=%sumh
  %cv = f32[4,8] convert(%ar)
  %tr = f32[8,4] transpose(%cv), dimensions={{1,0}}
  %new2 = f32[8,4] add(%tr, %v2)
  %ar2 = f32[4,8] all-reduce(%g), {G4}, channel_id=3, to_apply=%sum
  %sl = f32[2,8] slice(%ar2), slice={{[1:3], [0:8]}}
  %new3 = f32[2,8] add(%v3, %sl)
  %new4 = f32[4,8] add(%ar2, %v4)
  %red = f32[] reduce(%g, f32[] constant(0)), dimensions={{0,1}}, to_apply=%sum
  %ar3 = f32[] all-reduce(%red), {G4}, to_apply=%sum
  %b3 = f32[2,4,8] broadcast(%ar3), dimensions={{}}
  %new5 = f32[2,4,8] add(%b3, %v5)
  %ar4 = f32[4,8] all-reduce(%g), {G4}, to_apply=%sum
  %t4 = f32[8,4] transpose(%ar4), dimensions={{1,0}}
  %tb = f32[8,4] transpose(%v6), dimensions={{1,0}}
  %sum4 = f32[8,4] add(%t4, %tb)
  %new6 = f32[4,8] transpose(%sum4), dimensions={{1,0}}""",
    ["%v1", "%new2", "%new3", "%new4", "%new5", "%new6"],
    ["%x0", "%x1", "%x2", "%x3", "%x4", "%x5"],
    ["f32[4,8]", "f32[8,4]", "f32[2,8]", "f32[4,8]", "f32[2,4,8]", "f32[4,8]"])


# --------------------------------------------------------------------------- refusals
def test_refusals_other_uses_of_the_accumulator():
    base = dict(state=["f32[8]", "f32[8]"], init=["%x0", "%x1"], params=["f32[8]", "f32[8]"])
    used = loop_module(body=f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %acc = f32[8] add(%ar, %v2)
  %neg = f32[8] negate(%v2)
  %g = f32[8] add(%v1, %neg)""", ret=["%g", "%acc"], **base)
    _unchanged(used)
    ar_used = loop_module(body=f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %acc = f32[8] add(%ar, %v2)
  %g = f32[8] multiply(%ar, %v1)""", ret=["%g", "%acc"], **base)
    _unchanged(ar_used)
    twice = loop_module(body=f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %acc = f32[8] add(%ar, %v2)""", ret=["%acc", "%acc"], **base)
    _unchanged(twice)  # hlopt: the accumulated value is returned at two slots
    cond = loop_module(body=f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %acc = f32[8] add(%ar, %v2)""", ret=["%v1", "%acc"],
                       cond_extra="\n  %peek = f32[8] get-tuple-element(%cp), index=2", **base)
    _unchanged(cond)  # hlopt: the condition reads the accumulator (XLA: TODO)


def test_constrain_layout_stops_the_pass():
    nested = ACCUMULATE.replace("channel_id=5, ", "channel_id=5, constrain_layout=true, ")
    _unchanged(nested)


def test_mpmd_module_is_refused():
    m = hlo.parse(ACCUMULATE.replace("replica_count=4", "num_partitions=2"))
    m.config["use_spmd_partitioning"] = False
    assert not create_pass(PASS).run(m)
    m.config["use_spmd_partitioning"] = True
    assert create_pass(PASS).run(m)


def test_float_to_int_convert_is_refused():
    text = loop_module(["f32[8]", "s32[8]"], f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %c = s32[8] convert(%ar)
  %acc = s32[8] add(%c, %v2)""", ["%v1", "%acc"], ["%x0", "%x1"], ["f32[8]", "s32[8]"])
    _unchanged(text)


def test_buffer_permuted_by_the_loop_is_refused():
    text = loop_module(["f32[16]", "f32[4,4]"], f"""  %r = f32[4,4] reshape(%v1)
  %ar = f32[4,4] all-reduce(%r), {G4}, to_apply=%sum
  %tb = f32[4,4] transpose(%v2), dimensions={{1,0}}
  %acc = f32[4,4] add(%ar, %tb)""", ["%v1", "%acc"], ["%x0", "%x1"], ["f32[16]", "f32[4,4]"])
    _unchanged(text)


# --------------------------------------------------------------------------- loops
NESTED = f"""HloModule nested, replica_count=4
{REDUCERS}
%icond (p: (s32[], f32[8], f32[8])) -> pred[] {{
  %p = (s32[], f32[8], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(2)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

%ibody (p: (s32[], f32[8], f32[8])) -> (s32[], f32[8], f32[8]) {{
  %p = (s32[], f32[8], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8] get-tuple-element(%p), index=1
  %acc = f32[8] get-tuple-element(%p), index=2
  %xs = f32[8] sine(%x)
  %ar = f32[8] all-reduce(%xs), {G4}, to_apply=%sum
  %new = f32[8] add(%ar, %acc)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8], f32[8]) tuple(%next, %xs, %new)
}}

%ocond (p: (s32[], f32[8], f32[8])) -> pred[] {{
  %p = (s32[], f32[8], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

%obody (p: (s32[], f32[8], f32[8])) -> (s32[], f32[8], f32[8]) {{
  %p = (s32[], f32[8], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8] get-tuple-element(%p), index=1
  %acc = f32[8] get-tuple-element(%p), index=2
  %z = s32[] constant(0)
  %iinit = (s32[], f32[8], f32[8]) tuple(%z, %x, %acc)
  %inner = (s32[], f32[8], f32[8]) while(%iinit), condition=%icond, body=%ibody
  %x2 = f32[8] get-tuple-element(%inner), index=1
  %acc2 = f32[8] get-tuple-element(%inner), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8], f32[8]) tuple(%next, %x2, %acc2)
}}

ENTRY %main {{
  %x = f32[8] parameter(0)
  %a = f32[8] parameter(1)
  %z = s32[] constant(0)
  %init = (s32[], f32[8], f32[8]) tuple(%z, %x, %a)
  ROOT %w = (s32[], f32[8], f32[8]) while(%init), condition=%ocond, body=%obody
}}
"""


# --------------------------------------------------------------------------- calls in the body
FOO = """
%foo (q: f32[8]) -> f32[8] {
  %q = f32[8] parameter(0)
  ROOT %n = f32[8] negate(%q)
}

%arfoo (q: f32[8]) -> f32[8] {
  %q = f32[8] parameter(0)
  ROOT %r = f32[8] all-reduce(%q), replica_groups={{0,1,2,3}}, to_apply=%sum
}
"""


# --------------------------------------------------------------------------- select, multiply
def _select_module(pred: str) -> str:
    return loop_module(["f32[8]", "f32[8]"], f"""  %ar = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
{pred}
  %pb = pred[8] broadcast(%pr), dimensions={{}}
  %z = f32[] constant(0)
  %zb = f32[8] broadcast(%z), dimensions={{}}
  %sel = f32[8] select(%pb, %zb, %ar)
  %acc = f32[8] add(%sel, %v2)""", ["%v1", "%acc"], ["%x0", "%x1"], ["f32[8]", "f32[8]"])


def test_select_with_a_device_dependent_predicate_stays():
    text = _select_module("  %rid = u32[] replica-id()\n  %r0 = u32[] constant(0)\n"
                          "  %pr = pred[] compare(%rid, %r0), direction=EQ")
    _unchanged(text)  # hlopt: XLA would move it and change the sum
    nonzero = _select_module("  %one = s32[] constant(1)\n  %pr = pred[] compare(%v0, %one), direction=EQ") \
        .replace("%z = f32[] constant(0)", "%z = f32[] constant(1)")
    _unchanged(nonzero)


def _scaled_module(scalar_groups: str) -> str:
    return loop_module(["f32[8]", "f32[8]", "s32[]"], f"""  %g = f32[8] multiply(%v1, %v1)
  %ar = f32[8] all-reduce(%g), {G4}, to_apply=%sum
  %rid = u32[] replica-id()
  %cnt = s32[] convert(%rid)
  %ars = s32[] all-reduce(%cnt), {scalar_groups}, to_apply=%isum
  %f = f32[] convert(%ars)
  %fb = f32[8] broadcast(%f), dimensions={{}}
  %scaled = f32[8] multiply(%ar, %fb)
  %acc = f32[8] add(%scaled, %v2)
  %cacc = s32[] add(%ars, %v3)""", ["%v1", "%acc", "%cacc"], ["%x0", "%x1", "%x2"], ["f32[8]", "f32[8]", "s32[]"])


def test_scaling_factor_from_other_groups_stays():
    _unchanged(_scaled_module("replica_groups={{0,1},{2,3}}"))  # hlopt: the factor differs within the group


def test_non_scalar_all_reduces_multiplied_stay():
    text = loop_module(["f32[8]", "f32[8,8]"], f"""  %a1 = f32[8] all-reduce(%v1), {G4}, to_apply=%sum
  %a2 = f32[8] all-reduce(%v1), {G4}, channel_id=2, to_apply=%sum
  %b1 = f32[8,8] broadcast(%a1), dimensions={{0}}
  %b2 = f32[8,8] broadcast(%a2), dimensions={{1}}
  %pr = f32[8,8] multiply(%b1, %b2)
  %acc = f32[8,8] add(%pr, %v2)""", ["%v1", "%acc"], ["%x0", "%x1"], ["f32[8]", "f32[8,8]"])
    _unchanged(text)


# --------------------------------------------------------------------------- scatter
SCATTER = loop_module(["f32[8]", "s32[2]", "f32[2]"], f"""  %sc = f32[8] scatter(%v1, %v2, %v3), update_window_dims={{}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%sum
  %ar = f32[8] all-reduce(%sc), channel_id=1, {G4}, use_global_device_ids=true, to_apply=%sum""",
                      ["%ar", "%v2", "%v3"], ["%x0", "%x1", "%x2"], ["f32[8]", "s32[2]", "f32[2]"],
                      entry_extra="")


# --------------------------------------------------------------------------- DUS form
def _dus_module(reducer: str = "max", index: str = "%v0", update: str = "f32[1]", buf: str = "f32[8]",
                trip: int = 8, start: int = 0, step: int = 1, ret_extra: str | None = None, **kw: object) -> str:
    state = ["f32[4]", buf] + (["f32[1]"] if ret_extra else [])
    body = f"""  %sn = f32[4] sine(%v1)
  %loc = f32[] reduce(%sn, f32[] constant(0)), dimensions={{0}}, to_apply=%sum
  %gl = f32[] all-reduce(%loc), channel_id=1, replica_groups=[1,4]<=[4], use_global_device_ids=true, to_apply=%{reducer}
  %upd = {update} reshape(%gl)
  %idx = s32[] {index}
  %dus = {buf} dynamic-update-slice(%v2, %upd, %idx)"""
    if index == "%v0":
        body = body.replace("%idx = s32[] %v0\n", "").replace("%upd, %idx)", "%upd, %v0)")
    ret = ["%sn", "%dus"] + ([ret_extra] if ret_extra else [])
    init = ["%x0", "%x1"] + (["%x2"] if ret_extra else [])
    params = ["f32[4]", buf] + (["f32[1]"] if ret_extra else [])
    return loop_module(state, body, ret, init, params, trip=trip, start=start, step=step, **kw)


MULTI_DUS = loop_module(["f32[4]", "f32[1,6]", "f32[8,6]"], """  %sn = f32[4] sine(%v1)
  %loc = f32[] reduce(%sn, f32[] constant(0)), dimensions={0}, to_apply=%max
  %lh = bf16[] convert(%loc)
  %gl = bf16[] all-reduce(%lh), replica_groups={{0,1,2,3}}, to_apply=%maxh
  %cv = f32[] convert(%gl)
  %upd = f32[1,1] reshape(%cv)
  %c0 = s32[] constant(0)
  %c2 = s32[] constant(2)
  %row = f32[1,6] negate(%v2)
  %d1 = f32[1,6] dynamic-update-slice(%row, %upd, %c0, %c2)
  %d2 = f32[8,6] dynamic-update-slice(%v3, %d1, %v0, %c0)""", ["%sn", "%v2", "%d2"], ["%x0", "%x1", "%x2"],
                        ["f32[4]", "f32[1,6]", "f32[8,6]"], trip=8, extra="""
%maxh (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %r = bf16[] maximum(%a, %b)
}
""")


@pytest.mark.parametrize("variant", [
    dict(index="%v3_other"),  # not the induction variable
    dict(update="f32[2]", index="%v0"),  # overlapping updates
    dict(start=1),
    dict(step=2),
    dict(trip=0),  # hlopt: a loop that never runs leaves the buffer unreduced
    dict(buf="f32[6]"),  # hlopt: the region would leave the buffer (XLA's clamping)
])
def test_dus_form_refusals(variant):
    kw = dict(variant)
    if kw.get("index") == "%v3_other":
        text = _dus_module().replace("%dus = f32[8] dynamic-update-slice(%v2, %upd, %v0)",
                                     "%k = s32[] constant(3)\n  %dus = f32[8] dynamic-update-slice(%v2, %upd, %k)"
                                     ).replace("%k = s32[] constant(3)", "%k = s32[] multiply(%v0, %v0)")
    elif kw.get("update") == "f32[2]":
        text = _dus_module().replace("%loc = f32[] reduce(%sn, f32[] constant(0)), dimensions={0}, to_apply=%sum",
                                     "%loc = f32[2] slice(%sn), slice={[0:2]}").replace(
            "%gl = f32[] all-reduce", "%gl = f32[2] all-reduce").replace("%upd = f32[1] reshape(%gl)",
                                                                        "%upd = f32[2] reshape(%gl)")
    else:
        text = _dus_module(**kw)
    _unchanged(text)


@pytest.mark.parametrize("user", ["%gl_user", "%upd", "%dus", "%v2", "%other"])
def test_dus_form_extra_users_prevent_motion(user):
    shapes = {"%gl_user": "f32[]", "%upd": "f32[1]", "%dus": "f32[8]", "%v2": "f32[8]", "%other": "f32[8]"}
    text = _dus_module()
    st_old = "(s32[], f32[4], f32[8])"
    st_new = f"(s32[], f32[4], f32[8], {shapes[user]})"
    value = {"%gl_user": "%gl", "%other": "%other"}.get(user, user)
    text = text.replace(st_old, st_new).replace("ROOT %t = " + st_new + " tuple(%next, %sn, %dus)",
                                                "ROOT %t = " + st_new + f" tuple(%next, %sn, %dus, {value})")
    if user == "%other":
        text = text.replace("%dus = f32[8] dynamic-update-slice",
                            "%other = f32[8] get-tuple-element(%p), index=2\n  %dus = f32[8] dynamic-update-slice")
    text = text.replace("tuple(%zero, %x0, %x1)", "tuple(%zero, %x0, %x1, %x2)").replace(
        "  %x1 = f32[8] parameter(1)", f"  %x1 = f32[8] parameter(1)\n  %x2 = {shapes[user]} parameter(2)")
    _unchanged(text)


def test_dus_condition_user_and_size_cap():
    _unchanged(_dus_module(cond_extra="\n  %peek = f32[8] get-tuple-element(%cp), index=2"))
    _unchanged(_dus_module(), dus_max_size_bytes=8 * 4 - 1)
    assert _run(hlo.parse(_dus_module()), dus_max_size_bytes=8 * 4)


# --------------------------------------------------------------------------- DS/DUS accumulation
def _ds_dus_module(groups: str) -> str:
    return loop_module(["f32[4]", "f32[2,4]"], f"""  %table = s32[8] constant({{0, 0, 0, 0, 1, 1, 1, 1}})
  %pid = u32[] partition-id()
  %oa = s32[1] dynamic-slice(%table, %pid), dynamic_slice_sizes={{1}}
  %off = s32[] reshape(%oa)
  %c0 = s32[] constant(0)
  %sn = f32[4] sine(%v1)
  %ar = f32[4] all-reduce(%sn), channel_id=1, replica_groups={groups}, use_global_device_ids=true, to_apply=%sum
  %r = f32[1,4] reshape(%ar)
  %ds = f32[1,4] dynamic-slice(%v2, %off, %c0), dynamic_slice_sizes={{1,4}}
  %acc = f32[1,4] add(%r, %ds)
  %dus = f32[2,4] dynamic-update-slice(%v2, %acc, %off, %c0)""", ["%sn", "%dus"], ["%x0", "%x1"],
                       ["f32[4]", "f32[2,4]"], header="num_partitions=8")


def test_dynamic_slice_accumulation_with_offsets_differing_in_groups_stays():
    _unchanged(_ds_dus_module("{{0,2,4,6},{1,3,5,7}}"))


# --------------------------------------------------------------------------- reduce-scatter
def _rs_module(path: str, acc_shape: str = "f32[2,8]", rs_dtype: str = "f32", to_apply: str = "%sum") -> str:
    return loop_module(["f32[8,8]", acc_shape], f"""  %g = f32[8,8] sine(%v1)
  %gi = {rs_dtype}[8,8] convert(%g)
  %rs = {rs_dtype}[2,8] reduce-scatter(%gi), channel_id=1, {G4}, use_global_device_ids=true, dimensions={{0}}, to_apply={to_apply}
{path}""", ["%v1", "%acc"], ["%x0", "%x1"], ["f32[8,8]", acc_shape])


def test_reduce_scatter_into_dus_is_refused():
    text = loop_module(["f32[8]", "f32[8,2]"], f"""  %rs = f32[2] reduce-scatter(%v1), channel_id=1, {G4}, use_global_device_ids=true, dimensions={{0}}, to_apply=%sum
  %u = f32[1,2] reshape(%rs)
  %c0 = s32[] constant(0)
  %dus = f32[8,2] dynamic-update-slice(%v2, %u, %v0, %c0)""", ["%v1", "%dus"], ["%x0", "%x1"],
                       ["f32[8]", "f32[8,2]"], trip=8)
    _unchanged(text, enable_reduce_scatter=True)


def _collectives_in_loops(m: Module) -> int:
    bodies = [i.attrs["body"] for i in m.instructions() if i.opcode == "while"]
    seen, work = set(bodies), list(bodies)
    while work:
        for callee in work.pop().called_computations():
            if callee not in seen:
                seen.add(callee)
                work.append(callee)
    return sum(_count(c) + _count(c, "reduce-scatter") for c in seen)


# --------------------------------------------------------------------------- hlopt's refusals, proven


# --------------------------------------------------------------------------- setup passes alone


