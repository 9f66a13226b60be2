"""Conformance asset for block-scaling-rewriter: XLA's own pass tests as data (tests/xla_conformance/README.md).

Inputs: the HLO modules of `xla/backends/gpu/transforms/block_scaling_rewriter_test.cc` (openxla/xla @41df019),
every test that runs the pass (`RunAndFilecheckHloRewrite`, 10). The `CudnnFusion*` tests of the same file test
`CudnnScaledDotHelper` (a later pass's helper on `scaled-dot` fusions), not this pass: left out. XLA's
`VersionInfo{}` is hlopt's default (no cuDNN); `kCudnnSupportsBlockScaledDot` is `cudnn_version=9.10`.
Each test is a FileCheck of the new computation: the checks restate its sequence (`order callee ...`, the
shapes and the operands that matter) and the root of the call.

    python3 -m tests.xla_conformance.table block-scaling-rewriter --verbose
"""

from __future__ import annotations

from .common import Case, Outcome, Run, run_case  # noqa: F401 - run_case is the asset's runner

FOLDER = "block_scaling_rewriter"
EXPAND = Run("block-scaling-rewriter", True)
CUDNN = Run("block-scaling-rewriter{cudnn_version=9.10}", True)


def _c(name: str, run: Run, *checks: str, note: str = "", not_runnable: str = "") -> Case:
    return Case(FOLDER, name, (run,), checks, note, not_runnable)


def _side(dq: str, scale: str, rs: str, cvt: str, layout: str = "") -> str:
    """FileCheck of one dequantized dot operand: convert(data) * reshape(broadcast(convert(scale)))."""
    lay = f";layout={layout}" if layout else ""
    return (f"convert{{shape={dq}{lay}}}(parameter) | convert{{shape={cvt}{lay}}} | broadcast{{shape={scale}}} | "
            f"reshape{{shape={rs}{lay}}} | multiply{{shape={rs}{lay}}}")


_CUDNN = "Only a GPU with cuDNN runs __cudnn$blockScaledDot"

