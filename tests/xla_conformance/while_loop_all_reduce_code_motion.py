"""Conformance asset for while-loop-all-reduce-code-motion: XLA's own pass tests as data
(tests/xla_conformance/README.md).

Inputs: the HLO modules of `xla/hlo/transforms/collectives/while_loop_all_reduce_code_motion_test.cc` (openxla/xla
@3be98a5), every test; the parameterized ones one case per instance (InvalidLoop x2, UserPreventsCodeMotion x5,
ChecksCarryPredicateReplication x8, their `absl::Substitute` done), RequireFlatWhileCallGraphFailure and
ReduceScatterAccumulateDisabledByDefault on the input of the test they share it with. XLA's configuration maps to
the options of the same names (`enable_reduce_scatter`, `run_setup_passes`, `require_flat_control_flow`); the
module config a test sets in C++ (replica_count / num_partitions / use_spmd_partitioning) is the case's `config`.
The runs use `repeat=false,reassociate=false` (XLA's one round; hlopt's extensions are off) and, where a test
asserts the moved all-reduces' channel id, `unique_channel_ids=false` (the id XLA's source copies; jaxlib 0.10.2's
XLA:GPU takes new ones). The checks restate each test's assertions; `zeros` accepts hlopt's
`broadcast(constant(0))` for buffers above 4096 elements where XLA writes a literal constant.

    python3 -m tests.xla_conformance.table while-loop-all-reduce-code-motion --verbose
"""

from __future__ import annotations

from .common import Case, Outcome, Run, run_case  # noqa: F401 - run_case is the asset's runner

FOLDER = "while_loop_all_reduce_code_motion"
PASS = "while-loop-all-reduce-code-motion{repeat=false,reassociate=false%s}"


def _run(changed: bool, options: str = "", fresh: bool = False) -> Run:
    return Run(PASS % ("," + options if options else ""), changed, fresh)


def _c(name: str, *runs: Run, checks: tuple[str, ...] = (), note: str = "", not_runnable: str = "",
       config: tuple = (), input: str = "") -> Case:  # noqa: A002 - the Case field's name
    return Case(FOLDER, name, runs, checks, note, not_runnable, config, input)


T, F = _run(True), _run(False)
RS = "enable_reduce_scatter=true"
RS_SETUP = "enable_reduce_scatter=true,run_setup_passes=true"
AR4 = "replica_groups=0,1,2,3;use_global_device_ids=true"
NO_AR = "none body all-reduce"
NO_RS = "none body reduce-scatter"
ELIDED = "the test's accumulators are elided constants ({...})"
SPMD8 = (("replica_count", 1), ("num_partitions", 8))  # use_spmd_partitioning: hlopt's default
SCATTER = ("hlopt refuses XLA's scatter form by default: moving all-reduce(scatter(buffer, ...)) out of the loop "
           "changes the results when a group has more than one member (docs/notes/while-loop-all-reduce-code-"
           "motion.md); `unsafe_scatter_motion=true` moves it as XLA does")


def _replication(cross_partition: bool, replicated: bool, swapped: bool) -> Case:
    name = (f"ScatterSelectReplication_{'partition' if cross_partition else 'replica'}_"
            f"{'replicated' if replicated else 'device_dependent'}_{'swapped' if swapped else 'plain'}")
    config = ((("replica_count", 1), ("num_partitions", 4)) if cross_partition
              else (("replica_count", 4), ("num_partitions", 1)))
    checks = (NO_AR,) if replicated else ("count body all-reduce 1",)
    return _c(name, _run(replicated), checks=checks, config=config,
              note="ChecksCarryPredicateReplication: moved only when the select's predicate is replicated")


