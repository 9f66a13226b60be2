"""Re-emission for XLA:GPU that keeps hlopt's fusions and schedule in the executable (deviceless).

`compile_for_gpu(module, "h100")` runs the four steps of the XLA:GPU path:
1. hlopt's passes on the module jax lowered (`BEFORE_XLA`);
2. XLA:GPU's HLO passes with its generic fusion (`priority-fusion`, `multi_output_fusion`) and its
   latency-hiding scheduler switched off (`XLA_STAGE_DISABLED`); where step 1 left a collective in a loop
   body (a loop the collective-pipeliner pipelined), XLA's double-buffer loop unrolling on
   (`loop_double_buffering_flags`). XLA still assigns layouts,
   rewrites GEMMs and convolutions into library calls and Triton fusions, merges dots, converts
   collectives to async; what it leaves unfused comes back as single-op wrapped fusions;
3. hlopt after XLA: the wrapped single-op fusions and XLA's dynamic-slice custom fusions taken apart
   (library calls, Triton and other custom fusions stay as XLA made them), XLA's control edges dropped
   (the backend's copy insertion adds what our order needs), `AFTER_XLA` (fusion, async collectives,
   scheduling; its passes time the target GPU, `after_xla_passes`, and its scheduler times each async collective
   by XLA's own estimate of it in XLA's default compile of the same input, `_xla_collective_model`), printed
   is_scheduled=true;
4. XLA:GPU's backend only (`run_backend_only`) on that module: the serialized executable and XLA's final
   module.
XLA's default compile of the same input is run next to it; `fidelity` says what of ours the final module
kept, and XLA's estimates rate both (`runtime.xla_gpu_path.xla_gpu.estimate`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.literal import check_no_elided_constants
from hlopt.passes.dce import remove_unreachable_computations
from hlopt.passes.framework.pipeline import expanded_pipeline
from hlopt.runtime.execution.reentry import inline_fusion
from hlopt.runtime.xla_gpu_path.xla_gpu import (
    DriverResult,
    XlaEstimate,
    estimate,
    executed_computations,
    launch_kind,
    run_driver,
)

if TYPE_CHECKING:
    from hlopt.passes.framework.base import Pass
    from hlopt.passes.framework.pipeline import Fix

__all__ = ["BEFORE_XLA", "XLA_STAGE_DISABLED", "LOOP_DOUBLE_BUFFERING_FLAG", "loop_double_buffering_flags",
           "loops_with_collectives", "AFTER_XLA", "OPTIONAL_TRITON_PASS", "TRITON_PRIORITY_FUSION", "triton_variants", "dynamic_launches", "ReemitResult", "compile_for_gpu", "unwrap_single_ops",
           "is_wrapped_single_op", "is_unfused_wrapper", "fidelity", "prepare_after_xla",
           "drop_control_dependencies", "guard_decision", "check_gpu_input", "CPU_ONLY_BACKEND_CONFIG",
           "after_xla_passes", "without_triton_growth", "TRITON_REFUSALS"]

#: Step 1: hlopt's passes before XLA: collective-pipeliner in XLA:GPU's three configurations, each move kept only
#: where hlopt's cost model (with XLA:GPU's combiners modelled) says it pays.
BEFORE_XLA = expanded_pipeline("xla-gpu-before")  # the named pipelines live in passes.framework.pipeline
#: Step 2: XLA:GPU passes switched off: the two generic fusion passes of its `fusion` pipeline
#: (xla/service/gpu/fusion_pipeline.cc: PriorityFusion is `priority-fusion`, MultiOutputFusion is
#: `multi_output_fusion`) and its scheduler's pipeline (`latency-hiding-scheduler`, gpu_hlo_schedule.cc).
#: The rest of the `fusion` pipeline still runs (variadic-op splitter, sort-iota fusion, CSE, DCE): switching
#: the whole pipeline off costs sort programs their sort-iota fusions (sort_topk_argmax: 9 launches, not 6).
#: Names checked with --xla_dump_hlo_pass_re=.* on jax-cuda12-plugin 0.10.2.
XLA_STAGE_DISABLED = "priority-fusion,multi_output_fusion,latency-hiding-scheduler"
#: Step 2's XLA flag for XLA:GPU's DoubleBufferLoopUnrolling (kDoubleBuffer: every loop of known trip count above
#: one unrolled by two, an odd trip count's first iteration peeled). XLA's kAuto strategy, which unrolls only
#: the loops holding a collective, is the rule hlopt applies (`loop_double_buffering_flags`); this XLA's
#: `--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_AUTO_UNROLL` unrolls nothing on the
#: pipelined scans of benchmarks/pipeline_programs.py, hence the check on hlopt's side and this flag.
LOOP_DOUBLE_BUFFERING_FLAG = "--xla_gpu_enable_while_loop_double_buffering=true"
#: Flags by which a caller chooses XLA's loop unrolling itself (then hlopt adds nothing).
_UNROLLING_FLAGS = ("xla_gpu_enable_while_loop_double_buffering", "xla_gpu_enable_while_loop_unrolling")
#: Step 3: hlopt's passes after XLA (async-collective-creator converts what XLA left synchronous).
AFTER_XLA = expanded_pipeline("xla-gpu-after")

#: fusion_backend_config kinds that are not XLA's generic emitters: library calls and custom fusions.
_LIBRARY_FUSION_PREFIXES = ("__triton", "__cudnn", "__custom", "cublas", "custom", "dynamic_address",
                            "dynamic-slice", "__dynamic")


def _fusion_backend_kind(fusion: Instruction) -> str:
    return str(fusion.backend_config_value("fusion_backend_config", "kind") or "")


def is_library_fusion(fusion: Instruction) -> bool:
    """A Triton, cuDNN or custom fusion (or any kCustom one): left as XLA made it."""
    return str(fusion.get("kind")) == "kCustom" or _fusion_backend_kind(fusion).startswith(_LIBRARY_FUSION_PREFIXES)


def _custom_fusion_name(fusion: Instruction) -> str:
    fusion_cfg = fusion.backend_config_value("fusion_backend_config") or {}
    return str((fusion_cfg.get("custom_fusion_config") or {}).get("name", ""))


def is_unfused_wrapper(fusion: Instruction) -> bool:
    """A fusion step 2 made around ops XLA's generic fusion (switched off) would have fused: a wrapped single
    op, or a `dynamic_slice_fusion` custom fusion (XLA's dynamic-slice fusion rewriter wraps a bare
    dynamic-slice or dynamic-update-slice and its copy; in XLA's own compile the slice is fused into its
    consumer before that rewriter runs)."""
    if fusion.opcode != "fusion":
        return False
    if _custom_fusion_name(fusion) == "dynamic_slice_fusion":
        return True
    return is_wrapped_single_op(fusion)


def is_wrapped_single_op(fusion: Instruction) -> bool:
    """A fusion XLA's fusion wrapper made around one op (kLoop/kInput, one non-parameter instruction)."""
    if fusion.opcode != "fusion" or is_library_fusion(fusion):
        return False
    if str(fusion.get("kind")) not in ("kLoop", "kInput"):
        return False
    body = fusion.attrs["calls"]
    return sum(1 for i in body.instructions if i.opcode != "parameter") == 1


