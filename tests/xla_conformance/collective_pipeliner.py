"""Conformance asset for collective-pipeliner: the inputs of XLA's own pass tests, the configuration each test
runs the pass with, and what each test expects, in hlopt's terms.

The inputs (`collective_pipeliner/<case>.hlo`) are the HLO modules of `xla/service/collective_pipeliner_test.cc`
(openxla/xla as of 2025-07-31, the revision with 65 tests), kept as test data. The configuration and the
expectation of every test are restated here as data: `Run` is one pass run (XLA's `RunOptimizer` arguments, XLA's
test defaults: `reuse_pipelined_op_buffer` true, `should_process` all-reduce), `changed` what the test asserts of
its result (None: not asserted); the checks are the main structural assertions of the test (not all of them:
FileCheck bodies and control-dependency details are left out; the case's `note` says what is left out).

A case agrees when every run gives the expected `changed`, and every check holds. A configuration hlopt's
pass has no option for (a `should_process` predicate other than opcodes, postprocessing hooks) is reported as
`unsupported`, which counts as a difference.

    python3 -m tests.xla_conformance.collective_pipeliner            # the agreement table
    python3 -m tests.xla_conformance.collective_pipeliner --verbose  # and why each differing case differs

Checks (a small vocabulary, evaluated on the module after the last run):
- `root PATTERN`: the entry root matches PATTERN, e.g. `dynamic-update-slice(_, all-reduce(get-tuple-element(
  while)), _, _, _)`: an opcode, optionally its operands in parentheses (all of them); `_` matches anything.
- `count COMP PATTERN N`: N instructions of computation COMP (`entry`, or `body`: the body of the entry's one
  while) match PATTERN.
- `exists COMP PATTERN`: at least one.
- `state N`: the entry's while has a tuple state of N elements.
- `loop_init K PATTERN` / `body_root K PATTERN`: operand K of the while's initial tuple / of its body's root.
- `group OPCODE ID`: every entry instruction of that opcode has `_scheduling_group_id` ID (`none`: no id;
  `none|4`: either).
- `dims OPCODE D0,D1,..`: some instruction of the module with that opcode has `dimensions` D.
- `ancestor COMP OPCODE PATTERN`: some instruction of COMP with that opcode is computed from one matching PATTERN.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .common import _the_while, instructions, matches

HERE = Path(__file__).resolve().parent / "collective_pipeliner"


@dataclass(frozen=True)
class Run:
    """One run of the pass, with XLA's RunOptimizer arguments (test defaults) and the asserted result."""

    changed: bool | None
    last_run: bool = True
    level: int = 0
    use_tree: bool = False
    different_sized: bool = True
    direction: str = "forward"
    #: XLA's should_process: opcodes joined by ':'; other predicates are named (`unsupported` unless hlopt has
    #: the predicate): `all-gather+move-to-device`, `recv-done`, `send+recv`, `annotated-all-gather`, `kSinkAnchor`
    process: str = "all-reduce"
    #: XLA's acceptable_formatting: `true`, or `not OPCODE`
    formatting: str = "true"
    reuse: bool = True
    loop_variant_in_chain: bool = False
    loop_invariant_in_chain: bool = False
    sink_size_threshold: int = 0
    #: hooks a test passes (postprocess_backward_peeled/rotated); hlopt has none
    hooks: bool = False
    #: run on a fresh copy of the input instead of the result of the previous run
    fresh: bool = False
    #: another pass the test runs after (e.g. `dce`)
    then: str = ""


@dataclass(frozen=True)
class Case:
    """One XLA test: its input file, its runs and its checks."""

    name: str
    runs: tuple[Run, ...]
    checks: tuple[str, ...] = ()
    note: str = ""
    #: partitions and replicas the test's module config sets (XLA's test default: 2 and 4)
    partitions: int = 2
    replicas: int = 4

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.hlo"

    @property
    def text(self) -> str:
        return self.path.read_text()


def _c(name: str, *runs: Run, checks: tuple[str, ...] = (), note: str = "", partitions: int = 2,
       replicas: int = 4) -> Case:
    return Case(name, runs, checks, note, partitions, replicas)


FWD = Run(True)
_AG = "all-gather"
_ROOT_AR_DS = "root dynamic-update-slice(_, all-reduce(dynamic-slice(get-tuple-element(while), " \
              "get-tuple-element(while), _, _)), _, _, _)"
