"""priority-fusion growing XLA:GPU's block-level Triton fusions in its own queue (the
`triton_softmax_priority_fusion` option, XLA's CanFuseTriton); structure only, no jax."""

from __future__ import annotations

from hlopt.passes.fusion.priority_fusion import PriorityFusion
from hlopt.passes.fusion.triton_tiling import (
    best_tiling,
    block_level_tile,
    graph_of_fusion,
    is_generic_triton_fusion,
    tiling_cost,
    triton_fusion_plan,
)
from triton_cases import COMPUTATIONS, TRITON, normalized_rows

from hlopt import hlo

HEAD = "HloModule layer_norm\n\n" + COMPUTATIONS

#: Layer norm as step 2 leaves it (a Triton fusion centres the rows), fed by a residual add, and a transpose of
#: the input beside it (not row-tileable: never part of a Triton fusion).
LAYER_NORM = HEAD + """
ENTRY %main (x: f32[16,512], y: f32[16,512], g: f32[512]) -> (f32[16,512], f32[512,16]) {
  %x = f32[16,512]{1,0} parameter(0)
  %y = f32[16,512]{1,0} parameter(1)
  %g = f32[512]{0} parameter(2)
  %res = f32[16,512]{1,0} add(%x, %y)
""" + normalized_rows("%res") + """  %out = f32[16,512]{1,0} multiply(%norm, %gb)
  %tx = f32[512,16]{1,0} transpose(%x), dimensions={1,0}
  ROOT %r = (f32[16,512]{1,0}, f32[512,16]{1,0}) tuple(%out, %tx)
}
"""


def grow(text: str = LAYER_NORM, on: bool = True) -> hlo.Module:
    """The module after priority-fusion with Triton growth `on` (verified)."""
    module = hlo.parse(text)
    PriorityFusion(triton_softmax_priority_fusion=on).run(module)
    hlo.verify(module)
    return module