CASES: tuple[Case, ...] = (
    _c("AllReduceAccumulate", T, checks=(
        NO_AR, "loop_init 3 zeros",
        f"exists entry all-reduce{{{AR4};to_apply=reduction}}(get-tuple-element{{index=3}}(while))")),
    _c("ReduceScatterAccumulate", _run(True, RS), checks=(
        NO_RS, "loop_init 3 zeros{shape=f32[4096,1024]}",
        f"exists entry reduce-scatter{{{AR4};to_apply=reduction}}(get-tuple-element{{index=3}}(while))")),
    _c("ReduceScatterAccumulateDisabledByDefault", F, input="ReduceScatterAccumulate"),
    _c("AllReduceSliceAccumulate", _run(True, "unique_channel_ids=false"), checks=(
        NO_AR, "count entry all-reduce 3", "count entry all-reduce{channel_id=1} 3"),
        note="the test asserts channel_id 1 on the three moved copies (XLA's source); jaxlib 0.10.2's XLA:GPU "
             "gives each a new id"),
    _c("AllReduceAccumulateUse", T, checks=(NO_AR, "root multiply(add, _)")),
    _c("RepeatedlyAccumulatedAllReduce", F),
    _c("TypeCastAllReduceAccumulate", T, checks=(
        NO_AR, "loop_init 3 zeros", "exists entry all-reduce{shape=bf16[1024,1024]}",
        "exists entry add{shape=f32[1024,1024]}")),
    _c("SelectAllReduceAccumulate", T, checks=(
        NO_AR, "loop_init 3 zeros", "exists entry all-reduce{shape=f32[1024,1024]}",
        "exists entry add{shape=f32[1024,1024]}"), not_runnable="custom call `something` (the predicates)"),
    _c("SelectReduceScatterAccumulate", _run(True, RS), checks=(
        NO_RS, "loop_init 3 zeros{shape=f32[1024,4096]}", "exists entry reduce-scatter{shape=f32[1024,1024]}",
        "exists entry add{shape=f32[1024,1024]}"), not_runnable="custom call `something` (the predicate)"),
    _c("SelectReduceScatterAccumulateNotScalarPredicate", _run(False, RS)),
    _c("MultipleLoopCalls", T, checks=("count entry while 2", "count entry all-reduce 2", "none bodies all-reduce")),
    _c("RequireFlatWhileCallGraphFailure", _run(True, "require_flat_control_flow=false"),
       _run(False, "require_flat_control_flow=true", fresh=True), input="MultipleLoopCalls"),
    _c("MultipleAllReduceAccumulate", T, checks=(NO_AR, "loop_init 3 zeros", "count entry all-reduce 2"),
       not_runnable=ELIDED),
    _c("MultipleReduceScatterAccumulate", _run(True, RS), checks=(
        NO_RS, "loop_init 3 zeros{shape=f32[4096,1024]}", "loop_init 5 zeros{shape=bf16[4096,1024]}",
        "count entry reduce-scatter 2"), not_runnable=ELIDED),
    _c("MixMovableAllReduceWithNotMovable", T, checks=(
        "count body all-reduce 1", "loop_init 3 zeros", "count entry all-reduce 1"), not_runnable=ELIDED),
    _c("DynamicSliceAllReduceDynamicUpdateSliceAccumulate", T, config=SPMD8, checks=(
        NO_AR, "loop_init 3 zeros", "exists entry all-reduce{shape=bf16[2,1024,1024]}",
        "exists entry add{shape=f32[2,1024,1024]}")),
    _c("DynamicSliceAllReduceDynamicUpdateSliceAccumulateNotMoved", F, config=SPMD8),
    _c("ReduceScatterTransposeAccumulate", _run(True, RS_SETUP), checks=(
        NO_RS, "loop_init 3 zeros{shape=f32[1024,4096]}",
        f"exists entry reduce-scatter{{{AR4};to_apply=reduction}}(get-tuple-element{{index=3}}(while))")),
    _c("ReduceScatterTransposeAccumulateNoMotion", _run(False, "enable_reduce_scatter=true,run_setup_passes=false")),
    _c("ReduceScatterTransposeConvertAccumulate", _run(True, RS_SETUP), checks=(
        NO_RS, "loop_init 3 zeros{shape=f32[1024,4096]}",
        f"exists entry reduce-scatter{{{AR4};to_apply=reduction}}(get-tuple-element{{index=3}}(while))"),
       not_runnable="the input's bf16 reduce-scatter applies an f32 reduction (mixed precision, which XLA's test "
                    "verifier allows and XLA:CPU rejects)"),
    _c("ReduceScatterTransposeConvertDisabledAccumulate",
       _run(False, "enable_reduce_scatter=true,run_setup_passes=false")),
    _c("ReduceScatterConvertAccumulate", _run(True, RS_SETUP), checks=(
        NO_RS, "loop_init 3 zeros{shape=f32[4096,1024]}",
        f"exists entry reduce-scatter{{{AR4}}}(get-tuple-element{{index=3}}(while))",
        "called_root reduce-scatter add{shape=f32[]}")),
    _c("AllReduceConvertAccumulateUse", _run(True, RS_SETUP), checks=(NO_AR, "root multiply(add, _)"),
       not_runnable="the input's bf16 all-reduce applies an f32 reduction (mixed precision, which XLA's test "
                    "verifier allows and XLA:CPU rejects)"),
    _c("SingleAllReduceDUS", T, checks=(
        NO_AR, "order entry while | get-tuple-element{shape=f32[16];index=2}(while) | "
               "all-reduce{shape=f32[16];to_apply=reduction}(get-tuple-element) | tuple(_, _, all-reduce)")),
    _c("MultipleDUSAndConvert", T, checks=(
        NO_AR, "order entry while | get-tuple-element{shape=f32[16,64];index=3}(while) | "
               "slice{shape=f32[16,1]}(get-tuple-element) | convert{shape=f16[16,1]}(slice) | "
               "all-reduce{shape=f16[16,1];to_apply=reduction}(convert) | convert{shape=f32[16,1]}(all-reduce) | "
               "dynamic-update-slice{shape=f32[16,64]}(get-tuple-element, convert, constant{shape=s64[]}, "
               "constant{shape=s64[]}) | tuple(_, _, _, dynamic-update-slice)"),
       not_runnable="the input's f16 reduce has an f32 init value (mixed precision, which XLA's test verifier "
                    "allows and XLA:CPU rejects)"),
    _c("MultipleAllReduceDifferentTypes", T, checks=(
        NO_AR, "order entry while | get-tuple-element{shape=f32[16];index=2}(while) | "
               "all-reduce{to_apply=reduction_add}(get-tuple-element) | get-tuple-element{index=3}(while) | "
               "all-reduce{to_apply=reduction_mul}(get-tuple-element) | tuple(_, _, all-reduce, all-reduce)")),
    _c("MultipleWhileOps", T, checks=(
        "none bodies all-reduce", "order entry while | get-tuple-element{shape=f32[16];index=2}(while) | "
        "all-reduce{to_apply=reduction}(get-tuple-element) | while | get-tuple-element{index=2}(while) | "
        "all-reduce{to_apply=reduction}(get-tuple-element)")),
    _c("ReverseIndexing", T, checks=(
        NO_AR, "order entry while | get-tuple-element{shape=f32[16];index=2}(while) | "
               "all-reduce{to_apply=reduction}(get-tuple-element) | tuple(_, _, all-reduce)")),
    _c("InvalidIndexing", F),
    _c("OverlappingUpdates", F),
    _c("InvalidLoop_start1_step1", F, note="AllReduceCodeMotionLoopTest.InvalidLoop (start 1, step 1)"),
    _c("InvalidLoop_start0_step2", F, note="AllReduceCodeMotionLoopTest.InvalidLoop (start 0, step 2)"),
    *(_c(f"UserPreventsCodeMotion_{k}", F, note="AllReduceCodeMotionUserTest.UserPreventsCodeMotion")
      for k in ("max_global", "update", "dus", "gte2", "other_gte")),
    _c("LoopConditionUserPreventsCodeMotion", F),
    _c("ReduceScatterAndDUSPreventCodeMotion", _run(False, RS),
       note="the test's text has no HloModule line; the file adds one"),
    _c("ComputationWithDUSAndAccumulation", T, checks=(
        NO_AR, "order entry while | get-tuple-element{shape=f32[16];index=2}(while) | "
               "all-reduce{to_apply=reduction}(get-tuple-element) | get-tuple-element{index=3}(while) | "
               "all-reduce{shape=f32[256]}(get-tuple-element) | add{shape=f32[256]}(parameter, all-reduce) | "
               "tuple(_, _, all-reduce, add)")),
    _c("DusHoistPermittedWhenUnrelatedGteSharesIndex", T, checks=(
        NO_AR, "count entry all-reduce 1", "order entry while | get-tuple-element{shape=f32[16];index=2}(while) | "
        "all-reduce{to_apply=reduction}(get-tuple-element) | tuple(_, _, all-reduce)"),
       not_runnable="custom call `te_op`"),
    _c("NestedAllReduceAccumulate", T, checks=(
        "none bodies all-reduce", "count entry all-reduce 1",
        "exists entry all-reduce{shape=f32[64,64]}(get-tuple-element{index=4}(while))",
        "root tuple(_, _, _, _, add(_, all-reduce))")),
    _c("ScalarAllReduceStaysInBodyWhenUsedAsScalingFactor", T, checks=(
        "count body all-reduce 1", "exists body all-reduce{shape=s32[]}", "count entry all-reduce 1",
        "exists entry all-reduce{shape=f32[128,128]}", "exists body multiply(_, broadcast(convert(all-reduce)))")),
    _c("MultipleGradientsScaledByScalarAllReduceStaysInBody", T, checks=(
        "count body all-reduce 1", "exists body all-reduce{shape=s32[]}",
        "count body multiply(_, broadcast(convert(all-reduce))) 2", "count entry all-reduce{shape=f32[64,64]} 2",
        "count entry all-reduce 2")),
    _c("NonScalarAllReducesMultipliedTogetherStayInBody", F, checks=(
        "count body all-reduce{shape=f32[128]} 2", "none entry all-reduce")),
    _c("ScalarAllReduceWithOnlyMultiplyUseIsNotDeleted", T, checks=(
        "count body all-reduce 1", "exists body all-reduce{shape=s32[]}")),
    _c("ScatterAllReduceAccumulate", T, checks=(NO_AR,), not_runnable="custom call `some_op` (the updates)"),
    *(_replication(cp, rp, sw) for cp in (False, True) for rp in (False, True) for sw in (False, True)),
    _c("ScatterAllReduceWithSelectAndConvert", T, checks=(NO_AR,),
       not_runnable="custom calls `predicate` and `some_op`"),
    _c("ScatterAllReduceBufferUsedElsewhere", F, checks=("exists body all-reduce",)),
    _c("ScatterAllReduceInvalidSelectPattern", F, checks=("exists body all-reduce",)),
    _c("PreserveFrontendAttributes", T, checks=(NO_AR, "exists entry while{frontend_attributes=foo=bar}")),
    _c("MovesKeyedAllReduce", T, checks=(
        "exists entry all-reduce{frontend_attributes=collective_group_key=g0}", "none computation:body all-reduce")),
    _c("AllReduceOutsideCalledComputationHoisted", T, checks=(
        "none body all-reduce", "exists body add(call(get-tuple-element), get-tuple-element)",
        "order entry constant{shape=s32[]} | parameter | zeros{shape=f32[4]} | tuple | while | "
        "all-reduce{channel_id=1;replica_groups=0,1,2,3;to_apply=reduction}(get-tuple-element{index=2}(while)) | "
        "add(parameter, all-reduce)", "root tuple(get-tuple-element, get-tuple-element, add)"),
       note="the FileCheck's exact text: hlopt's order and names differ only where the FileCheck does not look"),
    _c("AllReduceInsideTwiceCalledComputationHoisted", T, checks=(
        "none body all-reduce", "exists computation:bar all-reduce", "none entry all-reduce")),
    _c("AllReduceInsideCalledComputationNotHoisted", F),
    _c("AccumulationBufferOriginThroughCallNotHoisted", F),
    _c("AccumulationBufferConsumedByCallNotHoisted", F),
)


def agreement(verbose: bool = False) -> list[Outcome]:
    """Run every case and print the table row."""
    from .common import print_table

    outs = [run_case(c) for c in CASES]
    print_table([("while-loop-all-reduce-code-motion", outs)], verbose)
    return outs