def unwrap_single_ops(module: Module) -> int:
    """Take apart, in place, the fusions step 2 made around ops its generic fusion would have fused
    (`is_unfused_wrapper`); how many. Computations only they called go."""
    count = 0
    for comp in list(module.computations):
        for inst in list(comp.instructions):
            if inst.parent is comp and is_unfused_wrapper(inst):
                inline_fusion(inst)
                count += 1
    if count:
        remove_unreachable_computations(module)
    return count


def drop_control_dependencies(module: Module) -> int:
    """Remove every control dependency, in place; how many edges there were. Step 2's module carries
    the ones XLA's copy insertion and scheduler added for its own order; they would block fusion (no
    fusion crosses a control edge), and the backend-only compile runs copy insertion again on ours."""
    count = 0
    for inst in module.instructions():
        count += len(inst.control_predecessors)
    for inst in module.instructions():
        inst.drop_control_dependencies()
    return count


#: Deprecated: step 3 ran a pipeline starting with this pass in up to four variants. With one rule for Triton
#: fusions (`passes/fusion/triton_tiling.py`, priority-fusion's queue growing them as XLA's PriorityFusion does), step 3
#: runs its pipeline once.
OPTIONAL_TRITON_PASS = "triton-softmax-priority-fusion,"
#: priority-fusion growing XLA's Triton fusions in its own queue (XLA's triton softmax priority fusion).
TRITON_PRIORITY_FUSION = "priority-fusion{triton_softmax_priority_fusion=true},"


def triton_variants(pipeline: str) -> list[str]:
    """Deprecated: the step-3 pipelines tried for `pipeline`, now `[pipeline]` (step 3 runs once: Triton fusions
    grow by one rule, decided by XLA's indexing cost model, `AFTER_XLA`)."""
    return [pipeline]


def dynamic_launches(module: Module) -> int:
    """Kernel launches per execution: every launching instruction times the trips of its computation."""
    return sum(times * sum(1 for inst in comp.instructions if launch_kind(inst) is not None)
               for comp, times in executed_computations(module))


