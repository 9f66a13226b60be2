"""triton-softmax-priority-fusion: growing XLA:GPU's block-level Triton normalization fusions."""

from __future__ import annotations

import pytest
from hlopt.passes.fusion.triton_softmax_priority_fusion import (
    TritonSoftmaxPriorityFusion,
    block_level_tile,
)
from hlopt.passes.fusion.triton_tiling import graph_of_fusion, tiling_cost
from hlopt.runtime import run_and_compare
from hlopt.runtime.xla_gpu_path import xla_gpu
from triton_cases import COMPUTATIONS, TRITON, normalized_rows

from hlopt import hlo

#: Layer norm as step 2 leaves it: XLA's Triton fusion centres the rows, the rest are single ops.
LAYER_NORM = """HloModule layer_norm, entry_computation_layout={(f32[16,512]{1,0}, f32[512]{0})->f32[16,512]{1,0}}

""" + COMPUTATIONS + """
ENTRY %main (x: f32[16,512], g: f32[512]) -> f32[16,512] {
  %x = f32[16,512]{1,0} parameter(0)
  %g = f32[512]{0} parameter(1)
""" + normalized_rows("%x") + """  ROOT %out = f32[16,512]{1,0} multiply(%norm, %gb)
}
"""


#: A Triton fusion whose one consumer is a row reduction (the variance): it becomes a Triton fusion with a row root.
VARIANCE = LAYER_NORM.split("ENTRY")[0].replace("->f32[16,512]{1,0}}", "->f32[16]{0}}") + """ENTRY %main (x: f32[16,512], g: f32[512]) -> f32[16] {
  %x = f32[16,512]{1,0} parameter(0)
  %g = f32[512]{0} parameter(1)
  %t = f32[16,512]{1,0} fusion(%x), kind=kCustom, calls=%centre, """ + TRITON + """
  %sq = f32[16,512]{1,0} multiply(%t, %t)
  %zero = f32[] constant(0)
  ROOT %var = f32[16]{0} reduce(%sq, %zero), dimensions={1}, to_apply=%add
}
"""


#: The split-K GEMM's partial sums (f32[4,16,512]) summed over dimension 0, then the layer norm: XLA grows its
#: normalization fusion over that reduce too (a reduce over a major dimension, its tile covering it).
SPLIT_K_NORM = LAYER_NORM.replace("(f32[16,512]{1,0}, f32[512]{0})->", "(f32[4,16,512]{2,1,0}, f32[512]{0})->").replace(
    """ENTRY %main (x: f32[16,512], g: f32[512]) -> f32[16,512] {
  %x = f32[16,512]{1,0} parameter(0)""", """ENTRY %main (xk: f32[4,16,512], g: f32[512]) -> f32[16,512] {
  %xk = f32[4,16,512]{2,1,0} parameter(0)
  %z0 = f32[] constant(0)
  %x = f32[16,512]{1,0} reduce(%xk, %z0), dimensions={0}, to_apply=%add""")


def _tritons(module: hlo.Module) -> list[hlo.Instruction]:
    return [i for i in module.entry.instructions if block_level_tile(i) is not None]


def _grown(text: str = LAYER_NORM) -> tuple[hlo.Module, hlo.Module]:
    before = hlo.parse(text)
    after = before.clone()
    assert TritonSoftmaxPriorityFusion().run(after)
    hlo.verify(after)
    return before, after


#: A multi-output Triton fusion (centred rows and their squares): tiled by its first output's tile.
TUPLE_ROOT = LAYER_NORM.split("ENTRY")[0].replace("->f32[16,512]{1,0}}", "->(f32[16,512]{1,0}, f32[16,512]{1,0})}") + """
%pair (p: f32[16,512]) -> (f32[16,512], f32[16,512]) {
  %p = f32[16,512]{1,0} parameter(0)
  %z = f32[] constant(0)
  %s = f32[16]{0} reduce(%p, %z), dimensions={1}, to_apply=%add
  %b = f32[16,512]{1,0} broadcast(%s), dimensions={0}
  %c = f32[16,512]{1,0} subtract(%p, %b)
  %q = f32[16,512]{1,0} multiply(%c, %c)
  ROOT %o = (f32[16,512]{1,0}, f32[16,512]{1,0}) tuple(%c, %q)
}

ENTRY %main (x: f32[16,512], g: f32[512]) -> (f32[16,512], f32[16,512]) {
  %x = f32[16,512]{1,0} parameter(0)
  %g = f32[512]{0} parameter(1)
  ROOT %t = (f32[16,512]{1,0}, f32[16,512]{1,0}) fusion(%x), kind=kCustom, calls=%pair, """ + TRITON + """
}
"""


def test_tuple_root_triton_fusion_is_tiled_by_its_first_output():
    module = hlo.parse(TUPLE_ROOT)
    fusion = module.entry.root
    tile = block_level_tile(fusion)
    assert tile is not None and len(tile) == 2
    both = tiling_cost(graph_of_fusion(fusion), tile)
    assert both is not None and both.cost_us > 0
    single = hlo.parse(LAYER_NORM).entry.instruction("t")  # the centring alone writes one output, not two
    one = tiling_cost(graph_of_fusion(single), block_level_tile(single))
    assert one is not None and both.cost_us > one.cost_us


