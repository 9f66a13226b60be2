"""tree-reduction-rewriter, structure (no jax): a column reduction over many rows into few columns becomes two
reductions where the cost model rates them faster; other reductions stay. Numerics on XLA CPU:
test_tree_reduction_rewriter_numerics.py."""

from __future__ import annotations

from fusion_cases import entry_module
from hlopt.hlo.ir import Module
from hlopt.passes.framework.base import PassResult
from hlopt.passes.tree_reduction_rewriter import TreeReductionRewriter, split_plan

from hlopt import hlo

#: batch norm's per-channel sum over N*H*W = 4096 rows of 64 channels (XLA's model: 16.7 us as one kernel)
CHANNEL_SUM = entry_module("""  %x = f32[16,16,16,64]{3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%x, %z), dimensions={0,1,2}, to_apply=%sum""", "x: f32[16,16,16,64]", "f32[64]")

#: the same with a kept major dimension and two kept minor ones: [2, 4096, 8, 8] -> [2, 8, 8]
BATCHED = entry_module("""  %x = f32[2,64,64,8,8]{4,3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[2,8,8]{2,1,0} reduce(%x, %z), dimensions={1,2}, to_apply=%sum""", "x: f32[2,64,64,8,8]",
                       "f32[2,8,8]")


def _run(text: str) -> tuple[Module, Module, PassResult]:
    m = hlo.parse(text)
    before = m.clone()
    result = TreeReductionRewriter().run_with_result(m)
    hlo.verify(m)
    return before, m, result


def _reduces(m: Module) -> list:
    return [i for i in m.entry.instructions if i.opcode == "reduce"]


def test_a_slow_column_reduction_is_split_in_two():
    _, m, r = _run(CHANNEL_SUM)
    assert r.changed
    first, second = _reduces(m)
    assert list(first.shape.dims) == [64, 64] and list(first.attrs["dimensions"]) == [1]
    assert list(second.shape.dims) == [64] and m.entry.root is second
    assert first.operand(0).opcode == "reshape" and list(first.operand(0).shape.dims) == [64, 64, 64]
    (e,) = r.explanations
    assert e.taken and e.after_us < e.before_us and e.rule == "tree"


def test_kept_major_and_minor_dimensions():
    _, m, r = _run(BATCHED)
    assert r.changed
    first, second = _reduces(m)
    assert list(first.shape.dims) == [2, 64, 64] and list(second.shape.dims) == [2, 64]
    assert m.entry.root.opcode == "reshape" and list(m.entry.root.shape.dims) == [2, 8, 8]


def test_row_reductions_small_ones_and_fast_ones_stay():
    row = entry_module("""  %x = f32[64,4096]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%sum""", "x: f32[64,4096]", "f32[64]")
    small = entry_module("""  %x = f32[512,64]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%x, %z), dimensions={0}, to_apply=%sum""", "x: f32[512,64]", "f32[64]")
    wide = entry_module("""  %x = f32[4096,8192]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[8192]{0} reduce(%x, %z), dimensions={0}, to_apply=%sum""", "x: f32[4096,8192]", "f32[8192]")
    for text in (row, small):
        m = hlo.parse(text)
        assert split_plan(m.entry.root) is None
        assert not TreeReductionRewriter().run_with_result(m).changed
    _, m, r = _run(wide)  # 8192 columns: many blocks already, the split would only add a kernel
    assert not r.changed and any(not e.taken for e in r.explanations)


def test_a_transposed_layout_is_not_split():
    text = entry_module("""  %x = f32[4096,64]{0,1} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%x, %z), dimensions={0}, to_apply=%sum""", "x: f32[4096,64]{0,1}", "f32[64]")
    m = hlo.parse(text)
    assert split_plan(m.entry.root) is None
