"""Re-reads of a fused operand (utilization above 1), structure (no jax): fusion's cost model charges them as
XLA:GPU's ReadTimeWithDRAMHeuristic does, so that priority-fusion and multi-output-fusion refuse what XLA's
model rates slower (a one-block column reduction re-reading a broadcast per row) and keep what it rates
faster (a row reduction, many blocks). `KernelModel` (XLA's per-fusion estimate, benchmarks/cost_vs_xla.py)
is the referee. Numerics on XLA:CPU: test_fusion_rereads_numerics.py."""

from __future__ import annotations

import pytest
from fusion_cases import SUM, entry_module
from hlopt.cost_model.devices import get_device
from hlopt.cost_model.kernel import KernelModel, read_time_s, reread_weight
from hlopt.hlo.ir import Instruction, Module
from hlopt.passes.framework.pipeline import PipelineResult, run_pipeline
from hlopt.passes.fusion.fusion_cost import FusionCostModel, InstructionFlops, profile_of

from hlopt import hlo

H100 = get_device("h100")




#: Batch-norm's variance in NHWC: sum over N*H*W of (x - mean)^2 per channel, a column reduction to 64
#: values: XLA:GPU launches one block, so re-reading the broadcast mean 4096 times costs as much as
#: reading x again (XLA's default keeps the subtract in a loop fusion of its own).
COLUMN_VARIANCE = entry_module("""  %x = f32[16,16,16,64]{3,2,1,0} parameter(0)
  %m = f32[64]{0} parameter(1)
  %mb = f32[16,16,16,64]{3,2,1,0} broadcast(%m), dimensions={3}
  %d = f32[16,16,16,64]{3,2,1,0} subtract(%x, %mb)
  %sq = f32[16,16,16,64]{3,2,1,0} multiply(%d, %d)
  %b = f32[4096,64]{1,0} bitcast(%sq)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%b, %z), dimensions={0}, to_apply=%sum""", "x: f32[16,16,16,64], m: f32[64]",
                          "f32[64]")

#: The same arithmetic per row (layer norm's variance): a row reduction launches a block per few rows, the
#: re-reads come from cache at many times HBM bandwidth, and one kernel is faster.
ROW_VARIANCE = entry_module("""  %x = f32[4096,64]{1,0} parameter(0)
  %m = f32[4096]{0} parameter(1)
  %mb = f32[4096,64]{1,0} broadcast(%m), dimensions={0}
  %d = f32[4096,64]{1,0} subtract(%x, %mb)
  %sq = f32[4096,64]{1,0} multiply(%d, %d)
  %z = f32[] constant(0)
  ROOT %r = f32[4096]{0} reduce(%sq, %z), dimensions={1}, to_apply=%sum""", "x: f32[4096,64], m: f32[4096]",
                       "f32[4096]")


def _fused(text: str, spec: str = "priority-fusion") -> tuple[Module, Module, PipelineResult]:
    m = hlo.parse(text)
    before = m.clone()
    result = run_pipeline(m, spec)
    hlo.verify(m)
    return before, m, result


def _kernels(m: Module) -> list[Instruction]:
    return [i for i in m.entry.instructions if i.opcode == "fusion"]


def _reduction_fusion(m: Module) -> Instruction:
    (red,) = [f for f in _kernels(m) if any(i.opcode == "reduce" for i in f.attrs["calls"].instructions)]
    return red


def _xla_estimate_us(m: Module) -> float:
    """XLA's default estimate of every kernel (`KernelModel`, launch overhead included)."""
    km = KernelModel(H100)
    return sum(km.estimate(f).exec_us + H100.kernel_launch_us for f in _kernels(m))


def test_reread_weight_follows_the_grid():
    # one block: cache re-reads are no faster than HBM reads (the block's issue rate bounds both)
    assert reread_weight(H100, 1, 256) == pytest.approx(1.0)
    # a full grid: a small operand re-read from L1 costs 1/20 of an HBM read, a large one from L2 1/2.5
    assert reread_weight(H100, 4096, 256) == pytest.approx(1 / 20)
    assert reread_weight(H100, 4096, 1 << 20) == pytest.approx(1 / 2.5)
    # larger than L2: every re-read goes to HBM
    assert reread_weight(H100, 4096, 1 << 30) == pytest.approx(1.0)
    # the weight is read_time_s's own ratio
    net, total = 1 << 20, 5 << 20
    assert read_time_s(H100, 64, net, total) == pytest.approx(
        read_time_s(H100, 64, net, net) * (1 + 4 * reread_weight(H100, 64, net)), rel=1e-6)