def test_layer_norm_becomes_one_triton_fusion():
    _, after = _grown()
    ops = [i for i in after.entry.instructions if i.opcode not in ("parameter", "constant")]
    assert len(ops) == 1, [i.name for i in ops]
    fusion = ops[0]
    assert fusion.is_root and fusion.get("kind") == "kCustom"
    assert block_level_tile(fusion) is not None  # chosen by XLA's cost model (tests/test_triton_tiling.py)
    body = [i.opcode for i in fusion.attrs["calls"].instructions]
    assert body.count("reduce") == 2 and "rsqrt" in body
    assert {o.name for o in fusion.operands} == {"x", "g"}


def test_row_reduction_consumer_gets_a_row_root():
    _, after = _grown(VARIANCE)
    ops = [i for i in after.entry.instructions if i.opcode not in ("parameter", "constant")]
    assert len(ops) == 1 and ops[0].is_root and ops[0].attrs["calls"].root.opcode == "reduce"
    cfg = ops[0].backend_config_json()["fusion_backend_config"]
    assert cfg["kind"] == "__triton" and block_level_tile(ops[0]) is not None


def _with_second_output(op: str) -> str:
    """LAYER_NORM whose normalized value also feeds `op` (a f32[512,16] result of %norm), a second output."""
    text = LAYER_NORM.replace("%gb = f32[16,512]{1,0} broadcast(%g), dimensions={1}",
                              "%gb = f32[16,512]{1,0} broadcast(%g), dimensions={1}\n  %tt = f32[512,16]{1,0} "
                              + op)
    text = text.replace("ROOT %out = f32[16,512]{1,0} multiply(%norm, %gb)",
                        "%out = f32[16,512]{1,0} multiply(%norm, %gb)\n  ROOT %r = (f32[16,512]{1,0}, "
                        "f32[512,16]{1,0}) tuple(%out, %tt)")
    text = text.replace("->f32[16,512]{1,0}}", "->(f32[16,512]{1,0}, f32[512,16]{1,0})}").replace(
        "-> f32[16,512] {\n  %x", "-> (f32[16,512], f32[512,16]) {\n  %x")
    return text


def test_split_k_reduce_joins_the_normalization_fusion():
    _, after = _grown(SPLIT_K_NORM)
    ops = [i for i in after.entry.instructions if i.opcode not in ("parameter", "constant")]
    assert len(ops) == 1 and block_level_tile(ops[0]) is not None
    reduces = [i for i in ops[0].attrs["calls"].instructions if i.opcode == "reduce"]
    assert sorted(tuple(r.attrs["dimensions"]) for r in reduces) == [(0,), (1,), (1,)]
    assert [o.name for o in ops[0].operands if o.shape.rank] == ["xk", "g"]


def test_untileable_consumer_is_left_alone():
    text = _with_second_output("reduce-window(%norm, %zero), window={size=2x1 stride=32x1}, to_apply=%add")
    text = text.replace("f32[512,16]{1,0} reduce-window", "f32[1,512]{1,0} reduce-window").replace(
        "f32[512,16]", "f32[1,512]")
    module = hlo.parse(text)
    TritonSoftmaxPriorityFusion().run(module)
    hlo.verify(module)
    tt = module.entry.instruction("tt")
    assert tt.opcode == "reduce-window"  # Triton has no reduce-window: it stays out of every Triton fusion
    assert all("reduce-window" not in [i.opcode for i in t.attrs["calls"].instructions] for t in _tritons(module))


def test_transpose_consumer_joins_as_xla_tiles_it():
    module = hlo.parse(_with_second_output("transpose(%norm), dimensions={1,0}"))
    assert TritonSoftmaxPriorityFusion().run(module)
    hlo.verify(module)
    assert [i.opcode for i in module.entry.instructions if i.opcode not in ("parameter", "constant")] \
        == ["fusion", "fusion", "tuple"]  # the layer norm recomputed in the transpose's fusion and the product's
    for fusion in _tritons(module):
        assert block_level_tile(fusion) is not None


def _as_plain_fusions(module: hlo.Module) -> hlo.Module:
    """The module with its Triton fusions as plain loop fusions (what XLA:CPU runs)."""
    out = module.clone()
    for inst in out.entry.instructions:
        if block_level_tile(inst) is not None:
            inst.attrs["kind"] = "kLoop"
            inst.attrs.pop("backend_config", None)
    return out


CASES = [LAYER_NORM, VARIANCE, SPLIT_K_NORM, _with_second_output("transpose(%norm), dimensions={1,0}")]
CASE_IDS = ["layer_norm", "variance", "split_k_norm", "transposed_output"]


@pytest.mark.parametrize("text", CASES, ids=CASE_IDS)
def test_grown_fusion_computes_the_same_on_cpu(text):
    before, after = _grown(text)
    result = run_and_compare(_as_plain_fusions(before), _as_plain_fusions(after), rtol=1e-4, atol=1e-4)
    assert result.ok, result


@pytest.mark.xla_gpu
@pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")
@pytest.mark.parametrize("text", CASES, ids=CASE_IDS)
def test_grown_fusion_compiles_backend_only(text):
    _, after = _grown(text)
    after.is_scheduled = True
    result = xla_gpu.run_driver(after.to_text(), "h100", backend_only=True)
    kept = [i for i in result.final.entry.instructions if '"__triton"' in (i.backend_config or "")]
    assert len(kept) == len(_tritons(after)) >= 1 and result.executable