def _launches(module: hlo.Module) -> list[hlo.Instruction]:
    return [i for i in module.entry.instructions
            if i.opcode not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")]


def test_layer_norm_grows_into_one_triton_fusion_in_the_queue():
    module = grow()
    tritons = [i for i in module.entry.instructions if is_generic_triton_fusion(i)]
    assert len(tritons) == 1
    fusion = tritons[0]
    assert str(fusion.attrs["kind"]) == "kCustom"
    body = [i.opcode for i in fusion.attrs["calls"].instructions]
    assert body.count("reduce") == 2 and "rsqrt" in body and "add" in body  # the residual add came in too
    cfg = fusion.backend_config_json()["fusion_backend_config"]
    tile = tuple(int(t) for t in cfg["block_level_fusion_config"]["output_tiles"][0]["sizes"])
    graph = graph_of_fusion(fusion)  # a tile XLA's TryFindBestTilingForFusion would pick: none better by 1%
    assert tiling_cost(graph, tile).cost_us <= best_tiling(graph).cost_us * 1.01
    assert cfg["block_level_fusion_config"]["num_warps"] == str(tiling_cost(graph, tile).num_warps)
    assert {o.name for o in fusion.operands} == {"x", "y", "g"}
    assert len(_launches(module)) == 2  # the Triton fusion and the transpose


def test_transpose_never_joins_a_triton_fusion():
    module = grow()
    for inst in module.instructions():
        if is_generic_triton_fusion(inst):
            assert "transpose" not in [i.opcode for i in inst.attrs["calls"].instructions]


def test_without_the_option_triton_fusions_are_left_as_they_are():
    module = grow(on=False)
    t = module.entry.instruction("t")
    assert t.opcode == "fusion" and [i.opcode for i in t.attrs["calls"].instructions].count("reduce") == 1
    assert len(_launches(module)) > 2


def test_plan_refuses_an_untileable_pair():
    module = hlo.parse(LAYER_NORM)
    t, x = module.entry.instruction("t"), module.entry.instruction("x")
    tx = module.entry.instruction("tx")
    assert isinstance(triton_fusion_plan(t, module.entry.instruction("sq")), tuple)
    assert isinstance(triton_fusion_plan(x, tx), str)  # neither side is a Triton fusion


SOFTMAX_TILE = ('backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton",'
                '"block_level_fusion_config":{"num_warps":"2","output_tiles":[{"sizes":["1","4","128"]}],'
                '"num_ctas":1,"num_stages":1}}}')

#: Softmax as step 2 leaves it: XLA's Triton fusion subtracts the row max (four rows per program), the
#: exponential, its row sum and the division are single ops.
SOFTMAX = f"""HloModule softmax

%max (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

%shift (p: f32[8,32,128]) -> f32[8,32,128] {{
  %p = f32[8,32,128]{{2,1,0}} parameter(0)
  %ninf = f32[] constant(-inf)
  %m = f32[8,32]{{1,0}} reduce(%p, %ninf), dimensions={{2}}, to_apply=%max
  %mb = f32[8,32,128]{{2,1,0}} broadcast(%m), dimensions={{0,1}}
  ROOT %d = f32[8,32,128]{{2,1,0}} subtract(%p, %mb)
}}

ENTRY %main (x: f32[8,32,128]) -> f32[8,32,128] {{
  %x = f32[8,32,128]{{2,1,0}} parameter(0)
  %t = f32[8,32,128]{{2,1,0}} fusion(%x), kind=kCustom, calls=%shift, {SOFTMAX_TILE}
  %e = f32[8,32,128]{{2,1,0}} exponential(%t)
  %zero = f32[] constant(0)
  %rowsum = f32[8,32]{{1,0}} reduce(%e, %zero), dimensions={{2}}, to_apply=%add
  %sb = f32[8,32,128]{{2,1,0}} broadcast(%rowsum), dimensions={{0,1}}
  ROOT %y = f32[8,32,128]{{2,1,0}} divide(%e, %sb)
}}
"""

#: Split-GEMM partial sums ([4, 16, 512], summed over the major dimension) feeding a centring Triton fusion.
PARTIAL_SUMS = HEAD + f"""
ENTRY %main (parts: f32[4,16,512]) -> f32[16,512] {{
  %parts = f32[4,16,512]{{2,1,0}} parameter(0)
  %zero = f32[] constant(0)
  %partial = f32[16,512]{{1,0}} reduce(%parts, %zero), dimensions={{0}}, to_apply=%add
  ROOT %t = f32[16,512]{{1,0}} fusion(%partial), kind=kCustom, calls=%centre, {TRITON}
}}
"""


def test_softmax_with_four_rows_per_program_becomes_one_triton_fusion():
    module = hlo.parse(SOFTMAX)
    assert block_level_tile(module.entry.instruction("t")) == (1, 4, 128)
    module = grow(SOFTMAX)
    launches = _launches(module)
    assert len(launches) == 1 and str(launches[0].attrs["kind"]) == "kCustom"
    body = [i.opcode for i in launches[0].attrs["calls"].instructions]
    assert body.count("reduce") == 2 and "exponential" in body and "divide" in body


def test_partial_sums_reduce_can_join_the_triton_fusion():
    """A reduce over the stacked major dimension of split-GEMM partial sums tiles as XLA's SymbolicTileAnalysis
    tiles it (the reduced dimension whole in the operand's tile): XLA's CanFuseTriton allows the pair, and the
    fused tile reads every partial sum of its rows."""
    module = hlo.parse(PARTIAL_SUMS)
    plan = triton_fusion_plan(module.entry.instruction("partial"), module.entry.instruction("t"))
    assert not isinstance(plan, str), plan
    cfg, choice = plan
    assert len(choice.tile) == 2 and choice.cost_us > 0
    assert cfg["fusion_backend_config"]["block_level_fusion_config"]["output_tiles"] == [
        {"sizes": [str(t) for t in choice.tile]}]


def test_pair_with_an_unsupported_op_is_refused():
    """XLA's CanFuseTriton: the side that is not a Triton fusion must be one Triton supports (a strided slice is
    not)."""
    text = PARTIAL_SUMS.replace("%partial = f32[16,512]{1,0} reduce(%parts, %zero), dimensions={0}, to_apply=%add",
                                "%partial = f32[16,512]{1,0} slice(%parts), slice={[0:1], [0:16], [0:1024:2]}")
    text = text.replace("%parts = f32[4,16,512]{2,1,0} parameter(0)", "%parts = f32[4,16,1024]{2,1,0} parameter(0)")
    text = text.replace("(parts: f32[4,16,512])", "(parts: f32[4,16,1024])")
    module = hlo.parse(text)
    plan = triton_fusion_plan(module.entry.instruction("partial"), module.entry.instruction("t"))
    assert isinstance(plan, str) and "strided slice" in plan


#: XLA's priority_fusion_test.cc CanMergeTritonFusionWithBothProducerAndConsumer: the consumer's fused computation
#: and the Triton one both have an instruction named %multiply.
BOTH_ENDS = """HloModule t
add {
  Arg_0 = f32[] parameter(0)
  Arg_1 = f32[] parameter(1)
  ROOT add = f32[] add(Arg_0, Arg_1)
}

producer_computation {
  parameter_0 = f32[125]{0} parameter(0)
  ROOT broadcast = f32[125,127]{1,0} broadcast(parameter_0), dimensions={0}
}

consumer_computation {
  parameter_0 = f32[125,127]{1,0} parameter(0)
  parameter_1 = f32[125,127]{1,0} parameter(1)
  ROOT multiply = f32[125,127]{1,0} multiply(parameter_1, parameter_0)
}

triton_softmax_computation {
  parameter_0 = f32[125,127]{1,0} parameter(0)
  multiply_0 = f32[125,127]{1,0} multiply(parameter_0, parameter_0)
  constant_0 = f32[] constant(0)
  reduce_0 = f32[125]{0} reduce(multiply_0, constant_0), dimensions={1}, to_apply=add
  broadcast_4 = f32[125,127]{1,0} broadcast(reduce_0), dimensions={0}
  ROOT multiply = f32[125,127]{1,0} multiply(multiply_0, broadcast_4)
}

ENTRY main {
  param_0 = f32[125]{0} parameter(0)
  param_1 = f32[125,127]{1,0} parameter(1)
  producer_fusion = f32[125,127]{1,0} fusion(param_0), kind=kLoop, calls=producer_computation
  triton_softmax = f32[125,127]{1,0} fusion(producer_fusion), kind=kCustom, calls=triton_softmax_computation, backend_config={"fusion_backend_config": {"kind":"__triton","block_level_fusion_config":{"output_tiles":[{"sizes":["1","127"]}],"num_warps":"1"}}}
  ROOT consumer_fusion = f32[125,127]{1,0} fusion(param_1, triton_softmax), kind=kLoop, calls=consumer_computation
}
"""


def test_triton_fusion_merged_with_producer_and_consumer_verifies():
    module = grow(BOTH_ENDS)  # verified: no name used twice in the merged computation
    root = module.entry.root
    assert is_generic_triton_fusion(root) and {o.name for o in root.operands} == {"param_0", "param_1"}
    names = [i.name for i in root.attrs["calls"].instructions]
    assert len(names) == len(set(names))


SMALL_CONSTANT = """HloModule module
add {
  Arg_0 = f32[] parameter(0)
  Arg_1 = f32[] parameter(1)
  ROOT add = f32[] add(Arg_0, Arg_1)
}

triton_computation {
  param_0 = f32[32,64]{1,0} parameter(0)
  param_1 = f32[] parameter(1)
  ROOT reduce = f32[32]{0} reduce(param_0, param_1), dimensions={1}, to_apply=add
}

ENTRY main {
  param_0 = f32[32,64]{1,0} parameter(0)
  c_0 = f32[] constant(0)
  ROOT triton_softmax = f32[32]{0} fusion(param_0, c_0), kind=kCustom, calls=triton_computation, backend_config={"fusion_backend_config": {"kind":"__triton","block_level_fusion_config":{"output_tiles":[{"sizes":["1"]}],"num_warps":"1"}}}
}
"""


def test_small_constant_fuses_into_a_triton_fusion():
    """XLA's FuseSmallConstantIntoTritonFusion: with Triton growth on, the reduce's init comes inside."""
    root = grow(SMALL_CONSTANT).entry.root
    assert [o.name for o in root.operands] == ["param_0"] and str(root.attrs["kind"]) == "kCustom"
    assert root.backend_config_json()["fusion_backend_config"]["kind"] == "__triton"
    assert "constant" in [i.opcode for i in root.attrs["calls"].instructions]
    assert len(grow(SMALL_CONSTANT, on=False).entry.root.operands) == 2  # off: XLA's Triton rules do not apply


HEROLESS = """HloModule heroless

ENTRY %main (a: f32[64,512], b: f32[64,512]) -> (f32[64,512], f32[64,512]) {
  %a = f32[64,512]{1,0} parameter(0)
  %b = f32[64,512]{1,0} parameter(1)
  %s = f32[64,512]{1,0} add(%a, %b)
  %m = f32[64,512]{1,0} multiply(%s, %a)
  %t = f32[64,512]{1,0} reverse(%b), dimensions={1}
  %n = f32[64,512]{1,0} negate(%t)
  ROOT %r = (f32[64,512]{1,0}, f32[64,512]{1,0}) tuple(%m, %n)
}
"""


def test_heroless_triton_fusion_of_plain_ops_where_one_can_be_tiled():
    # XLA's xla_gpu_experimental_enable_triton_heroless_priority_fusion: a Triton fusion is the preferred result
    # of any fusible pair; a reverse is no Triton op, so its pair fuses by the usual rules
    module = hlo.parse(HEROLESS)
    result = PriorityFusion(triton_heroless_priority_fusion=True).run_with_result(module)
    hlo.verify(module)
    assert result.changed
    m, n = module.entry.root.operands
    assert is_generic_triton_fusion(m) and [i.opcode for i in m.attrs["calls"].instructions
                                            if i.opcode != "parameter"] == ["add", "multiply"]
    assert block_level_tile(m) is not None
    assert n.opcode == "fusion" and str(n.attrs["kind"]) != "kCustom"
    assert any("[triton]" in line and "%s into %m" in line for line in result.explain_lines())
    plain = hlo.parse(HEROLESS)
    s, m = plain.entry.instruction("s"), plain.entry.instruction("m")
    assert triton_fusion_plan(s, m) == "neither side is a block-level Triton fusion"
    assert not isinstance(triton_fusion_plan(s, m, heroless=True), str)
    # off (the default): ordinary loop fusions only
    PriorityFusion().run(plain)
    assert not any(is_generic_triton_fusion(i) for i in plain.entry.instructions)


#: Row softmax whose exponentials are an output too: `%e` feeds the row sum, the division and the tuple.
SOFTMAX_OUT = """HloModule softmax_out

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[64,256]) -> (f32[64,256], f32[64,256]) {
  %x = f32[64,256]{1,0} parameter(0)
  %e = f32[64,256]{1,0} exponential(%x)
  %z = f32[] constant(0)
  %s = f32[64]{0} reduce(%e, %z), dimensions={1}, to_apply=%add
  %b = f32[64,256]{1,0} broadcast(%s), dimensions={0}
  %d = f32[64,256]{1,0} divide(%e, %b)
  ROOT %t = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(%d, %e)
}
"""

MULTI_OUTPUT = "priority-fusion{triton_heroless_priority_fusion=true,triton_multi_output_fusion=true}"


def _multi_output(text: str, on: bool = True) -> tuple[hlo.Module, list[str]]:
    module = hlo.parse(text)
    result = PriorityFusion(triton_heroless_priority_fusion=True, triton_multi_output_fusion=on).run_with_result(module)
    hlo.verify(module)
    return module, result.explain_lines()


def test_producer_with_an_unfusible_user_becomes_an_output_of_a_triton_fusion():
    # XLA's Triton multi-output fusion: %e cannot fuse into the tuple, so once the rest is one Triton fusion, %e
    # fuses into it as an extra output; its other user reads it through a get-tuple-element
    module, lines = _multi_output(SOFTMAX_OUT)
    root = module.entry.root
    assert [o.opcode for o in root.operands] == ["get-tuple-element"] * 2
    fusion = root.operand(0).operand(0)
    assert root.operand(1).operand(0) is fusion and [o.attrs["index"] for o in root.operands] == [0, 1]
    assert is_generic_triton_fusion(fusion) and fusion.shape.is_tuple
    assert [o.name for o in fusion.operands] == ["x"]
    body = fusion.attrs["calls"]
    assert [o.name for o in body.root.operands] == ["d", "e"]  # the consumer's output, then the producer's
    tiles = fusion.backend_config_json()["fusion_backend_config"]["block_level_fusion_config"]["output_tiles"]
    assert len(tiles) == 2 and all(len(t["sizes"]) == 2 for t in tiles)
    assert block_level_tile(fusion) is not None
    assert tiling_cost(graph_of_fusion(fusion), block_level_tile(fusion)) is not None
    assert any("[triton multi-output]" in line and "%e into" in line for line in lines)


def test_multi_output_fusion_is_off_by_default():
    module, lines = _multi_output(SOFTMAX_OUT, on=False)
    assert not any(i.opcode == "fusion" and i.shape.is_tuple for i in module.entry.instructions)
    assert not any("multi-output" in line for line in lines)
    module = hlo.parse(SOFTMAX_OUT)  # nor without Triton growth
    PriorityFusion(triton_multi_output_fusion=True).run(module)
    assert not any(is_generic_triton_fusion(i) for i in module.entry.instructions)


#: `%a`'s only fusible user `%d` also reads `%c`, which needs `%a` first: fusing them would make a cycle.
CYCLE = """HloModule cycle

ENTRY %main (x: f32[64,256]) -> (f32[64,256], f32[64,256]) {
  %x = f32[64,256]{1,0} parameter(0)
  %a = f32[64,256]{1,0} exponential(%x)
  %c = f32[64,256]{1,0} custom-call(%a), custom_call_target="opaque"
  %d = f32[64,256]{1,0} add(%a, %c)
  ROOT %t = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(%d, %a)
}
"""


def test_no_multi_output_fusion_that_would_make_a_cycle():
    # XLA's OperandReachableFromProducer: %d's other operand %c is reached from %a
    module, lines = _multi_output(CYCLE)
    assert module.entry.instruction("a").opcode == "exponential"
    assert not any(i.opcode == "fusion" and i.shape.is_tuple for i in module.entry.instructions)


#: `%a` has two users it could fuse into as a multi-output fusion, and one it cannot (the tuple).
TWO_CANDIDATES = """HloModule two

ENTRY %main (x: f32[64,256]) -> (f32[64,256], f32[64,256], f32[64,256]) {
  %x = f32[64,256]{1,0} parameter(0)
  %a = f32[64,256]{1,0} exponential(%x)
  %l = f32[64,256]{1,0} tanh(%a)
  %q = f32[64,256]{1,0} sqrt(%a)
  ROOT %t = (f32[64,256]{1,0}, f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(%l, %q, %a)
}
"""


def test_multi_output_fusion_only_with_exactly_one_candidate():
    # XLA's CanFuseTritonMultiOutputWithSingleUser: with two candidates it does not choose
    module, lines = _multi_output(TWO_CANDIDATES)
    assert module.entry.instruction("a").opcode == "exponential"
    assert not any(i.opcode == "fusion" and i.shape.is_tuple for i in module.entry.instructions)
    assert any("more than one consumer" in line for line in lines)
