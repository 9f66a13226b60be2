"""passes/fusion/triton_tiling.py: tile propagation after XLA's SymbolicTileAnalysis and the output tile XLA's
indexing cost model picks (structure only: no jax)."""

from __future__ import annotations

import pytest
from hlopt.passes.fusion.triton_tiling import (
    FusedGraph,
    best_tiling,
    graph_of_fusion,
    graph_of_pair,
    output_tiles,
    outputs_of,
    propagate_tiles,
    tiled_root,
    tiling_cost,
    unsupported_reason,
)

from hlopt import hlo

ADD = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""

#: XLA:GPU's own Triton fusion (SoftmaxRewriterTriton, jax 0.10.2) from a held-out program: XLA gave it the
#: output tile [2,1024], 4 warps, and its indexing cost model 0.62825 us (reification_cost).
XLA_CENTRE = ADD + """
%centre (p: f32[256,1024]) -> f32[256,1024] {
  %p = f32[256,1024]{1,0} parameter(0)
  %z = f32[] constant(0)
  %sum = f32[256]{0} reduce(%p, %z), dimensions={1}, to_apply=%add
  %inv = f32[] constant(0.0009765625)
  %invb = f32[256]{0} broadcast(%inv), dimensions={}
  %mean = f32[256]{0} multiply(%sum, %invb)
  %meanb = f32[256,1024]{1,0} broadcast(%mean), dimensions={0}
  ROOT %c = f32[256,1024]{1,0} subtract(%p, %meanb)
}

ENTRY %main (x: f32[256,1024]) -> f32[256,1024] {
  %x = f32[256,1024]{1,0} parameter(0)
  ROOT %t = f32[256,1024]{1,0} fusion(%x), kind=kCustom, calls=%centre
}
"""


def _entry_op(text: str, name: str) -> hlo.Instruction:
    return hlo.parse(text).entry.instruction(name)


def _single(text: str, name: str) -> FusedGraph:
    inst = _entry_op(text, name)
    return FusedGraph(inst, {inst: list(inst.operands)})


def test_xla_tile_and_estimate_of_its_own_normalization_fusion():
    graph = graph_of_fusion(_entry_op(XLA_CENTRE, "t"))
    choice = best_tiling(graph)
    assert not isinstance(choice, str)
    assert choice.tile == (2, 1024) and choice.num_warps == 4 and choice.programs == 128
    assert choice.cost_us == pytest.approx(0.62825, rel=0.01)


def test_reduction_needs_whole_rows_and_bigger_tiles_read_less():
    graph = graph_of_fusion(_entry_op(XLA_CENTRE, "t"))
    tiles = propagate_tiles(graph, (1, 64))
    assert not isinstance(tiles, str)
    body = {i.name: i for i in graph.order()}
    x = graph.inputs()[0]  # the fusion's operand: its body parameter reads it
    assert tiles[body["sum"]] == {(1,)} and tiles[x] == {(1, 64), (1, 1024)}
    assert tiling_cost(graph, (1, 1024)).cost_us < tiling_cost(graph, (1, 1)).cost_us


SPLIT_K = ADD + """
ENTRY %main (x: f32[4,256,1024]) -> f32[256,1024] {
  %x = f32[4,256,1024]{2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[256,1024]{1,0} reduce(%x, %z), dimensions={0}, to_apply=%add
}
"""


def test_reduce_over_a_major_dimension_covers_it():
    graph = _single(SPLIT_K, "r")
    tiles = propagate_tiles(graph, (1, 1024))
    x = graph.root.operand(0)
    assert tiles[x] == {(4, 1, 1024)}


BITCASTS = """HloModule m

ENTRY %main (x: f32[256,1024], y: f32[1024,256]) -> (f32[256,8,128], f32[256,1024]) {
  %x = f32[256,1024]{1,0} parameter(0)
  %b = f32[256,8,128]{2,1,0} bitcast(%x)
  %y = f32[1024,256]{0,1} parameter(1)
  %t = f32[256,1024]{1,0} bitcast(%y)
  ROOT %r = (f32[256,8,128]{2,1,0}, f32[256,1024]{1,0}) tuple(%b, %t)
}
"""