def test_operand_read_bytes():
    cost = FusionCostModel("h100")
    assert cost.operand_read_bytes(1000.0, 0.5, 1) == 500.0
    assert cost.operand_read_bytes(1000.0, 1.0, 1) == 1000.0
    assert cost.operand_read_bytes(256.0, 4096.0, 1) == pytest.approx(256.0 * 4096)
    assert cost.operand_read_bytes(256.0, 4096.0, 4096) == pytest.approx(256.0 + 256.0 * 4095 / 20)


#: COLUMN_VARIANCE in two kernels (XLA's default) and in one (what fusion did before re-reads were charged).
_LOOP_COMP = """%loop (p0: f32[16,16,16,64], p1: f32[64]) -> f32[16,16,16,64] {
  %p0 = f32[16,16,16,64]{3,2,1,0} parameter(0)
  %p1 = f32[64]{0} parameter(1)
  %mb = f32[16,16,16,64]{3,2,1,0} broadcast(%p1), dimensions={3}
  %d = f32[16,16,16,64]{3,2,1,0} subtract(%p0, %mb)
  ROOT %sq = f32[16,16,16,64]{3,2,1,0} multiply(%d, %d)
}
"""
_REDUCE_COMP = """%red (q0: f32[16,16,16,64]) -> f32[64] {
  %q0 = f32[16,16,16,64]{3,2,1,0} parameter(0)
  %b = f32[4096,64]{1,0} bitcast(%q0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%b, %z), dimensions={0}, to_apply=%sum
}
"""
_ONE_COMP = """%one (p0: f32[16,16,16,64], p1: f32[64]) -> f32[64] {
  %p0 = f32[16,16,16,64]{3,2,1,0} parameter(0)
  %p1 = f32[64]{0} parameter(1)
  %mb = f32[16,16,16,64]{3,2,1,0} broadcast(%p1), dimensions={3}
  %d = f32[16,16,16,64]{3,2,1,0} subtract(%p0, %mb)
  %sq = f32[16,16,16,64]{3,2,1,0} multiply(%d, %d)
  %b = f32[4096,64]{1,0} bitcast(%sq)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%b, %z), dimensions={0}, to_apply=%sum
}
"""
_PARAMS = "x: f32[16,16,16,64], m: f32[64]"
TWO_KERNELS = f"HloModule t\n\n{SUM}\n{_LOOP_COMP}\n{_REDUCE_COMP}\nENTRY %main ({_PARAMS}) -> f32[64] {{" + """
  %x = f32[16,16,16,64]{3,2,1,0} parameter(0)
  %m = f32[64]{0} parameter(1)
  %l = f32[16,16,16,64]{3,2,1,0} fusion(%x, %m), kind=kLoop, calls=%loop
  ROOT %f = f32[64]{0} fusion(%l), kind=kInput, calls=%red
}
"""
ONE_KERNEL = f"HloModule t\n\n{SUM}\n{_ONE_COMP}\nENTRY %main ({_PARAMS}) -> f32[64] {{" + """
  %x = f32[16,16,16,64]{3,2,1,0} parameter(0)
  %m = f32[64]{0} parameter(1)
  ROOT %f = f32[64]{0} fusion(%x, %m), kind=kInput, calls=%one
}
"""


def test_xla_rates_the_one_kernel_variant_slower():
    """XLA's estimate (KernelModel): the broadcast re-read per row costs a whole second read of x."""
    two, one = hlo.parse(TWO_KERNELS), hlo.parse(ONE_KERNEL)
    assert _xla_estimate_us(two) < 0.7 * _xla_estimate_us(one)


def test_predicted_fused_time_matches_xla_estimate():
    """fusion's prediction for the loop fused into the reduction (from profiles, nothing built) against
    XLA's estimate of the one-kernel fusion, and its predictions of the two kernels as they are."""
    two, one = hlo.parse(TWO_KERNELS), hlo.parse(ONE_KERNEL)
    flops = InstructionFlops("h100")
    cost = flops.cost
    loop, red = _kernels(two)
    p, c = profile_of(loop, None, flops), profile_of(red, None, flops)
    km = KernelModel(H100)
    launch = H100.kernel_launch_us
    assert cost.fused_time_us(loop, p, red, c) == pytest.approx(km.estimate(_kernels(one)[0]).exec_us + launch,
                                                                rel=0.05)
    for kernel, prof in ((loop, p), (red, c)):
        assert cost.time_us(kernel, prof) == pytest.approx(km.estimate(kernel).exec_us + launch, rel=0.1)