_ROOT_AG = "root dynamic-update-slice(_, all-gather(get-tuple-element(while)), get-tuple-element, constant, constant)"
_BWD = dict(direction="backward", process=_AG, different_sized=False)
_SINK = dict(direction="forward-sink", use_tree=True)
_SINK_AR_AFTER = "exists entry all-reduce(get-tuple-element(while))"
#: XLA carries the counter of the prefetched iteration as loop element 4 (`add(counter, 1)` at the body's root);
#: hlopt computes it in the body from the counter: the check is that the all-gather the body prefetches is
#: computed from `counter + constant`
_SHIFTED = "XLA's shifted counter at body root operand 4 is computed in the body by hlopt"
_PREFETCH = "ancestor body all-gather add(get-tuple-element(parameter), constant)"
#: XLA leaves the loop's old result as get-tuple-element(tuple(...)); hlopt forwards the tuple's element, which
#: the check reads instead (the entry root is the loop's output 1)
_GTE_TUPLE = "XLA's get-tuple-element(tuple(...)) root is read through"

CASES: tuple[Case, ...] = (
    _c("transform_increment_index_by_one", FWD, checks=(_ROOT_AR_DS,)),
    _c("minimal_case_without_default_layouts", FWD, checks=(_ROOT_AR_DS,)),
    _c("transform_increment_index_by_one_collective_permute", FWD, partitions=8, replicas=1,
       checks=("exists entry collective-permute",), note="FileCheck of the validation attributes left out"),
    _c("transform_increment_index_by_one_collective_permute_backward_cycle", FWD, partitions=8, replicas=1,
       checks=("exists entry collective-permute",), note="FileCheck of the validation attributes left out"),
    _c("update_send_recv_channel_id_for_host_transfers", FWD, checks=("exists entry send-done",)),
    _c("transform_increment_index_by_one_no_reuse", Run(True, reuse=False), checks=("state 5",)),
    _c("transform_increment_index_by_one_not_first_idx", FWD,
       checks=("root dynamic-update-slice(_, all-reduce(dynamic-slice(get-tuple-element(while), _, "
               "get-tuple-element(while), _)), _, _, _)",)),
    _c("transform_increment_by_two", FWD, checks=(_ROOT_AR_DS,)),
    _c("no_transform_cant_prove_index_doesnt_wrap", Run(False)),
    _c("transform_negative_index_iteration_to_zero", Run(True, last_run=False),
       checks=("root dynamic-update-slice(_, custom-call(all-reduce(dynamic-slice(get-tuple-element(while), "
               "get-tuple-element, constant, constant)), constant), get-tuple-element, constant, constant)",)),
    _c("escaped_input_no_transform", Run(False)),
    _c("transform_with_ag", Run(True, process=_AG), checks=(_ROOT_AG,)),
    _c("transform_with_ag_with_formatting", Run(True, process=_AG),
       checks=("root dynamic-update-slice(_, slice(all-gather(get-tuple-element(while))), get-tuple-element, "
               "constant, constant)",)),
    _c("transform_with_ag_insert_custom_call", Run(True, last_run=False, process=_AG), Run(None, level=1),
       checks=(_ROOT_AG,)),
    _c("push_ag_over", Run(True, level=1, process=_AG),
       checks=("root dynamic-update-slice(dynamic-update-slice(_, all-gather, _, _, _), all-reduce(dynamic-slice("
               "dynamic-update-slice, _, _, _)), get-tuple-element, constant, constant)",)),
    _c("no_push_ag_over_because_different_size",
       Run(False, last_run=False, level=1, different_sized=False, process=_AG)),
    _c("transform_increment_by_two_format", FWD,
       checks=("root dynamic-update-slice(_, dynamic-slice(all-reduce(get-tuple-element), _, _, _), _, _, _)",)),
    _c("transform_increment_by_two_format_transpose", FWD,
       checks=("root dynamic-update-slice(_, reshape(transpose(all-reduce(get-tuple-element))), _, _, _)",)),
    _c("transform_increment_index_by_one_backwards", Run(True, **_BWD), checks=("count entry while 1",),
       note="XLA's control dependencies on the peeled tuple left out"),
    _c("transform_increment_index_by_one_start_from_one_backwards", Run(True, **_BWD),
       checks=(_PREFETCH,), note=_SHIFTED),
    _c("transform_increment_index_by_one_backwards_with_two_dependent_clones",
       Run(True, **{**_BWD, "process": "all-gather+move-to-device"}), checks=("count entry while 1",)),
    _c("loop_variant_appearing_in_root_tuple_multiple_times",
       Run(True, **{**_BWD, "process": "all-gather+move-to-device"})),
    _c("two_iterations",
       Run(True, direction="backward", use_tree=True, process="all-gather+move-to-device+move-to-host"),
       Run(False, use_tree=True, process="all-gather+move-to-device+move-to-host")),
    _c("transform_increment_index_by_one_backwards_collective_permute", Run(True, **_BWD), partitions=8,
       checks=("exists entry collective-permute",), note="FileCheck of the validation attributes left out"),
    _c("transform_increment_index_by_one_backwards_collective_permute_backward_cycle", Run(True, **_BWD),
       partitions=8, checks=("exists entry collective-permute",),
       note="FileCheck of the validation attributes left out"),
    _c("transform_increment_index_by_one_backwards_modify_out", Run(False, **_BWD)),
    _c("transform_increment_index_by_one_backwards_plus_forward",
       Run(True, last_run=False, direction="backward", process=_AG), Run(True)),
    _c("transform_increment_index_by_one_backwards_plus_forward_convert_output",
       Run(True, last_run=False, direction="backward", process=_AG), Run(True)),
    _c("multi_uses_elementwise", Run(True, use_tree=True)),
    _c("multi_uses_elementwise_sort_formatting_ops", Run(True, use_tree=True)),
    _c("element_wise_user", Run(True, use_tree=True)),
    _c("transform_increment_index_by_one_not_first_idx_sink", Run(True, **_SINK),
       checks=("dims transpose 0,1,3,2",), note="XLA's control dependency on the body root left out"),
    _c("forward_sink_linear_shape4097", Run(True, last_run=False, **_SINK)),
    _c("transform_increment_index_by_one_not_first_idx_sink_custom_call", Run(True, last_run=False, **_SINK),
       checks=(_SINK_AR_AFTER,), note="XLA's exact operand path to the all-reduce left out"),
    _c("not_transform_all_gather_with_recv_in_chain_backwards", Run(False, **_BWD)),
    _c("transform_recv_send_backwards", Run(True, **{**_BWD, "process": "recv-done"})),
    _c("transform_recv_send_backwards_with_loop_variant_parameter",
       Run(True, **{**_BWD, "process": "send+recv"}, loop_variant_in_chain=True, hooks=True), checks=("state 5",)),
    _c("multi_uses_elementwise_merge", Run(True, use_tree=True)),
    _c("multi_uses_elementwise_feed_two", Run(True, use_tree=True)),
    _c("multi_uses_elementwise_feed_two_with_reduce", Run(True, use_tree=True)),
    _c("pipelined_reduce_scatter_can_pass_verifier", Run(True, use_tree=True, process="reduce-scatter")),
    _c("pipeline_backward_include_invariant_multi_consumer_in_chain",
       Run(True, **_BWD, loop_variant_in_chain=True, loop_invariant_in_chain=True),
       Run(False, **_BWD, loop_variant_in_chain=True, fresh=True),
       checks=("loop_init 3 all-gather",), note="the check is on the first run's module"),
    _c("broadcast_as_formatting_op", Run(True, **_SINK), checks=(_SINK_AR_AFTER,)),
    _c("forward_sink_dependent_pipelineable_collectives", Run(True, **_SINK, formatting="not all-reduce"),
       checks=(_SINK_AR_AFTER,)),
    _c("forward_sink_dependent_pipelineable_collectives_not_last_run",
       Run(True, last_run=False, **_SINK, formatting="not all-reduce"), checks=(_SINK_AR_AFTER,)),
    _c("forward_sink_dependent_pipelineable_collectives_do_not_pipeline",
       Run(False, last_run=False, **_SINK, formatting="not all-reduce", sink_size_threshold=1024)),
    _c("forward_sink_first_dim_not_matching_loop_count", Run(False, **_SINK)),
    _c("forward_sink_not_first_dim", Run(False, **_SINK)),
    _c("collective_with_multiple_dus", Run(True, **_SINK), checks=(_SINK_AR_AFTER, "root reshape"), note=_GTE_TUPLE),
    _c("collective_with_multiple_dus_not_last_run", Run(True, last_run=False, **_SINK),
       checks=(_SINK_AR_AFTER, "root reshape"), note=_GTE_TUPLE),
    _c("collective_with_multiple_dus_same_buffer", Run(False, **_SINK)),
    _c("merge_two_collectives_each_with_two_dus", Run(True, **_SINK),
       checks=("root reshape(reduce)",), note=_GTE_TUPLE),
    _c("merge_two_collectives_each_with_two_dus_not_last_run", Run(True, last_run=False, **_SINK),
       checks=("root reshape(reduce)",), note=_GTE_TUPLE),
    _c("merge_four_collectives", Run(True, **_SINK), checks=("count entry all-reduce 4",)),
    _c("no_redundant_broadcasts_in_formatting_ops", Run(True, **_SINK),
       checks=("count entry broadcast(get-tuple-element(while)) 1",)),
    _c("all_gather_as_formatting_op", FWD,
       checks=("root dynamic-update-slice(get-tuple-element(while), all-gather(all-reduce), "
               "get-tuple-element(while), constant, constant)",)),
    _c("pipelined_scheduling_annotations_forward", FWD,
       checks=("group multiply 4", "group all-reduce none", "group all-gather none")),
    _c("pipelined_scheduling_annotations_backward", Run(True, **_BWD),
       checks=("group reshape none|4", "group all-gather none", "group all-reduce 5")),
    _c("transform_forward_with_inconsistent_scheduling_annotations",
       Run(False, process="annotated-all-gather")),
    _c("transform_forward_with_consistent_scheduling_annotations", Run(True, process="annotated-all-gather"),
       checks=(_ROOT_AG,)),
    _c("transform_backward_with_inconsistent_scheduling_annotations",
       Run(False, **{**_BWD, "process": "annotated-all-gather"})),
    _c("transform_backward_with_consistent_scheduling_annotations",
       Run(True, **{**_BWD, "process": "annotated-all-gather"}), checks=(_PREFETCH,), note=_SHIFTED),
    _c("transform_backward_then_forward", Run(True, **_BWD), Run(True, different_sized=True, reuse=False),
       checks=("count entry send 2",)),
    _c("forward_sink_consecutive_ar_sink", Run(True, last_run=False, **_SINK, then="dce"),
       checks=("count body all-reduce 0",), note="XLA's control dependency on the body root left out"),
    _c("pipeline_sink_instructions", Run(True, use_tree=True, process="kSinkAnchor"),
       checks=("count module fusion 4",)),
)


