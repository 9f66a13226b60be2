"""hlo.clone.clone_computation: a copy with fresh names, shared or private callees, control edges kept."""

from hlopt.hlo.clone import clone_computation

from hlopt import hlo

TEXT = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_inner (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%p)
}

%body (x: f32[4]) -> f32[] {
  %x = f32[4] parameter(0)
  %c = f32[4] fusion(%x), kind=kLoop, calls=%fused_inner
  %e = f32[4] exponential(%x)
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%c, %z), dimensions={0}, to_apply=%add
}

ENTRY %main (v: f32[4]) -> f32[] {
  %v = f32[4] parameter(0)
  ROOT %k = f32[] call(%v), to_apply=%body
}
"""


def _module():
    m = hlo.parse(TEXT)
    body = next(c for c in m.computations if c.name == "body")
    c = next(i for i in body.instructions if i.name == "c")
    e = next(i for i in body.instructions if i.name == "e")
    c.add_control_successor(e)
    return m, body


def test_shallow_copy_shares_callees_and_keeps_control_edges():
    m, body = _module()
    copy = clone_computation(m, body)
    hlo.verify(m)
    assert copy.name != body.name and m.computations.index(copy) == m.computations.index(body) - 1
    assert not {i.name for i in copy.instructions} & {i.name for i in body.instructions}
    calls = {i.opcode: i for i in copy.instructions}
    assert calls["fusion"].attrs["calls"].name == "fused_inner"
    assert [s.opcode for s in calls["fusion"].control_successors] == ["exponential"]
    assert copy.root.opcode == "reduce" and copy.root.attrs["to_apply"].name == "add"


def test_deep_copy_clones_callees_but_not_reducers():
    m, body = _module()
    before = len(m.computations)
    copy = clone_computation(m, body, deep=True)
    hlo.verify(m)
    assert len(m.computations) == before + 2  # the body and the fused computation; %add stays shared
    fusion = next(i for i in copy.instructions if i.opcode == "fusion")
    assert fusion.attrs["calls"].name != "fused_inner"
    assert [i.opcode for i in fusion.attrs["calls"].instructions] == ["parameter", "negate"]
    assert copy.root.attrs["to_apply"].name == "add"
