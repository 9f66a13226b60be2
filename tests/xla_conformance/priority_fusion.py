"""Conformance asset for priority-fusion: XLA's own pass tests as data (tests/xla_conformance/README.md).

Inputs: the HLO modules of `xla/service/gpu/transforms/priority_fusion_test.cc` (openxla/xla @5315aec), every test
that runs the pass on HLO text (37; PriorityFusionWithTritonEnabledTest's DoNotFuseIntoRoot is
`DoNotFuseIntoRoot_TritonEnabled`; LimitNumberOfParameters' module is the one the test generates, with XLA's
MaxOperandsAndOutputsPerFusion() = 96; DoNotFuseBitWidthChangingBitcast's text has no `HloModule` line and no
`ENTRY` keyword, the file adds both). XLA's tests model an RTX A6000; hlopt's pass runs with its default device
(H100): a cost decision could differ for that reason alone (none of the differences below is one). XLA's
PriorityFusion grows `__triton` fusions in its queue unconditionally at this revision: those cases run hlopt with
`triton_softmax_priority_fusion=true`. PriorityFusionWithTritonEnabledTest's
`xla_gpu_experimental_enable_triton_heroless_priority_fusion` is `triton_heroless_priority_fusion=true`.
`xla_gpu_unsupported_enable_triton_multi_output_fusion` is `triton_multi_output_fusion=true`; it was on by default at
this revision (MultipleMultiOutputFusionCandidates relies on it without setting it), so every run that grows Triton
fusions has it, except the runs where a test turns it off. Emitter kinds (`RunAndGetFusionKinds`) are checked as fusion
kinds: XLA's kLoop emitter is `kind=kLoop`, kReduction and kTranspose emitters are `kind=kInput` fusions with a
reduce / transpose hero.

    python3 -m tests.xla_conformance.table priority-fusion --verbose
"""

from __future__ import annotations

from .common import Case, Outcome, Run, run_case  # noqa: F401 - run_case is the asset's runner

FOLDER = "priority_fusion"
T, F = Run("priority-fusion", True), Run("priority-fusion", False)
#: XLA's xla_gpu_unsupported_enable_triton_multi_output_fusion, on by default at this revision
MOF = "triton_multi_output_fusion=true"
TT, TF = Run(f"priority-fusion{{triton_softmax_priority_fusion=true,{MOF}}}", True), \
    Run(f"priority-fusion{{triton_softmax_priority_fusion=true,{MOF}}}", False)
#: a test that turns xla_gpu_unsupported_enable_triton_multi_output_fusion off
TF_NO_MOF = Run("priority-fusion{triton_softmax_priority_fusion=true}", False)
#: PriorityFusionWithTritonEnabledTest's configuration (xla_gpu_experimental_enable_triton_heroless_priority_fusion)
HT, HF = Run(f"priority-fusion{{triton_heroless_priority_fusion=true,{MOF}}}", True), \
    Run(f"priority-fusion{{triton_heroless_priority_fusion=true,{MOF}}}", False)
TRITON = "fusion{kind=kCustom}"
BIG = "too large for XLA:CPU in a test (hundreds of MB per array)"


def _c(name: str, *runs: Run, checks: tuple[str, ...] = (), note: str = "", not_runnable: str = "") -> Case:
    return Case(FOLDER, name, runs, checks, note, not_runnable)


