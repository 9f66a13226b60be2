"""scatter-simplifier, structure (no jax): every non-canonical scatter form becomes XLA's canonical one
(indices [N, k], index_vector_dim 1, updates [N, window...], no inserted window dims), the rest is left alone.
Numerics: test_scatter_simplifier_numerics.py."""

from __future__ import annotations

import pytest
from hlopt.passes.framework.registry import create_pass
from hlopt.passes.scatter_simplifier import is_simplified_scatter

from hlopt import hlo

_ADD = """%add (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %s = s32[] add(%a, %b)
}
"""


def scatter_module(indices: str, updates: str, dims: str, operand: str = "s32[3,3]") -> str:
    """A module scattering `updates` into a parameter of shape `operand` at `indices` with the dimension
    numbers `dims`."""
    return f"""HloModule s

{_ADD}
ENTRY %main (x: {operand}, i: {indices}, u: {updates}) -> {operand} {{
  %x = {operand} parameter(0)
  %i = {indices} parameter(1)
  %u = {updates} parameter(2)
  ROOT %r = {operand} scatter(%x, %i, %u), {dims}, to_apply=%add
}}
"""


#: name -> (module, the shapes of the simplified scatter's indices and updates)
CASES = {
    "inserted_window_dim": (scatter_module(
        "s32[2,1]", "s32[2,3]", "update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1"), (2, 1), (2, 1, 3)),
    "implicit_index_vector_dim": (scatter_module(
        "s32[2]", "s32[2,3]", "update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1"), (2, 1), (2, 1, 3)),
    "index_vector_dim_first": (scatter_module(
        "s32[1,2]", "s32[2,3]", "update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=0"), (2, 1), (2, 1, 3)),
    "two_scatter_dims": (scatter_module(
        "s32[2,2,1]", "s32[2,2,3]", "update_window_dims={2}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=2"), (4, 1), (4, 1, 3)),
    "scatter_dim_after_the_window": (scatter_module(
        "s32[2,1]", "s32[3,2]", "update_window_dims={0}, inserted_window_dims={1}, "
        "scatter_dims_to_operand_dims={1}, index_vector_dim=1"), (2, 1), (2, 3, 1)),
    "no_scatter_dim": (scatter_module(
        "s32[1]", "s32[3]", "update_window_dims={0}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=0"), (1, 1), (1, 1, 3)),
    "two_index_columns_both_inserted": (scatter_module(
        "s32[4,2]", "s32[4]", "update_window_dims={}, inserted_window_dims={0,1}, "
        "scatter_dims_to_operand_dims={1,0}, index_vector_dim=1"), (4, 2), (4, 1, 1)),
}


def simplify(text: str) -> tuple[hlo.Module, hlo.Module, bool]:
    m = hlo.parse(text)
    before = m.clone()
    changed = create_pass("scatter-simplifier").run(m)
    hlo.verify(m)
    return before, m, changed


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_form_becomes_canonical(name):
    text, idx, upd = CASES[name]
    before, m, changed = simplify(text)
    assert not is_simplified_scatter(before.entry.root) and changed
    s = m.entry.root
    assert s.opcode == "scatter" and is_simplified_scatter(s)
    assert s.operand(1).shape.dims == idx and s.operand(2).shape.dims == upd
    assert s.attrs["update_window_dims"] == (1, 2) and s.attrs["inserted_window_dims"] == ()
    assert s.attrs["index_vector_dim"] == 1 and s.operand(0).opcode == "parameter"
    assert s.attrs["scatter_dims_to_operand_dims"] == before.entry.root.attrs["scatter_dims_to_operand_dims"]
    assert not create_pass("scatter-simplifier").run(m)  # a fixed point


def test_variadic_scatter_reshapes_every_update():
    text = """HloModule v

%add2 (a: s32[], b: f32[], c: s32[], d: f32[]) -> (s32[], f32[]) {
  %a = s32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = f32[] parameter(3)
  %s = s32[] add(%a, %c)
  %t = f32[] add(%b, %d)
  ROOT %r = (s32[], f32[]) tuple(%s, %t)
}

ENTRY %main (x: s32[3,3], y: f32[3,3], i: s32[2,1], u: s32[2,3], v: f32[2,3]) -> (s32[3,3], f32[3,3]) {
  %x = s32[3,3] parameter(0)
  %y = f32[3,3] parameter(1)
  %i = s32[2,1] parameter(2)
  %u = s32[2,3] parameter(3)
  %v = f32[2,3] parameter(4)
  ROOT %r = (s32[3,3], f32[3,3]) scatter(%x, %y, %i, %u, %v), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add2
}
"""
    _, m, changed = simplify(text)
    s = m.entry.root
    assert changed and is_simplified_scatter(s) and s.operand_count == 5
    assert [s.operand(k).shape.dims for k in (3, 4)] == [(2, 1, 3), (2, 1, 3)]


def test_canonical_scalar_and_batched_scatters_are_left_alone():
    canonical = scatter_module("s32[2,1]", "s32[2,1,3]", "update_window_dims={1,2}, inserted_window_dims={}, "
                               "scatter_dims_to_operand_dims={0}, index_vector_dim=1")
    scalar = scatter_module("s32[2,0]", "s32[2]", "update_window_dims={}, inserted_window_dims={}, "
                            "scatter_dims_to_operand_dims={}, index_vector_dim=1", operand="s32[]")
    batched = scatter_module("s32[3,1]", "s32[3]", "update_window_dims={}, inserted_window_dims={1}, "
                             "input_batching_dims={0}, scatter_indices_batching_dims={0}, "
                             "scatter_dims_to_operand_dims={1}, index_vector_dim=1")
    for text in (canonical, scalar, batched):
        _, m, changed = simplify(text)
        assert not changed and m.entry.root.opcode == "scatter"


def test_the_fusion_pipeline_simplifies_scatters_before_fusing_them():
    from hlopt.passes.framework.pipeline import expanded_pipeline

    stages = expanded_pipeline("fusion").split(",")
    assert stages.index("scatter-simplifier") < stages.index("priority-fusion")
