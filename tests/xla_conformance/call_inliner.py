"""Conformance asset for call-inliner: XLA's own pass tests as data (tests/xla_conformance/README.md).

Inputs: the HLO modules of `xla/service/call_inliner_test.cc` (openxla/xla @14955ad), every test (23). Five of them
build their module with the C++ HloComputation::Builder (ControlDependenciesAreCarriedToCaller,
CallsWithinWhileBodiesAreInlined, InlineWithoutRunningPass, InlineWithEmptyComputation,
CallToOutfeedComputationIsInlined): their files restate that graph as HLO text. InlineWithoutRunningPass calls
the static `CallInliner::Inline(call)`; here the pass runs on the same module. The C++ configuration maps to
hlopt's options: `single_call_site`, `composites_to_preserve`, `uniquify_channel_ids`, `Run(module, {threads})`
-> `execution_threads`, `use_shardy_partitioner` in the module config -> the option of that name, a
`should_inline` callback -> `override_policy` (from Python). InliningDoesNotDuplicateLongOpNames sets the call's
op_name to `CallInliner::kMaxOpNameSize` (1024) x's in C++: the file holds them. GetInlinedModule tests a helper
that clones and inlines: the pass on the same module gives what it asserts.

    python3 -m tests.xla_conformance.table call-inliner --verbose
"""

from __future__ import annotations

from hlopt.passes.call_inliner import InlinePolicy

from .common import Case, Outcome, Run, run_case  # noqa: F401 - run_case is the asset's runner

FOLDER = "call_inliner"
INLINE = Run("call-inliner", True)


def _c(name: str, *runs: Run, checks: tuple[str, ...] = (), note: str = "", not_runnable: str = "",
       input: str = "", config: tuple = ()) -> Case:  # noqa: A002 - the Case field's name
    return Case(FOLDER, name, runs, checks, note, not_runnable, config, input)


def _trivial_only(call) -> InlinePolicy:  # noqa: ANN001 - an Instruction
    """XLA's test callback: inline only callees whose root is a parameter."""
    return InlinePolicy.ALLOW if call.attrs["to_apply"].root.opcode == "parameter" else InlinePolicy.PROHIBIT


_SHARDY = Run("call-inliner{use_shardy_partitioner=true}", False)
_MANUAL = "the SPMDFullToShardShape / SPMDShardToFullShape custom calls do not run on XLA:CPU"