CASES: tuple[Case, ...] = (
    _c("ExpandQuantizeCustomCall", EXPAND, "root call",
       "order callee reshape{shape=f32[10,8,32]}(parameter) | reduce{shape=f32[10,8];dimensions=2} | "
       "divide{shape=f32[10,8]}(reduce, broadcast(constant)) | convert{shape=f8e5m2[10,8]} | "
       "convert{shape=f32[10,8]} | broadcast{shape=f32[10,8,32]} | reshape{shape=f32[10,256]} | "
       "divide{shape=f32[10,256]}(parameter, reshape) | convert{shape=f8e4m3fn[10,256]}",
       "called_root call tuple(convert{shape=f8e4m3fn[10,256]}, convert{shape=f8e5m2[10,8]})",
       "exists callee constant{shape=f32[];literal=256}"),
    _c("ExpandDequantizeCustomCall", EXPAND, "root call",
       "called_root call multiply{shape=f32[10,256]}(convert(parameter), reshape(broadcast(convert(parameter))))",
       "exists callee broadcast{shape=f32[10,8,32];dimensions=0,1}"),
    _c("ExpandBlockScaledDotCustomCall", EXPAND, "root call",
       "order callee " + _side("f32[4,16,256]", "f32[4,16,8,32]", "f32[4,16,256]", "f32[4,16,8]") + " | "
       + _side("f32[4,32,256]", "f32[4,32,8,32]", "f32[4,32,256]", "f32[4,32,8]"),
       "called_root call dot{shape=f32[4,16,32];lhs_batch_dims=0;lhs_contracting_dims=2;"
       "rhs_batch_dims=0;rhs_contracting_dims=2}(multiply, multiply)"),
    _c("ExpandBlockScaledDotGlobalScale", EXPAND, "root call",
       "called_root call multiply{shape=f32[4,16,32]}(dot{shape=f32[4,16,32]}(multiply, multiply), "
       "broadcast{dimensions=}(parameter))"),
    _c("ExpandBlockScaledDotNonDefaultLayout", EXPAND, "root call",
       "order callee " + _side("f32[4,16,256]", "f32[4,16,8,32]", "f32[4,16,256]", "f32[4,16,8]", "2,0,1") + " | "
       + _side("f32[4,32,256]", "f32[4,32,8,32]", "f32[4,32,256]", "f32[4,32,8]", "0,1,2"),
       "exists callee broadcast{shape=f32[4,16,8,32];layout=3,0,2,1}",
       "exists callee broadcast{shape=f32[4,32,8,32];layout=0,1,3,2}",
       "called_root call dot{shape=f32[4,16,32];layout=2,1,0}(multiply, multiply)"),
    _c("ExpandBlockScaledDotQuantizedLhs", EXPAND, "root call",
       "order callee " + _side("f16[16,256]", "f16[16,8,32]", "f16[16,256]", "f16[16,8]"),
       "called_root call dot{shape=f16[16,32];lhs_contracting_dims=1;rhs_contracting_dims=1}"
       "(multiply, parameter)"),
    _c("ExpandBlockScaledDotExplicitBlockSize", EXPAND, "root call",
       "called_root call dot{shape=f32[4,16,32]}("
       "multiply(convert{shape=f32[4,16,224]}(parameter), reshape{shape=f32[4,16,224]}(broadcast{shape="
       "f32[4,16,7,32]}(convert{shape=f32[4,16,7]}(slice{shape=f8e5m2[4,16,7]}(parameter))))), "
       "multiply(convert{shape=f32[4,32,224]}(parameter), reshape{shape=f32[4,32,224]}(broadcast{shape="
       "f32[4,32,7,32]}(convert{shape=f32[4,32,7]}(slice{shape=f8e5m2[4,32,7]}(parameter))))))",
       note="the FileCheck's sequence checked as dataflow (hlopt places each scale's slice before the data's "
            "convert)"),
    _c("CudnnScaledDotSimple", CUDNN, "root call",
       "order callee reshape{shape=f8e8m0fnu[4,1,4,32,1,4]}(parameter) | "
       "transpose{shape=f8e8m0fnu[4,1,1,32,4,4];layout=5,2,3,4,1,0;dimensions=0,1,4,3,2,5} | "
       "reshape{shape=f8e8m0fnu[4,128,4]} | reshape{shape=f8e8m0fnu[4,1,4,32,1,4]}(parameter) | transpose | "
       "reshape{shape=f8e8m0fnu[4,128,4]}",
       "exists callee custom-call{target=__cudnn$blockScaledDot}(parameter, parameter, reshape, reshape)",
       "called_root call get-tuple-element{shape=f16[4,128,128];index=0}(custom-call)",
       not_runnable=_CUDNN),
    _c("CudnnScaledDotTransforms", CUDNN, "root call",
       "order callee pad{shape=f8e4m3fn[128,96]}(parameter, constant) | "
       "pad{shape=f8e8m0fnu[128,4]}(parameter, constant) | reshape{shape=f8e8m0fnu[1,1,4,32,1,4]} | "
       "transpose{shape=f8e8m0fnu[1,1,1,32,4,4];layout=5,2,3,4,1,0} | reshape{shape=f8e8m0fnu[128,4]} | "
       "pad{shape=f8e8m0fnu[128,4]}(parameter, constant) | reshape | transpose | reshape{shape=f8e8m0fnu[128,4]}",
       "exists callee custom-call{target=__cudnn$blockScaledDot;shape=(f16[128,128], u8[0])}"
       "(parameter, pad, reshape, reshape)",
       "called_root call slice{shape=f16[128,120]}(get-tuple-element{shape=f16[128,128]}(custom-call))",
       note="the pads' padding configs (0_8x0_0, 0_0x0_1, 0_8x0_1) are checked through the padded shapes; "
            "jaxlib 0.10.2's XLA:GPU (a B200 spec at cuDNN 9.10) gives the same sequence, rank 2, with the "
            "f8e8m0fnu pad value 2^-127",
       not_runnable=_CUDNN),
    _c("CudnnScaledDotPaddedScales", CUDNN, "root call",
       "order callee pad{shape=f8e4m3fn[4,128,96]}(parameter, constant) | "
       "pad{shape=f8e4m3fn[4,128,96]}(parameter, constant) | reshape{shape=f8e8m0fnu[4,1,4,32,1,4]}(parameter) | "
       "transpose | reshape{shape=f8e8m0fnu[4,128,4]} | reshape{shape=f8e8m0fnu[4,1,4,32,1,4]}(parameter) | "
       "transpose | reshape{shape=f8e8m0fnu[4,128,4]}",
       "exists callee custom-call{target=__cudnn$blockScaledDot}(pad, pad, reshape, reshape)",
       "called_root call slice{shape=f16[4,120,120]}(get-tuple-element{shape=f16[4,128,128]}(custom-call))",
       not_runnable=_CUDNN),
)


def agreement(verbose: bool = False) -> list[Outcome]:
    """Run every case and print the table row."""
    from .common import print_table

    outs = [run_case(c) for c in CASES]
    print_table([("block-scaling-rewriter", outs)], verbose)
    return outs