def _map_passes(elements: list[Pass | Fix], change: Callable[[Pass], Pass]) -> list[Pass | Fix]:
    """`elements` with `change` applied to every pass, inside `fix(...)` groups too."""
    from hlopt.passes.framework.pipeline import Fix

    return [replace(e, passes=_map_passes(e.passes, change)) if isinstance(e, Fix) else change(e) for e in elements]


def after_xla_passes(after: str, target: str, collective_model: str | None = None) -> list[Pass | Fix]:
    """Step 3's passes from the spec `after`: each pass that takes a `device` and where the spec left it at its
    default times `target`, the GPU compiled for; the latency-hiding scheduler's analytical estimator takes
    `collective_model` instead where given (a registered cost model: `_xla_collective_model`)."""
    from hlopt.passes.framework.pipeline import parse_pipeline

    def retarget(element: Pass) -> Pass:
        if not is_dataclass(element):
            return element
        default = {f.name: f.default for f in fields(element)}.get("device", _NO_DEVICE)
        if default is _NO_DEVICE or element.device != default:
            return element
        scheduler = element.name == "latency-hiding-scheduler" and getattr(element, "estimator", "") == "analytical"
        return replace(element, device=collective_model if scheduler and collective_model else target)

    return _map_passes(parse_pipeline(after), retarget)


_NO_DEVICE = object()
_MODEL_NUMBERS = itertools.count()


@contextmanager
def _xla_collective_model(target: str, xla_default: DriverResult) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """(the name of a cost model registered while inside, what it did): `target`'s model with the async
    collectives XLA's default compile estimated timed by XLA's estimates (`WithXlaCollectiveLatencies`), for step
    3's scheduler; (None, ...) when XLA estimated none. The figures are filled in as the scheduler runs:
    `collectives` (keys XLA estimated), `answered` (collectives the scheduler asked about and got XLA's figure
    for)."""
    from hlopt.cost_model.model import get_cost_model
    from hlopt.cost_model.profile import register_cost_model, unregister_cost_model
    from hlopt.cost_model.xla_estimates import WithXlaCollectiveLatencies, xla_collective_latencies

    latencies = xla_collective_latencies(xla_default.final)
    figures: dict[str, Any] = {"collectives": len(latencies), "answered": 0}
    if not latencies:
        yield None, figures
        return
    models: list[WithXlaCollectiveLatencies] = []

    def factory() -> WithXlaCollectiveLatencies:
        models.append(WithXlaCollectiveLatencies(get_cost_model(target), latencies))
        return models[-1]

    name = f"{target}+xla-collective-estimates-{next(_MODEL_NUMBERS)}"  # one per compile: compiles may overlap
    register_cost_model(name, factory)
    try:
        yield name, figures
    finally:
        unregister_cost_model(name)
        figures["answered"] = sum(m.hits for m in models)


def prepare_after_xla(text: str | Module, pipeline: str | list[Pass | Fix] = AFTER_XLA) -> tuple[Module, dict[str, Any]]:
    """Step 3 on XLA's module (text, or a Module): unwrap, hlopt's pipeline (a spec, or its passes:
    `after_xla_passes`; once), scheduled; (the module to hand to XLA's backend, what happened)."""
    from hlopt.hlo.parser import parse
    from hlopt.passes.framework.pipeline import Pipeline, run_pipeline

    module = parse(text, filename="<XLA:GPU module, generic fusion off>") if isinstance(text, str) else text
    module.is_scheduled = False
    unwrapped = unwrap_single_ops(module)
    dropped = drop_control_dependencies(module)
    started = time.perf_counter()
    info: dict[str, Any] = {"unwrapped_single_op_fusions": unwrapped, "control_dependencies_dropped": dropped,
                            "passes": pipeline if isinstance(pipeline, str) else Pipeline(list(pipeline)).spec}
    result = run_pipeline(module, pipeline)
    module.is_scheduled = True
    info["changed"] = sorted({r.name.split("{")[0] for r in result.records if r.changed})  # pass names
    info["seconds"] = round(time.perf_counter() - started, 3)
    return module, info


# ----------------------------------------------------------------------------- fidelity


def _launch_names(comp: Computation) -> list[str]:
    return [i.name for i in comp.instructions if launch_kind(i) is not None]


def _role(inst: Instruction) -> str | None:
    kind = launch_kind(inst)
    if kind == "fusion":
        return "library" if is_library_fusion(inst) else "fusion"
    if kind == "custom-call":
        return "library"
    return kind if kind == "collective" else None


