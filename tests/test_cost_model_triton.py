"""cost_model on XLA:GPU's Triton fusions: block-level `__triton` fusions by their tiles, GEMM fusions as dots."""

from __future__ import annotations

import pytest
from hlopt.cost_model import get_device
from hlopt.cost_model.kernel import KernelModel
from hlopt.cost_model.tiles import block_level_caps

from hlopt import hlo

H100 = get_device("h100")

SOFTMAX = """HloModule m

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%add (c: f32[], d: f32[]) -> f32[] {
  %c = f32[] parameter(0)
  %d = f32[] parameter(1)
  ROOT %s = f32[] add(%c, %d)
}

%softmax (p: f32[4096,1024]) -> f32[4096,1024] {
  %p = f32[4096,1024]{1,0} parameter(0)
  %ninf = f32[] constant(-inf)
  %rmax = f32[4096]{0} reduce(%p, %ninf), dimensions={1}, to_apply=%max
  %bmax = f32[4096,1024]{1,0} broadcast(%rmax), dimensions={0}
  %sub = f32[4096,1024]{1,0} subtract(%p, %bmax)
  %exp = f32[4096,1024]{1,0} exponential(%sub)
  %zero = f32[] constant(0)
  %rsum = f32[4096]{0} reduce(%exp, %zero), dimensions={1}, to_apply=%add
  %bsum = f32[4096,1024]{1,0} broadcast(%rsum), dimensions={0}
  ROOT %div = f32[4096,1024]{1,0} divide(%exp, %bsum)
}

ENTRY %e (x: f32[4096,1024]) -> f32[4096,1024] {
  %x = f32[4096,1024]{1,0} parameter(0)
  ROOT %f = f32[4096,1024]{1,0} fusion(%x), kind=KIND, calls=%softmax, backend_config=CONFIG
}
"""

TRITON = ('{"fusion_backend_config":{"kind":"__triton","block_level_fusion_config":{"num_warps":"4",'
          '"output_tiles":[{"sizes":["1","1024"]}],"num_ctas":1,"num_stages":1}}}')


def _softmax(kind: str, config: str) -> hlo.Instruction:
    return hlo.parse(SOFTMAX.replace("KIND", kind).replace("CONFIG", config)).entry.root


def test_block_level_softmax_is_a_roofline_not_a_recompute() -> None:
    """One program per row: each row is read once and written once, not re-reduced per element."""
    fusion = _softmax("kCustom", TRITON)
    est = KernelModel(H100).estimate(fusion)
    moved = 2 * 4096 * 1024 * 4  # the input read once, the output written once
    roofline_us = moved / H100.hbm_bandwidth * 1e6
    assert roofline_us <= est.exec_us <= 2.0 * roofline_us
    caps = block_level_caps(fusion, fusion.attrs["calls"])
    by_name = {i.name: c for i, c in caps.items()}
    assert by_name["rmax"] == pytest.approx(1.0) and by_name["p"] == pytest.approx(1.0)


def test_same_fusion_as_a_loop_fusion_keeps_xla_utilization() -> None:
    """The loop emitter recomputes the row reductions per element: the cap applies to Triton tiles only."""
    loop = KernelModel(H100).estimate(_softmax("kLoop", "{}"))
    tiled = KernelModel(H100).estimate(_softmax("kCustom", TRITON))
    assert loop.exec_us > 100 * tiled.exec_us
    assert block_level_caps(_softmax("kLoop", "{}"), _softmax("kLoop", "{}").attrs["calls"]) is None


GEMM = """HloModule m

%gemm (a: f32[2048,4096], b: f32[4096,1024]) -> f32[2048,1024] {
  %a = f32[2048,4096]{1,0} parameter(0)
  %b = f32[4096,1024]{1,0} parameter(1)
  ROOT %d = f32[2048,1024]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %e (x: f32[2048,4096], y: f32[4096,1024]) -> f32[2048,1024] {
  %x = f32[2048,4096]{1,0} parameter(0)
  %y = f32[4096,1024]{1,0} parameter(1)
  %plain = f32[2048,1024]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %f = f32[2048,1024]{1,0} fusion(%x, %y), kind=kCustom, calls=%gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
}
"""


def test_triton_gemm_fusion_is_timed_as_its_dot() -> None:
    module = hlo.parse(GEMM)
    model = KernelModel(H100)
    fused = model.estimate(module.entry.root)
    plain = model.estimate(module.entry.instruction("plain"))
    flops = 2 * 2048 * 1024 * 4096
    assert fused.flops == pytest.approx(flops, rel=0.01)
    assert fused.exec_us == pytest.approx(plain.exec_us, rel=0.05)
    assert fused.exec_us >= flops / H100.tensor_flops("f32") * 1e6