def test_bitcasts_keep_contiguous_blocks_only():
    split = _single(BITCASTS, "b")
    x = split.root.operand(0)
    assert propagate_tiles(split, (1, 8, 128))[x] == {(1, 1024)}
    assert propagate_tiles(split, (2, 4, 128))[x] == {(2, 512)}
    assert isinstance(propagate_tiles(split, (1, 8, 64)), str)  # rows of 64 out of 128: not one block
    transposed = _single(BITCASTS, "t")  # a layout change: the physical shape is the same
    y = transposed.root.operand(0)
    assert propagate_tiles(transposed, (1, 1024))[y] == {(1024, 1)}


def test_unsupported_ops_are_named():
    module = hlo.parse(ADD + """
ENTRY %main (x: f32[16,512]) -> (f32[16,256], f32[16,512], f32[1,512]) {
  %x = f32[16,512]{1,0} parameter(0)
  %s = f32[16,256]{1,0} slice(%x), slice={[0:16], [0:512:2]}
  %c = f32[16,512]{1,0} constant({...})
  %z = f32[] constant(0)
  %w = f32[1,512]{1,0} reduce-window(%x, %z), window={size=16x1 stride=16x1}, to_apply=%add
  ROOT %r = (f32[16,256]{1,0}, f32[16,512]{1,0}, f32[1,512]{1,0}) tuple(%s, %c, %w)
}
""")
    entry = module.entry
    assert "strided" in unsupported_reason(entry.instruction("s"))
    assert "scalar constants" in unsupported_reason(entry.instruction("c"))
    assert "reduce-window" in unsupported_reason(entry.instruction("w"))
    assert unsupported_reason(entry.instruction("s").operand(0)) is not None  # a parameter is an input


def test_a_pair_reads_the_producer_inside():
    module = hlo.parse(XLA_CENTRE.replace("ROOT %t = f32[256,1024]{1,0} fusion(%x), kind=kCustom, calls=%centre",
                                          "%t = f32[256,1024]{1,0} fusion(%x), kind=kCustom, calls=%centre\n"
                                          "  ROOT %sq = f32[256,1024]{1,0} multiply(%t, %t)"))
    entry = module.entry
    graph = graph_of_pair(entry.instruction("t"), entry.instruction("sq"))
    assert graph.root.name == "sq" and [i.name for i in graph.inputs()] == ["x"]
    assert not isinstance(best_tiling(graph), str)


#: A reduce over dimension 0 of [8,16] whose operand is a bitcast of [2,4,16]: the reduced dimension (a symbol of
#: XLA's indexing maps) is split by the bitcast, `(s0 floordiv 4, s0 mod 4, d0)`, which XLA's SymbolicTileAnalysis
#: (jax 0.10.2) cannot tile ("Failed to compute symbolic tile"); found by XLA:GPU's backend refusing such a fusion.
SPLIT_SYMBOL = ADD + """
%body (p: f32[2,4,16]) -> f32[16] {
  %p = f32[2,4,16]{2,1,0} parameter(0)
  %m = f32[2,4,16]{2,1,0} multiply(%p, %p)
  %b = f32[8,16]{1,0} bitcast(%m)
  %z = f32[] constant(0)
  ROOT %r = f32[16]{0} reduce(%b, %z), dimensions={0}, to_apply=%add
}

ENTRY %e (x: f32[2,4,16]) -> f32[16] {
  %x = f32[2,4,16]{2,1,0} parameter(0)
  ROOT %f = f32[16]{0} fusion(%x), kind=kLoop, calls=%body
}
"""


def test_a_reduced_dimension_split_by_a_bitcast_is_not_tiled():
    fusion = hlo.parse(SPLIT_SYMBOL).entry.root
    why = best_tiling(graph_of_fusion(fusion))
    assert isinstance(why, str) and "split or merged" in why


def test_a_reduced_dimension_kept_whole_by_a_bitcast_is_tiled():
    text = SPLIT_SYMBOL.replace("dimensions={0}, to_apply", "dimensions={1}, to_apply").replace(
        "ROOT %r = f32[16]{0}", "ROOT %r = f32[8]{0}").replace("-> f32[16] {", "-> f32[8] {").replace(
        "ROOT %f = f32[16]{0}", "ROOT %f = f32[8]{0}")
    fusion = hlo.parse(text).entry.root
    assert not isinstance(best_tiling(graph_of_fusion(fusion)), str)