def test_column_reduction_keeps_the_broadcast_subtract_apart():
    _, m, result = _fused(COLUMN_VARIANCE)
    red = _reduction_fusion(m)
    fused_ops = {i.opcode for i in red.attrs["calls"].instructions}
    assert "broadcast" not in fused_ops and "subtract" not in fused_ops
    assert len(_kernels(m)) == 2
    assert any("slower if fused" in line for line in result.explain_lines())
    assert _xla_estimate_us(m) == pytest.approx(_xla_estimate_us(hlo.parse(TWO_KERNELS)), rel=0.02)


def test_row_reduction_fuses_the_broadcast_subtract():
    _, m, _ = _fused(ROW_VARIANCE)
    (kernel,) = _kernels(m)
    assert {"broadcast", "subtract", "reduce"} <= {i.opcode for i in kernel.attrs["calls"].instructions}


#: Two loop kernels reading one 64 MB operand (larger than L2: every re-read would go to HBM).
LOOP_SIBLINGS = entry_module("""  %x = f32[4096,4096]{1,0} parameter(0)
  %e = f32[4096,4096]{1,0} exponential(%x)
  %e2 = f32[4096,4096]{1,0} multiply(%e, %e)
  %n = f32[4096,4096]{1,0} negate(%x)
  %n2 = f32[4096,4096]{1,0} add(%n, %n)
  ROOT %o = (f32[4096,4096]{1,0}, f32[4096,4096]{1,0}) tuple(%e2, %n2)""", "x: f32[4096,4096]",
                        "(f32[4096,4096], f32[4096,4096])")


def test_loop_siblings_read_a_shared_operand_once():
    """Merged, two loop fusions read their shared operand once (their loops meet at the tuple root): the
    modeled gain of the sibling fusion is at least that read."""
    _, m, result = _fused(LOOP_SIBLINGS, "priority-fusion,multi-output-fusion")
    (kernel,) = _kernels(m)
    assert kernel.attrs["calls"].root.opcode == "tuple"
    (taken,) = [e for r in result.records for e in r.explanations if e.taken and "sibling" in e.reason]
    read_x_us = (4096 * 4096 * 4) / H100.hbm_bandwidth * 1e6
    assert taken.gain_us > read_x_us


#: A loop kernel over [8,16,32,32] and a row reduction of the same operand seen as [8,16,1024]: the loop
#: shapes differ but one is a bitcast of the other, which XLA's ShapesCompatibleForMultiOutputFusion accepts.
BITCAST_SIBLINGS = entry_module("""  %x = f32[8,16,32,32]{3,2,1,0} parameter(0)
  %e = f32[8,16,32,32]{3,2,1,0} exponential(%x)
  %n = f32[8,16,32,32]{3,2,1,0} negate(%e)
  %b = f32[8,16,1024]{2,1,0} bitcast(%x)
  %z = f32[] constant(0)
  %r = f32[8,16]{1,0} reduce(%b, %z), dimensions={2}, to_apply=%sum
  ROOT %o = (f32[8,16,32,32]{3,2,1,0}, f32[8,16]{1,0}) tuple(%n, %r)""", "x: f32[8,16,32,32]",
                           "(f32[8,16,32,32], f32[8,16])")


def test_loop_shapes_compatible_when_one_is_a_bitcast_of_the_other():
    from hlopt.hlo.shape import parse_shape
    from hlopt.passes.fusion.multi_output_fusion import loop_shapes_compatible

    def ok(a: str, b: str) -> bool:
        return loop_shapes_compatible(parse_shape(a), parse_shape(b))

    assert ok("f32[8,16,32,32]{3,2,1,0}", "f32[8,16,1024]{2,1,0}")  # a reshape bitcast
    assert ok("f32[8,1,16]{2,1,0}", "f32[8,16]{1,0}")  # degenerate dimensions
    assert ok("f32[16,8]{0,1}", "f32[8,16]{1,0}")  # a transpose bitcast: same dimensions in memory
    assert ok("f32[16,8]{1,0}", "f32[8,16]{1,0}")  # row-major both: the reshape is a bitcast
    assert not ok("f32[16,8]{0,1}", "f32[8,16]{0,1}")  # column-major: the reshape moves elements
    assert not ok("f32[8,16,32,32]{2,3,1,0}", "f32[8,16,1024]{2,1,0}")  # not row-major: a copy, not a bitcast
    assert not ok("f32[8,16]{1,0}", "f32[8,32]{1,0}")