CASES: tuple[Case, ...] = (
    _c("FuseWithSharedArgument", T, checks=("root fusion{kind=kLoop}",)),
    _c("FusionOnStreamAnnotatedComputation", T, checks=("root call", "called_root call fusion{kind=kLoop}")),
    _c("FusionFusionWithDuplication", T, checks=(
        "count entry _ 4", "root tuple(fusion(parameter), fusion(parameter))")),
    _c("FuseBroadcastIntoBitcastConsumers", T, checks=("count entry _ 2", "root fusion(parameter)")),
    _c("FuseWideningConvertIntoConsumers", T, checks=(
        "count entry _ 5", "root tuple(fusion{shape=f32[512]}(parameter), "
                           "bitcast{shape=s32[512]}(fusion{shape=f32[512]}(parameter)))")),
    _c("DoNotFuseBitWidthChangingBitcast", F),
    _c("FuseConvertIntoReduce", T, checks=("count_called fusion convert 3", "count entry fusion 3")),
    _c("ReductionEpilogueFusionRegressionTest", T, checks=(
        "count entry fusion 2", "count entry fusion{kind=kLoop} 1", "count_called fusion{kind=kInput} convert 1",
        "root bitcast(fusion)"), not_runnable=BIG),
    _c("DoNotChangeReductionFusionToLoopFusion", F),
    _c("DoNotFuseTransposeIntoReduce", T, checks=(
        "count entry fusion 8", "count entry fusion{kind=kLoop} 3", "count entry fusion{kind=kInput} 5"),
       note="XLA: emitter kinds 3 x kLoop, 2 x kReduction, 3 x kTranspose", not_runnable=BIG),
    _c("DoNotFuseReduceIntoReduce", T, checks=("count_called fusion reduce 2",)),
    _c("ConvertFusedIntoReduce", T, checks=("count_called fusion convert 3", "count entry fusion 3")),
    _c("DoNotFuseDynamicUpdateSliceIntoReduce", T, checks=(
        "called_root fusion log(reduce)", "called_root fusion dynamic-update-slice", "min entry fusion 3")),
    _c("DontFuseIntoFirstOperandOfScatter", T, checks=(
        "root add(fusion, fusion)", "called_root fusion{kind=kInput} scatter(parameter, add, add)")),
    _c("DontFuseConstantIntoFirstOperandOfScatter", T, checks=(
        "root fusion{kind=kInput}(constant, parameter)",
        "called_root fusion scatter(parameter, parameter, broadcast(constant))")),
    _c("DoNotFuseReduceIntoReduceEvenIfOccupancyIsHigh", T, checks=("count_called fusion reduce 2",),
       not_runnable=BIG),
    _c("FuseReductionEpilogueWithMultipleUsers", T, checks=("exists entry custom-call(fusion(parameter))",),
       not_runnable="custom call `negate`"),
    _c("EpilogueFusion", T, checks=("root fusion{kind=kInput;shape=f32[8,4,128]}(parameter)",)),
    _c("EpilogueFusionFails", F, not_runnable=BIG),
    _c("DoNotFuseIntoRoot", F),
    _c("DontFuseConcat", F),
    _c("FuseOnlySmallConstant", T, checks=(
        "root fusion(constant, parameter)", "called_root fusion multiply(parameter, add(parameter, "
                                            "broadcast(constant)))"),
       not_runnable="the test's 32x32 constant is elided ({...})"),
    _c("FuseSmallConstantIntoTritonFusion", TT, checks=(
        f"root {TRITON}(parameter)", "called_root fusion reduce(parameter, constant)"),
       not_runnable="a __triton fusion"),
    _c("FuseProducerConsumerMergedNotTooLarge", T),
    _c("CanMergeTritonFusionWithBothProducerAndConsumer", TT, checks=(
        f"root {TRITON}(parameter, parameter)",)),
    _c("FuseTritonProducerWithTwoConsumers", TT, checks=(
        f"root tuple({TRITON}(parameter), {TRITON}(parameter))",)),
    _c("FuseTritonProducerWithTwoConsumersUsingMultiOutputFusion", TF_NO_MOF, TT, checks=(
        f"root tuple(get-tuple-element{{index=0}}({TRITON}(parameter)), "
        f"get-tuple-element{{index=1}}({TRITON}(parameter)))",),
       note="run 1 without, run 2 with xla_gpu_unsupported_enable_triton_multi_output_fusion"),
    _c("FuseProducerWithTritonConsumerUsingMultiOutputFusion", TF_NO_MOF, TT, checks=(
        f"root tuple(get-tuple-element{{index=0}}({TRITON}(parameter)), "
        f"get-tuple-element{{index=1}}({TRITON}(parameter)))",),
       note="run 1 without, run 2 with xla_gpu_unsupported_enable_triton_multi_output_fusion"),
    _c("FuseTritonFusionBothEndsUsingMultiOutputFusion", TT, checks=(
        f"root tuple({TRITON}(log), {TRITON}(log), log)", "count entry fusion{kind=kCustom} 2"),
       note="with xla_gpu_unsupported_enable_triton_multi_output_fusion"),
    _c("TritonProducerNotSupported_DoNotFuse", TF),
    _c("TritonConsumerNotSupported_DoNotFuse", TF),
    _c("DoNotFuseInsideReducer", F),
    _c("SkipsTilingsWithInfiniteRuntime", TF, not_runnable=BIG),
    _c("TwoElementwiseOpsAreFusedWithTriton", HT, checks=(f"root {TRITON}(parameter, parameter)",),
       note="with xla_gpu_experimental_enable_triton_heroless_priority_fusion"),
    _c("DoNotFuseIntoRoot_TritonEnabled", HF),
    _c("LimitNumberOfParameters", T, checks=("operands_at_most fusion 96", "none entry add"),
       note="the test asserts the root has at most 96 operands; `none entry add` says every add was fused"),
    _c("MultipleMultiOutputFusionCandidates", HT, checks=(
        "root tuple(get-tuple-element(fusion), get-tuple-element(fusion), get-tuple-element(fusion))",
        f"exists entry {TRITON}(parameter, parameter)"),
       note="with xla_gpu_experimental_enable_triton_heroless_priority_fusion and a thread pool"),
)


def agreement(verbose: bool = False) -> list[Outcome]:
    """Run every case and print the table row."""
    from .common import print_table

    outs = [run_case(c) for c in CASES]
    print_table([("priority-fusion", outs)], verbose)
    return outs