# --------------------------------------------------------------------------- running a case
class Unsupported(Exception):
    """A configuration hlopt's pass has no option for."""


def pass_options(run: Run) -> dict[str, object]:
    """hlopt's collective-pipeliner options for one of XLA's configurations; raises Unsupported."""
    from hlopt.passes.collectives import collective_pipeliner as cp

    collectives, predicates = cp.COLLECTIVES, getattr(cp, "PREDICATES", ())
    kinds = tuple(run.process.split(":"))
    options: dict[str, object] = {}
    if run.process == "annotated-all-gather":  # an all-gather annotated for this direction
        options.update(op=("all-gather",), annotated_only=True)
    elif run.process.startswith("all-gather+move-to-"):  # and the host-offloading custom-calls
        targets = {"move-to-device": "MoveToDevice", "move-to-host": "MoveToHost"}
        options["op"] = ("all-gather", *(f"custom-call={targets[t]}" for t in run.process.split("+")[1:]))
    elif all(k in collectives for k in kinds):
        options["op"] = kinds
    elif run.process in predicates:
        options["should_process"] = run.process
    else:
        raise Unsupported(f"should_process={run.process}")
    if run.hooks:
        raise Unsupported("postprocess hooks")
    options.update(direction=run.direction, last_run=run.last_run, level_to_operate_on=run.level,
                   pipeline_use_tree=run.use_tree, process_different_sized_ops=run.different_sized,
                   reuse_pipelined_op_buffer=run.reuse)
    supported = set(cp.CollectivePipeliner.__dataclass_fields__)
    if run.formatting != "true":
        options["formatting_excludes"] = (run.formatting.removeprefix("not "),)
    if run.loop_variant_in_chain:
        options["allow_loop_variant_parameter_in_chain"] = True
    if run.direction == "backward":  # XLA's test default is false (hlopt's default: XLA:GPU's true)
        options["add_loop_invariant_op_in_chain"] = run.loop_invariant_in_chain
    if run.sink_size_threshold:
        options["collective_size_threshold_to_stop_sinking"] = run.sink_size_threshold
    missing = sorted(set(options) - supported)
    if missing:
        raise Unsupported(", ".join(missing))
    return options