def test_siblings_with_bitcast_loop_shapes_become_one_kernel():
    _, m, result = _fused(BITCAST_SIBLINGS, "priority-fusion,multi-output-fusion")
    (kernel,) = _kernels(m)
    assert kernel.attrs["calls"].root.opcode == "tuple"
    assert not any("different loop shapes" in line for line in result.explain_lines())


#: A loop kernel that transposes its operand's minor dimension: XLA's heuristic rates all its reads
#: uncoalesced; fusing it into an elementwise consumer with a large operand of its own makes that
#: operand's reads uncoalesced too.
TRANSPOSING_PRODUCER = entry_module("""  %x = f32[131072,4]{1,0} parameter(0)
  %y = f32[4,131072]{1,0} parameter(1)
  %t = f32[4,131072]{1,0} transpose(%x), dimensions={1,0}
  %e = f32[4,131072]{1,0} exponential(%t)
  %a = f32[4,131072]{1,0} add(%e, %y)
  ROOT %o = (f32[4,131072]{1,0}, f32[4,131072]{1,0}) tuple(%a, %e)""", "x: f32[131072,4], y: f32[4,131072]",
                                 "(f32[4,131072], f32[4,131072])")


def test_uncoalesced_reads_are_charged_as_xla_charges_them():
    """The adapter's time of a kernel that transposes a minor dimension (not a tiled transpose) agrees with
    XLA's estimate (KernelModel), and a producer-consumer pair inherits the producer's uncoalesced reads."""
    m = hlo.parse(TRANSPOSING_PRODUCER)
    comp = m.entry
    names = {i.name: i for i in comp.instructions}
    from hlopt.passes.fusion.fusion_building import fuse_into_new_fusion

    loop = fuse_into_new_fusion(names["t"], names["e"], False, False)
    flops = InstructionFlops("h100")
    cost = flops.cost
    km = KernelModel(H100)
    assert km.estimate(loop).launch.emitter == "loop"  # too narrow for the tiled transpose emitter
    p = profile_of(loop, None, flops)
    assert cost.time_us(loop, p) == pytest.approx(km.estimate(loop).exec_us + H100.kernel_launch_us, rel=0.1)
    add = names["a"]
    c = profile_of(add, None, flops)
    assert not cost.fused_reads_coalesced(loop, p, add, c)
    assert cost.read_traits(add) == (False, False)


#: A consumer reading its producer twice elementwise (jax's x + x of a gradient): once fused, the producer is
#: evaluated once per element and its broadcast operand re-read as often as in the producer alone.
DOUBLE_USE = entry_module("""  %x = f32[1024,1024]{1,0} parameter(0)
  %v = f32[1024]{0} parameter(1)
  %b = f32[1024,1024]{1,0} broadcast(%v), dimensions={1}
  %m = f32[1024,1024]{1,0} multiply(%x, %b)
  ROOT %a = f32[1024,1024]{1,0} add(%m, %m)""", "x: f32[1024,1024], v: f32[1024]", "f32[1024,1024]")


def test_a_value_read_twice_elementwise_is_read_once():
    from hlopt.passes.fusion.fusion_building import fuse_into_new_fusion
    from hlopt.passes.fusion.fusion_cost import combined_util, merge_profiles

    assert combined_util(1.0, 1.0) == 1.0 and combined_util(0.5, 1.0) == 1.0
    assert combined_util(1024.0, 1.0) == 1025.0
    m = hlo.parse(DOUBLE_USE)
    names = {i.name: i for i in m.entry.instructions}
    loop = fuse_into_new_fusion(names["b"], names["m"], True, False)
    add = names["a"]
    flops = InstructionFlops("h100")
    cost = flops.cost
    p, c = profile_of(loop, None, flops), profile_of(add, None, flops)
    predicted = cost.fused_time_us(loop, p, add, c)
    p_ops, c_ops = loop.operands, add.operands
    fused = fuse_into_new_fusion(loop, add, True, False)
    merged = merge_profiles(fused, loop, p_ops, p, c_ops, c)
    fresh = profile_of(fused, None, InstructionFlops("h100"))
    assert merged.util == pytest.approx(fresh.util)
    assert merged.compute == pytest.approx(fresh.compute)
    km = KernelModel(H100)
    assert predicted == pytest.approx(km.estimate(fused).exec_us + H100.kernel_launch_us, rel=0.05)