CASES: tuple[Case, ...] = (
    _c("ControlDependenciesAreCarriedToCaller", INLINE,
       checks=("root constant{literal=42}", "ctrl entry constant{literal=42} constant{literal=24}")),
    _c("CallsWithinWhileBodiesAreInlined", INLINE,
       checks=("root while", "called_root while constant", "none module call")),
    _c("InlineWithoutRunningPass", INLINE,
       checks=("root constant{shape=pred[]}", "ctrl entry constant{shape=pred[1]} constant{shape=pred[]}"),
       note="XLA inlines the one call with CallInliner::Inline; the pass does the same on this module"),
    _c("InlineWithEmptyComputation", INLINE, checks=("root constant", "none module call")),
    _c("CallToOutfeedComputationIsInlined", INLINE, checks=("root outfeed", "none entry call"),
       not_runnable="outfeed"),
    _c("InlineSingleUseCalleesOnly", Run("call-inliner{single_call_site=true}", True),
       checks=("count entry _ 4", "order entry call{to_apply=a} | call{to_apply=a} | tuple | tuple")),
    _c("InliningPerformedInsideSpecifiedThreadsOnly", INLINE,
       checks=("root add(parameter, add(constant{literal=0}, _))",
               "exists module add(constant{literal=1}, constant{literal=2})", "none module call"),
       note="all threads; the async-done's wrapped computation root checked as an add of the two constants "
            "anywhere in the module",
       not_runnable="an async call on another execution thread"),
    _c("InliningPerformedInsideSpecifiedThreadsOnly.secondary",
       Run("call-inliner{execution_threads=secondary_thread}", True),
       checks=("root add(parameter, call)", "called_root call add(constant{literal=0}, _)",
               "exists module add(constant{literal=1}, constant{literal=2})"),
       input="InliningPerformedInsideSpecifiedThreadsOnly", note="the test's second run: the secondary thread only",
       not_runnable="an async call on another execution thread"),
    _c("InlineCompositeCall", Run("call-inliner{single_call_site=true}", True),
       checks=("count entry _ 3", "order entry constant | constant | add{frontend_attributes=}")),
    _c("PreserveCompositeCall", Run("call-inliner{single_call_site=true,composites_to_preserve=foo.bar}", False),
       checks=("order entry constant | call", "exists entry call{to_apply=add}")),
    _c("DontInlineCallWithAttributeInlineableFalse", _SHARDY,
       checks=("exists entry call{to_apply=test}",), not_runnable=_MANUAL),
    _c("UseShardyMhloToHloShmapBodyNotInlined", _SHARDY,
       checks=("exists entry call{to_apply=prefix_shmap_body_suffix.4}",), not_runnable=_MANUAL),
    _c("UseShardManualComputationBodyNotInlined", _SHARDY,
       checks=("exists entry call{to_apply=xla.sdy.manual_computation_body.4}",), not_runnable=_MANUAL),
    _c("UseShardManualComputationBodySurroundedNotInlined", _SHARDY,
       checks=("exists entry call{to_apply=my_model.___call__.fwd.xla.sdy.manual_computation_body_14.1234}",),
       not_runnable=_MANUAL),
    _c("ControlDepsPropagateToRootOfInlinedInstructions", INLINE,
       checks=("exists entry constant{literal=2;control_predecessors=call1}",
               "exists entry add{control_predecessors=call1}(parameter, constant)",
               "exists entry constant{literal=3;control_predecessors=call1}",
               "exists entry subtract{control_predecessors=call1}(add, constant)",
               "ctrl entry custom-call{target=baz} subtract", "none entry call"),
       not_runnable="custom calls foo and baz"),
    _c("ChannelIdsAreUniquifiedWhenSettingIsEnabled", Run("call-inliner{uniquify_channel_ids=true}", True),
       checks=("root tuple(all-gather, all-gather)", "distinct entry all-gather channel_id"),
       not_runnable="the test's two all-gathers gather 32 -> 128 and 128 -> 128 columns over the same groups: "
                    "no device count fits both"),
    _c("InlineScheduledModule", Run("call-inliner{execution_threads=main}", True),
       checks=("order entry parameter | get-tuple-element(parameter) | call-start | get-tuple-element(parameter) | "
               "constant | add | call-done | tuple | get-tuple-element(tuple) | call-start | "
               "get-tuple-element(tuple) | constant | add | call-done | tuple", "count entry _ 15", "root tuple"),
       note="XLA's fingerprint of the whole scheduled module: the sequence checked here, the async computations "
            "not", not_runnable="an async call on another execution thread"),
    _c("InlineNestedScheduledModule", INLINE,
       checks=("count entry _ 4", "root add(get-tuple-element(parameter), get-tuple-element(parameter))",
               "order entry parameter | get-tuple-element | get-tuple-element | add")),
    _c("InlineNonFlatScheduledModule", INLINE,
       checks=("count entry _ 3", "root abs(abs(parameter))", "order entry parameter | abs | abs")),
    _c("InliningMergesOpMetadataRecursively", INLINE,
       checks=("root while{op_name=x/while}", "called_root while{op_name=x/while} constant{op_name=x/while/cond}",
               "called_root while{op_name=x/while} convert{op_name=x/while/body}")),
    _c("InliningMergesOpNoEmbeddedRecursion", INLINE,
       checks=("root reduce{op_name=x/reduce}", "called_root reduce add{op_name=}")),
    _c("GetInlinedModule", INLINE, checks=("root reduce{op_name=x/reduce}", "called_root reduce add{op_name=}"),
       note="XLA's GetInlinedModule helper (clone + inline); the pass on the same module"),
    _c("InliningDoesNotDuplicateLongOpNames", INLINE, checks=("root negate{op_name=y}",)),
    _c("InliningCallBack", Run("call-inliner", True, options=(("override_policy", _trivial_only),)),
       checks=("root subtract(call(parameter), parameter)",)),
)


def agreement(verbose: bool = False) -> list[Outcome]:
    """Run every case and print the table row."""
    from .common import print_table

    outs = [run_case(c) for c in CASES]
    print_table([("call-inliner", outs)], verbose)
    return outs