@dataclass
class Outcome:
    """What hlopt did on one case."""

    case: Case
    changed: list[bool | None] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: the module before and after each run that changed it (for numerics)
    modules: list[tuple[object, object]] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return not self.failures


def run_case(case: Case, keep_modules: bool = False, f32: bool = False) -> Outcome:
    """Run a case's runs with hlopt's pass and evaluate its checks; `f32`: with every bf16 of the input made
    f32 (numerics without bf16 rounding; the pass does not look at element types)."""
    from hlopt.hlo import parse, verify
    from hlopt.passes.framework.registry import create_pass

    out = Outcome(case)
    text = re.sub(r"\bbf16\b", "f32", case.text) if f32 else case.text
    try:
        original = parse(text)
    except Exception as e:  # noqa: BLE001 - a parse error is a difference, reported in the table
        out.failures.append(f"parse: {str(e).splitlines()[0]}")
        return out
    try:  # three inputs are refused by hlopt's verifier (XLA's test verifier is not as strict): verify after
        verify(original)  # each run only what verified before
        verifiable = True
    except Exception:  # noqa: BLE001
        verifiable = False
    module = original.clone()
    checked = None
    for n, run in enumerate(case.runs):
        if run.fresh:
            checked = checked or module
            module = original.clone()
        try:
            options = pass_options(run)
        except Unsupported as e:
            out.failures.append(f"run {n + 1}: unsupported {e}")
            return out
        before = module.clone() if keep_modules else None
        try:
            changed = create_pass("collective-pipeliner", **options).run(module)
            if run.then:
                create_pass(run.then).run(module)
            if verifiable:
                verify(module)
        except Exception as e:  # noqa: BLE001 - reported as a difference
            out.failures.append(f"run {n + 1}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return out
        out.changed.append(changed)
        if keep_modules and changed:
            out.modules.append((before, module.clone()))
        if run.changed is not None and changed != run.changed:
            out.failures.append(f"run {n + 1}: changed={changed}, XLA: {run.changed}")
    for check in case.checks:
        problem = evaluate(check, checked or module)
        if problem:
            out.failures.append(f"{check!r}: {problem}")
    return out


# --------------------------------------------------------------------------- checks
def evaluate(check: str, module) -> str:  # noqa: ANN001, C901 - a Module; one branch per check kind
    """'' when the check holds, else what was found."""
    kind, _, rest = check.partition(" ")
    if kind == "root":
        return "" if matches(module.entry.root, rest) else f"root is {module.entry.root.opcode}"
    if kind in ("count", "exists"):
        comp, _, rest = rest.partition(" ")
        if kind == "count":
            pattern, _, n = rest.rpartition(" ")
            found = sum(1 for i in instructions(module, comp) if matches(i, pattern))
            return "" if found == int(n) else f"{found} found"
        return "" if any(matches(i, rest) for i in instructions(module, comp)) else "none found"
    w = _the_while(module)
    if kind == "state":
        return "" if w is not None and len(w.shape.elements) == int(rest) else "other state"
    if kind in ("loop_init", "body_root"):
        k, _, pattern = rest.partition(" ")
        if w is None:
            return "no single while"
        tup = w.operand(0) if kind == "loop_init" else w.attrs["body"].root
        ok = tup.opcode == "tuple" and int(k) < tup.operand_count and matches(tup.operand(int(k)), pattern)
        return "" if ok else "no match"
    if kind == "group":
        opcode, _, want = rest.partition(" ")
        allowed = set(want.split("|"))
        for i in module.entry.instructions:
            if i.opcode == opcode:
                gid = i.frontend_attributes.get("_scheduling_group_id")
                gid = "none" if gid is None else str(gid).split(":")[0]
                if gid not in allowed:
                    return f"%{i.name} has group {gid}"
        return ""
    if kind == "ancestor":
        comp, _, rest = rest.partition(" ")
        opcode, _, pattern = rest.partition(" ")
        for inst in instructions(module, comp):
            if inst.opcode == opcode and _has_ancestor(inst, pattern):
                return ""
        return "none found"
    if kind == "dims":
        opcode, _, dims = rest.partition(" ")
        want = tuple(int(d) for d in dims.split(","))
        ok = any(tuple(i.attrs.get("dimensions") or ()) == want for i in instructions(module, "module")
                 if i.opcode == opcode)
        return "" if ok else "none found"
    raise ValueError(f"unknown check {check!r}")


def _has_ancestor(inst, pattern: str) -> bool:  # noqa: ANN001 - an Instruction
    seen, work = set(), list(inst.operands)
    while work:
        x = work.pop()
        if x in seen:
            continue
        seen.add(x)
        if matches(x, pattern):
            return True
        work.extend(x.operands)
    return False


def agreement(verbose: bool = False) -> list[Outcome]:
    """Run every case; print the table (and the differences with `verbose`)."""
    outcomes = [run_case(c) for c in CASES]
    agree = sum(o.agrees for o in outcomes)
    print("| pass | cases | agree |\n|---|---:|---:|")
    print(f"| collective-pipeliner | {len(outcomes)} | {agree} |")
    if verbose:
        for o in outcomes:
            if not o.agrees:
                print(f"- {o.case.name}: {'; '.join(o.failures)}")
    return outcomes


if __name__ == "__main__":
    agreement(verbose="--verbose" in sys.argv)