def _kept_order(ours: list[str], final: list[str]) -> list[str]:
    """Longest common subsequence of two name lists (the instructions whose relative order was kept)."""
    n, m = len(ours), len(final)
    if n * m > 4_000_000:  # too big for the table: compare positions of the common names only
        common = set(ours) & set(final)
        return [x for x in ours if x in common]
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = table[i + 1][j + 1] + 1 if ours[i] == final[j] else max(table[i + 1][j], table[i][j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if ours[i] == final[j]:
            out.append(ours[i])
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def _backend_step(inst: Instruction | None, name: str) -> str:
    """The backend step that most likely added or moved an instruction (by what it is)."""
    if inst is None:
        return "unknown"
    if inst.opcode == "copy" or name.startswith("copy"):
        return "copy-insertion"
    if inst.opcode == "fusion" and name.startswith("wrapped_"):
        return "fusion-wrapper"
    if launch_kind(inst) == "collective" or inst.opcode.endswith("-done"):
        if inst.backend_config_value("collective_backend_config", "is_sync"):
            return "async-to-sync-converter"
        return "collective scheduling (backend)"
    return "unattributed"


def _wrapped_op_key(fusion: Instruction, names: dict[str, str]) -> tuple | None:
    """(opcode, operand names) of the op a single-op fusion wraps, in the caller's names."""
    root = fusion.attrs["calls"].root
    if any(o.opcode != "parameter" for o in root.operands):
        return None
    operands = [fusion.operand(o.attrs["parameter_number"]).name for o in root.operands]
    return _op_key(root, tuple(names.get(n, n) for n in operands))


_NOT_IN_KEY = frozenset({"metadata", "backend_config", "frontend_attributes", "sharding"})


def _op_key(inst: Instruction, operands: tuple[str, ...]) -> tuple:
    """What identifies an op apart from its name: opcode, operands, shape, attributes."""
    attrs = tuple(sorted((k, str(v)) for k, v in inst.attrs.items() if k not in _NOT_IN_KEY))
    return inst.opcode, operands, str(inst.shape), attrs


def _forwarded(inst: Instruction) -> Instruction:
    """The value a get-tuple-element of a tuple forwards (through any chain of them): copy insertion re-adds a
    copy behind tuples of its own, reading the same value under another name."""
    while inst.opcode == "get-tuple-element" and inst.operand(0).opcode == "tuple":
        inst = inst.operand(0).operand(int(inst.attrs["index"]))
    return inst


def _renamed_by_backend(comp: Computation, final_comp: Computation) -> dict[str, tuple[str, str]]:
    """final name -> (our name, backend step) of each op of ours left unfused that the backend re-emitted
    under a new name: wrapped in a fusion of its own (fusion-wrapper), or a copy removed and added again
    (copy-insertion). Matched by opcode, operands, shape and attributes."""
    ours = {i.name for i in comp.instructions}
    bare: dict[tuple, list[str]] = {}
    for i in comp.instructions:
        if launch_kind(i) == "other":
            bare.setdefault(_op_key(i, tuple(_forwarded(o).name for o in i.operands)), []).append(i.name)
    out: dict[str, tuple[str, str]] = {}
    names: dict[str, str] = {}
    for inst in final_comp.instructions:
        if inst.name in ours:
            continue
        if inst.opcode == "fusion" and is_wrapped_single_op(inst):
            key, step = _wrapped_op_key(inst, names), "fusion-wrapper"
        elif inst.opcode == "copy":
            operands = tuple(names.get(n, n) for n in (_forwarded(o).name for o in inst.operands))
            key, step = _op_key(inst, operands), "copy-insertion"
        else:
            continue
        if bare.get(key):  # identical ops (same operands and attributes) match in order
            names[inst.name] = bare[key].pop(0)
            out[inst.name] = (names[inst.name], step)
    return out


def _moved(names: list[str], final_names: list[str], kept: set[str], final_by_name: dict[str, Instruction],
           recopied: set[str]) -> list[dict[str, str]]:
    """The launches of ours (in `names`' order) that the final module runs out of that order, each with the
    backend step that moved it. A copy that copy-insertion removed and added again (`recopied`) sits where
    copy-insertion put it: the launches around it are compared without it, and it counts as moved by
    copy-insertion when the order holds only without it."""
    ours_set = set(names)
    rest = [n for n in names if n in kept and n not in recopied]
    rest_order = set(_kept_order(rest, [n for n in final_names if n in ours_set and n not in recopied]))
    moved = [{"instruction": n, "step": _backend_step(final_by_name.get(n), n)} for n in rest if n not in rest_order]
    copies = [n for n in names if n in kept and n in recopied]
    if copies:
        full = set(_kept_order([n for n in names if n in kept], [n for n in final_names if n in ours_set]))
        if len(full) < len(rest_order) + len(copies):
            out_of_place = [n for n in copies if n not in full] or copies
            moved += [{"instruction": n, "step": "copy-insertion"} for n in out_of_place]
    return moved


def fidelity(ours: Module, final: Module) -> dict[str, Any]:
    """Per computation of ours: the fusions, library calls and collectives the final module kept, and
    every launch whose order the backend changed (with the backend step that most likely did it)."""
    final_comps = {c.name: c for c in final.computations}
    rows, totals = [], {"launches": 0, "kept": 0, "moved": 0, "moved_unattributed": 0}
    for comp, _ in executed_computations(ours):
        names = _launch_names(comp)
        if not names:
            continue
        other = final_comps.get(comp.name)
        renamed = _renamed_by_backend(comp, other) if other is not None else {}
        as_ours = {final_name: ours_name for final_name, (ours_name, _) in renamed.items()}
        final_names = [as_ours.get(n, n) for n in _launch_names(other)] if other is not None else []
        final_by_name = {as_ours.get(i.name, i.name): i for i in other.instructions} if other is not None else {}
        kept_set = set(final_names)
        row: dict[str, Any] = {"computation": comp.name, "found": other is not None}
        for role in ("fusion", "library", "collective"):
            mine = [i.name for i in comp.instructions if _role(i) == role]
            row[role] = {"ours": len(mine), "kept": sum(n in kept_set for n in mine),
                         "lost": [n for n in mine if n not in kept_set]}
        moved = _moved(names, final_names, kept_set, final_by_name,
                       {ours_name for ours_name, step in renamed.values() if step == "copy-insertion"})
        added = [{"instruction": n, "step": _backend_step(final_by_name.get(n), n)}
                 for n in final_names if n not in set(names)]
        row.update(launches=len(names), launches_kept=sum(n in kept_set for n in names), moved=moved, added=added,
                   lost=[n for n in names if n not in kept_set],
                   renamed_by_backend=[{"instruction": ours_name, "as": final_name, "step": step}
                                       for final_name, (ours_name, step) in renamed.items()])
        rows.append(row)
        totals["launches"] += len(names)
        totals["kept"] += row["launches_kept"]
        totals["moved"] += len(moved)
        totals["moved_unattributed"] += sum(m["step"] == "unattributed" for m in moved)
    totals["launches_kept_fraction"] = round(totals["kept"] / totals["launches"], 4) if totals["launches"] else 1.0
    totals["order_kept"] = totals["moved_unattributed"] == 0
    return {"computations": rows, "summary": totals}


# ----------------------------------------------------------------------------- the whole path


@dataclass
class ReemitResult:
    """hlopt + XLA:GPU for one module, next to XLA:GPU alone (all deviceless)."""

    target: str
    devices: int
    hlopt_module: Module  # the scheduled module handed to XLA's backend
    final: DriverResult  # XLA's backend-only compile of it
    xla_default: DriverResult  # XLA's default compile of the same input
    report: dict[str, Any] = field(repr=False)
    xla_stage: DriverResult | None = field(default=None, repr=False)  # step 2's module (the input of step 3)

    @property
    def kept(self) -> str:
        """Which compile the guard kept: "hlopt" or "xla_default" (`report["guard"]`)."""
        return self.report.get("guard", {}).get("kept", "hlopt")

    @property
    def kept_result(self) -> DriverResult:
        """The compile to run: ours, or XLA's default one where the guard kept it."""
        return self.xla_default if self.kept == "xla_default" else self.final

    @property
    def hlopt_text(self) -> str:
        """The scheduled module handed to XLA's backend (is_scheduled=true)."""
        return self.hlopt_module.to_text()

    @property
    def final_text(self) -> str:
        """XLA's final module."""
        return self.final.final_text

    @property
    def executable(self) -> bytes:
        """The serialized executable (PJRT_Executable_Serialize)."""
        return self.final.executable

    @property
    def ratio(self) -> float | None:
        """Modeled time, ours over XLA's default compile (XLA's own estimates)."""
        return self.report["ratio"]

    # The fields `runtime.compile(target=...)` returned before (XLA's optimized module and its figures).
    @property
    def optimized(self) -> Module:
        """XLA's final module, parsed."""
        return self.final.final

    @property
    def optimized_text(self) -> str:
        """XLA's final module."""
        return self.final.final_text

    @property
    def fusion_count(self) -> int:
        """Fusions launched by the final module (library fusions included)."""
        return sum(c["fusion"] for c in self.report["ours"]["per_computation"])

    @property
    def kernel_launches(self) -> int:
        """Launches in the final module's text."""
        return self.report["ours"]["static_launches"]

    @property
    def fusion_exec_time_us(self) -> dict[str, float]:
        """XLA's default estimate summed over the final module's fusions (times trip counts)."""
        return {"default": self.report["ours"]["fusion_time_us"]}

    def summary(self) -> str:
        """One line."""
        ours, xla = self.report["ours"], self.report["xla_default"]
        ratio = f"{self.ratio:.2f}x" if self.ratio is not None else "n/a"
        kept = self.report["fidelity"]["summary"]
        return (f"{self.hlopt_module.name} on {self.target} x{self.devices}: hlopt + XLA:GPU "
                f"{ours['modeled_us']:.1f} us ({ours['dynamic_launches']} launches) vs XLA:GPU alone "
                f"{xla['modeled_us']:.1f} us ({xla['dynamic_launches']}): {ratio}; launches kept "
                f"{kept['kept']}/{kept['launches']}, order kept: {kept['order_kept']}\n{self.guard_line()}")

    def guard_line(self) -> str:
        """One line: which executable was kept, on both of XLA's estimates."""
        g = self.report.get("guard", {})
        ours, xla = self.report["ours"]["modeled_us"], self.report["xla_default"]["modeled_us"]
        estimates = f"XLA's estimates: hlopt {ours:.1f} us, XLA default {xla:.1f} us"
        if not g.get("enabled", True):
            return f"guard off (--no-guard): kept hlopt's executable ({estimates})"
        which = "hlopt's" if self.kept == "hlopt" else "XLA's default"
        return f"guard: kept {which} executable ({estimates})"


def loops_with_collectives(module: Module) -> list[Instruction]:
    """The while loops of `module` whose body (or a computation it calls) holds a collective: after step 1,
    the loops whose collectives the collective-pipeliner moved into the neighbouring iteration, and those it
    left in place."""
    from hlopt.hlo.opcodes import COLLECTIVES

    def holds_collective(comp: Computation, seen: set[Computation]) -> bool:
        if comp in seen:
            return False
        seen.add(comp)
        return any(i.opcode in COLLECTIVES or i.opcode.removesuffix("-start") in COLLECTIVES
                   or any(holds_collective(c, seen) for c in i.called_computations) for i in comp.instructions)

    return [inst for inst in module.instructions()
            if inst.opcode == "while" and holds_collective(inst.attrs["body"], set())]


def loop_double_buffering_flags(module: Module, xla_flags: str = "") -> str:
    """`xla_flags` for steps 2 and 4: with XLA's double-buffer loop unrolling added where a loop of `module` (step
    1's output) holds a collective and the flags do not choose XLA's unrolling themselves.

    Why: a pipelined loop carries the next iteration's collective result (the all-gathered weights of the next
    layer) in its state while the current one is still read, so XLA's copy insertion copies every carried
    buffer once per iteration; unrolled by two, the two copies of the body alternate the buffers and need no
    copy, and hlopt's fusion in step 3 merges the two iterations' stores into one stacked buffer (one
    dynamic-update-slice fusion for two). On the scanned FSDP step (d=512, 4 layers, 8 devices) that is 1183.0
    -> 1071.9 us by XLA's estimates; docs/benchmarks.md, "Collective pipelining against XLA:GPU"."""
    if any(name in xla_flags for name in _UNROLLING_FLAGS) or not loops_with_collectives(module):
        return xla_flags
    return f"{xla_flags} {LOOP_DOUBLE_BUFFERING_FLAG}".strip()


def _before_xla(module: Module, pipeline: str | None) -> Module:
    from hlopt.passes.framework.pipeline import run_pipeline

    out = module.clone()
    if pipeline:
        run_pipeline(out, pipeline)
    return out


def compile_for_gpu(module: Module | str, target: str = "h100", devices: int | None = None,
                    before: str | None = BEFORE_XLA, after: str = AFTER_XLA, xla_flags: str = "",
                    timeout: float = 600, guard: bool = True,
                    double_buffering: bool | Literal["best"] = "best") -> ReemitResult:
    """The XLA:GPU path (module docstring) for `devices` GPUs of `target` (default: as many as the module
    spans, `runtime.execution_mode`); raises GpuCompilerMissing, ValueError for a module XLA:GPU cannot take
    (`check_gpu_input`), or RuntimeError naming the failed step. XLA's default compile of the same input runs
    first: step 3's scheduler takes XLA's estimates of its collectives (`report["hlopt_after_xla"]
    ["xla_collective_estimates"]`). `guard`: where XLA's estimates rate XLA's
    default compile faster than ours, it is the one kept (`ReemitResult.kept`, `report["guard"]`); both were
    compiled anyway (the report compares them), so the guard costs no compile. `double_buffering`: where a loop
    of step 1's module holds a collective, steps 2 and 4 unroll the loops by two (`loop_double_buffering_flags`):
    True always, False never, "best" (the default) when XLA's estimates rate the result faster than steps 2-4
    without it and XLA's backend keeps as many of our launches (both are compiled: steps 2-4 run twice on such
    modules; `report["double_buffering"]`,
    `report["xla_flags"]`)."""
    from hlopt.hlo.parser import parse
    from hlopt.passes.framework.pipeline import parse_pipeline
    from hlopt.runtime import execution_mode

    for spec in (before, after):  # a bad pipeline fails before any XLA compile (PipelineError, a ValueError)
        if spec:
            parse_pipeline(spec)
    module = parse(module) if isinstance(module, str) else module
    check_gpu_input(module)
    if devices is None:
        _, replicas, partitions = execution_mode(module)
        devices = replicas * partitions
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    prepared = _before_xla(module, before)
    seconds["hlopt_before_xla"] = time.perf_counter() - started
    text = prepared.to_text()
    # XLA's default compile first: the guard and the report compare with it, and step 3's scheduler times the
    # collectives XLA estimated there as XLA does
    xla_default = _step("XLA:GPU default compile", run_driver, module.to_text(), target, devices, "", xla_flags,
                        False, timeout)
    seconds.update(xla_default=xla_default.compile_seconds)
    with_db = loop_double_buffering_flags(prepared, xla_flags) if double_buffering else xla_flags
    tried = [with_db] if double_buffering is True or with_db == xla_flags else [xla_flags, with_db]
    with _xla_collective_model(target, xla_default) as (collective_model, collective_figures):
        after_passes = after_xla_passes(after, target, collective_model)
        runs = [_steps_2_to_4(text, target, devices, flags, after_passes, timeout) for flags in tried]
    rated = [estimate(run[3].final, target).modeled_us for run in runs]
    kept = [fidelity(run[1], run[3].final)["summary"]["launches_kept_fraction"] for run in runs]
    # the executable must stay ours: a run whose backend lost launches the other kept is not a candidate
    candidates = [k for k in range(len(runs)) if kept[k] >= max(kept)]
    best = min(candidates, key=rated.__getitem__)  # the first of equals: without double buffering
    xla_stage, ours, after_info, final, step_seconds = runs[best]
    ours_flags = tried[best]
    seconds.update(step_seconds)
    if "triton_fallback" in after_info:  # what ran: the spec less its Triton growth
        from hlopt.passes.framework.pipeline import Pipeline

        after_info["passes"] = Pipeline(without_triton_growth(after)).spec
    else:
        after_info["passes"] = after
    after_info.update(device=target, xla_collective_estimates=collective_figures)
    report = build_report(ours, final, xla_default, target, after_info, seconds)
    report["xla_stage_fusions_disabled"] = XLA_STAGE_DISABLED
    report["xla_flags"] = ours_flags
    report["double_buffering"] = {"tried": [f != xla_flags for f in tried], "kept": ours_flags != xla_flags,
                                  "modeled_us": [round(r, 3) for r in rated], "launches_kept_fraction": kept}
    report["guard"] = guard_decision(report, guard)
    return ReemitResult(target, devices, ours, final, xla_default, report, xla_stage)


def _steps_2_to_4(text: str, target: str, devices: int, flags: str, after: str | list[Pass | Fix],
                  timeout: float) -> tuple[DriverResult, Module, dict[str, Any], DriverResult, dict[str, float]]:
    """Steps 2, 3 and 4 of the path on step 1's text under `flags`: XLA's stage, our module, step 3's report,
    XLA's backend compile of it, and the seconds each took. Where XLA's backend refuses a Triton fusion step 3
    grew (its tiling analysis and hlopt's disagree: `TRITON_REFUSALS`), step 3 runs again with priority-fusion
    growing none (XLA's own Triton fusions stay) and step 4 once more; `after_info["triton_fallback"]` says why."""
    xla_stage = _step("2 (XLA:GPU passes, generic fusion off)", run_driver, text, target, devices,
                      XLA_STAGE_DISABLED, flags, False, timeout)
    started = time.perf_counter()
    ours, after_info = _step("3 (hlopt after XLA)", prepare_after_xla, xla_stage.final_text, after)
    after_seconds = time.perf_counter() - started
    try:
        final = _step("4 (XLA:GPU backend only)", run_driver, ours.to_text(), target, devices, "", flags, True, timeout)
    except RuntimeError as e:
        if not any(marker in str(e) for marker in TRITON_REFUSALS):
            raise
        started = time.perf_counter()
        ours, after_info = _step("3 (hlopt after XLA, no Triton fusions grown)", prepare_after_xla,
                                 xla_stage.final_text, without_triton_growth(after))
        after_seconds += time.perf_counter() - started
        after_info["triton_fallback"] = str(e).splitlines()[0][:400]
        final = _step("4 (XLA:GPU backend only)", run_driver, ours.to_text(), target, devices, "", flags, True, timeout)
    return xla_stage, ours, after_info, final, {"hlopt_after_xla": after_seconds,
                                                "xla_stage": xla_stage.compile_seconds,
                                                "xla_backend": final.compile_seconds}


#: What XLA:GPU's backend says when it cannot emit a block-level Triton fusion it was handed.
TRITON_REFUSALS = ("CreateTritonModule", "symbolic tile", "SymbolicTileAnalysis", "Triton")


def without_triton_growth(after: str | list[Pass | Fix]) -> list[Pass | Fix]:
    """Step 3's passes with priority-fusion growing no block-level Triton fusion (its three Triton options off)."""
    from hlopt.passes.framework.pipeline import parse_pipeline

    def plain(element: Pass) -> Pass:
        if element.name != "priority-fusion":
            return element
        return replace(element, triton_softmax_priority_fusion=False, triton_heroless_priority_fusion=False,
                       triton_multi_output_fusion=False)

    return _map_passes(parse_pipeline(after) if isinstance(after, str) else after, plain)


def guard_decision(report: dict[str, Any], enabled: bool = True) -> dict[str, Any]:
    """report.json's "guard": which compile is kept ("hlopt", or "xla_default" where XLA's estimates rate it
    faster, unless the guard is off) and both estimates (us)."""
    ours, xla = report["ours"]["modeled_us"], report["xla_default"]["modeled_us"]
    kept = "xla_default" if enabled and xla < ours else "hlopt"
    return {"enabled": enabled, "kept": kept, "hlopt_us": ours, "xla_default_us": xla}


#: backend_config fields only XLA:CPU writes (its optimized modules carry them); XLA:GPU aborts on them.
CPU_ONLY_BACKEND_CONFIG = ("outer_dimension_partitions", "__ynn_fusion", "llvm_kernel_options")


def check_gpu_input(module: Module) -> None:
    """ValueError with one line when the module is one XLA:GPU cannot take: an XLA:CPU optimized module (its
    backend_config fields are XLA:CPU's), or one whose large constants were printed elided (`constant({...})`:
    XLA's parser would fill them with made-up values; `hlo.literal.ElidedLiteralError`)."""
    check_no_elided_constants(module, "compile")
    for inst in module.instructions():
        raw = inst.attrs.get("backend_config")
        text = str(raw) if raw is not None else ""
        for key in CPU_ONLY_BACKEND_CONFIG:
            if key in text:
                raise ValueError(f"module {module.name} was optimized by XLA:CPU (instruction %{inst.name} has "
                                 f"XLA:CPU's backend_config field {key!r}, which XLA:GPU cannot take): compile the "
                                 "module before optimization (jax's lowered HLO, a dump's "
                                 "*.before_optimizations.txt)")


def _step(what: str, fn, *args):
    from hlopt.runtime.xla_gpu_path.xla_gpu import GpuCompilerMissing

    try:
        return fn(*args)
    except GpuCompilerMissing:
        raise
    except Exception as e:  # noqa: BLE001 - every failure is reported with its step
        raise RuntimeError(f"step {what} failed: {type(e).__name__}: {e}") from e


def build_report(ours: Module, final: DriverResult, xla_default: DriverResult, target: str,
                 after_info: dict[str, Any] | None = None, seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """report.json: XLA's estimates for ours and for its default compile, their ratio, the fidelity report."""
    est_ours: XlaEstimate = estimate(final.final, target)
    est_xla: XlaEstimate = estimate(xla_default.final, target)
    ratio = est_ours.modeled_us / est_xla.modeled_us if est_xla.modeled_us else None
    return {"target": target, "devices": final.devices,
            "ours": est_ours.as_dict(), "xla_default": est_xla.as_dict(),
            "ratio": None if ratio is None else round(ratio, 4),
            "fidelity": fidelity(ours, final.final),
            "hlopt_after_xla": after_info or {},
            "compile_seconds": {k: round(v, 3) for k, v in (seconds or {}).items()},
            "warnings": [*final.warnings, *xla_default.warnings],
            "memory": {"ours": final.memory, "xla_default": xla_default.memory}}