#: The tail of a layer norm XLA:GPU's backend refused as hlopt's Triton fusion (dp_train_step_1024, jax 0.10.2:
#: "Failed to compute symbolic tile for (d0, d1, d2) -> (d0 / 8, (d0 mod 8) * 32 + d1, d2)"): the bitcast merges
#: [8,256] into [2048] and the reshape splits it into [64,32]. Each alone is tiled; XLA composes the maps.
REGROUPED = """HloModule r

%body (p: f32[8,256,1024], w: f32[2048,1024]) -> f32[64,32,1024] {
  %p = f32[8,256,1024]{2,1,0} parameter(0)
  %w = f32[2048,1024]{1,0} parameter(1)
  %wb = f32[8,256,1024]{2,1,0} bitcast(%w)
  %m = f32[8,256,1024]{2,1,0} multiply(%p, %wb)
  %b = f32[2048,1024]{1,0} bitcast(%m)
  ROOT %r = f32[64,32,1024]{2,1,0} reshape(%b)
}

ENTRY %e (x: f32[8,256,1024], y: f32[2048,1024]) -> f32[64,32,1024] {
  %x = f32[8,256,1024]{2,1,0} parameter(0)
  %y = f32[2048,1024]{1,0} parameter(1)
  ROOT %f = f32[64,32,1024]{2,1,0} fusion(%x, %y), kind=kCustom, calls=%body
}
"""


def test_reshapes_that_split_and_merge_at_once_are_not_tiled():
    why = best_tiling(graph_of_fusion(hlo.parse(REGROUPED).entry.root))
    assert isinstance(why, str) and "split and merge" in why and "[64, 32, 1024] to [8, 256, 1024]" in why


def test_reshapes_that_only_merge_or_undo_each_other_are_tiled():
    merged = REGROUPED.replace("f32[64,32,1024]{2,1,0}", "f32[2048,1024]{1,0}").replace("f32[64,32,1024]",
                                                                                         "f32[2048,1024]")
    assert not isinstance(best_tiling(graph_of_fusion(hlo.parse(merged).entry.root)), str)
    back = REGROUPED.replace("f32[64,32,1024]", "f32[8,256,1024]")  # [8,256] -> [2048] -> [8,256]: the identity
    assert not isinstance(best_tiling(graph_of_fusion(hlo.parse(back).entry.root)), str)


#: `%v` is broadcast along rows and added to `%p`; as an extra output of the sum it is written once per row.
BROADCAST_OUTPUT = """HloModule b

ENTRY %main (v0: f32[64], p: f32[64,256]) -> (f32[64,256], f32[64]) {
  %v0 = f32[64]{0} parameter(0)
  %p = f32[64,256]{1,0} parameter(1)
  %v = f32[64]{0} exponential(%v0)
  %vb = f32[64,256]{1,0} broadcast(%v), dimensions={0}
  %s = f32[64,256]{1,0} add(%p, %vb)
  ROOT %t = (f32[64,256]{1,0}, f32[64]{0}) tuple(%s, %v)
}
"""


def test_multi_output_graph_is_tiled_by_its_real_root():
    # XLA's SymbolicTileAnalysis: one output no other fused instruction reads; the others reuse its tiling when
    # it covers them once per program (TilingCoversWholeShapeUniquely)
    entry = hlo.parse(BROADCAST_OUTPUT).entry
    v, vb = entry.instruction("v"), entry.instruction("vb")
    graph = graph_of_pair(v, vb, multi_output=True)
    assert graph.root.opcode == "tuple" and outputs_of(graph) == [vb, v]
    assert tiled_root(graph) is vb
    assert not isinstance(propagate_tiles(graph, (1, 256)), str)  # one tile of a row: %v once per program
    assert isinstance(propagate_tiles(graph, (1, 128)), str)  # two programs per row would both write %v
    choice = best_tiling(graph)
    assert not isinstance(choice, str) and choice.tile[1] == 256
    assert output_tiles(graph, choice) == [choice.tile, (choice.tile[0],)]
    assert set(v.users) == {vb, entry.root}  # the graph's tuple is no user of the module's instructions


def test_two_real_roots_are_not_tiled():
    text = BROADCAST_OUTPUT.replace("tuple(%s, %v)", "tuple(%s, %p2)").replace(
        "  ROOT %t", "  %p2 = f32[64]{0} negate(%v0)\n  ROOT %t")
    entry = hlo.parse(text).entry
    graph = graph_of_pair(entry.instruction("vb"), entry.instruction("s"))
    other = entry.instruction("p2")
    graph.edges[other] = list(other.operands)
    tup = hlo.Instruction("tuple", entry.root.shape, name="outs")
    graph.edges[tup] = [graph.root, other]
    graph.root = tup
    assert isinstance(tiled_root(graph), str) and isinstance(best_tiling(graph), str)
