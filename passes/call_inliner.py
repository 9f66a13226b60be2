"""call-inliner: replace `call` instructions by the body of the computation they call (XLA's CallInliner).

Before:                                            After:
    %f (a: f32[]) -> f32[] {                           ENTRY %main (p: f32[]) -> f32[] {
      %a = f32[] parameter(0)                            %p = f32[] parameter(0)
      ROOT %n = f32[] negate(%a), metadata={op_name="n"} ROOT %n = f32[] negate(%p), metadata={op_name="g/n"}
    }                                                  }
    ENTRY %main (p: f32[]) -> f32[] {
      %p = f32[] parameter(0)
      ROOT %c = f32[] call(%p), to_apply=%f, metadata={op_name="g"}
    }

XLA's rules, in order:
- callees are inlined before their callers (calls left inside a callee are inlined with it);
- left alone: calls with a backend_config, calls inside async computations (`calls=` of async-start),
  calls to shard_map bodies (`shmap_body`, `xla.sdy.manual_computation_body` in the callee's name)
  when the module uses Shardy, composite calls whose `composite.name` is in `composites_to_preserve`,
  calls whose frontend attribute `inlineable` is not "true" (unless an override policy says to ignore
  it), and with `single_call_site` calls to computations with more than one call site;
- a composite call loses its `composite.*` frontend attributes before inlining; its MUST_FUSE /
  MAXIMAL_FUSE / mosaic_fusion_group attribute goes onto every fusible inlined instruction;
- the callee's control edges are cloned, the call's control predecessors precede every inlined
  instruction and its control successors follow the inlined root;
- the call's op_name is prefixed (`call/inst`) onto every inlined instruction and, recursively, into
  the computations of inlined while/conditional/async ops (not into reduce/sort/scatter/... ones),
  unless the result would reach 1024 characters;
- the inlined root takes the call's op_name metadata, frontend attributes and sharding when it has none;
- in a scheduled module the callee's sequence takes the call's place in the caller's sequence;
- `uniquify_channel_ids` gives every channel instruction of a computation that received inlined code
  a fresh channel id; afterwards dead code and uncalled computations are removed (HloDCE).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hlopt.hlo.attributes import Metadata
from hlopt.hlo.clone import clone_computation
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.dce import DeadCodeElimination, SideEffects
from hlopt.passes.framework.base import ModulePass, module_opcodes
from hlopt.passes.framework.registry import register

__all__ = ["CallInliner", "InlinePolicy", "inline_call", "prefix_op_name", "MAX_OP_NAME_SIZE", "MAIN_THREAD"]

MAX_OP_NAME_SIZE = 1024
MAIN_THREAD = "main"
_COMPOSITE_KEYS = ("composite.name", "composite.attributes", "composite.version")
_CONTROL_FLOW = frozenset({"while", "conditional", "async-start", "async-update", "async-done"})
_ASYNC = frozenset({"async-start", "async-update", "async-done"})
_SHMAP_BODIES = ("shmap_body", "xla.sdy.manual_computation_body")
_NOT_FUSIBLE = frozenset({"domain", "parameter", "while", "conditional", "call"})
_ALWAYS_FUSIBLE = frozenset({"fusion", "map", "reduce", "reduce-window"})


class InlinePolicy(enum.Enum):
    """What an override policy decides for one call (XLA's InlineOverridePolicy)."""

    ALLOW = "allow"  # the usual rules decide
    PROHIBIT = "prohibit"  # never inline this call
    IGNORE_FRONTEND_ATTRIBUTES = "ignore-frontend-attributes"  # inline even if inlineable != "true"


OverridePolicy = Callable[[Instruction], "InlinePolicy | bool"]


# ----------------------------------------------------------------------------- op_name metadata

def prefix_op_name(inst: Instruction, prefix: str, seen: set[Instruction] | None = None) -> None:
    """Prefix `prefix/` onto inst's op_name, recursing into while/conditional/async callees (XLA's rule)."""
    if not prefix:
        return
    seen = set() if seen is None else seen
    if inst.opcode in _CONTROL_FLOW:
        for comp in inst.called_computations:
            for inner in comp.instructions:
                if inner not in seen:  # a computation shared by two callers gets the prefix once
                    seen.add(inner)
                    prefix_op_name(inner, prefix, seen)
    metadata = inst.metadata.copy() if inst.metadata is not None else Metadata()
    current = metadata.op_name
    if len(prefix) + len(current) < MAX_OP_NAME_SIZE:
        metadata["op_name"] = f"{prefix}/{current}" if current else prefix
        inst.metadata = metadata


# ----------------------------------------------------------------------------- inlining one call

def _fusion_hints(call: Instruction) -> list[tuple[str, Any]]:
    fa = call.frontend_attributes
    hints = [(k, fa[k]) for k in ("MUST_FUSE", "MAXIMAL_FUSE") if k in fa][:1]
    if "mosaic_fusion_group" in fa:
        hints.append(("mosaic_fusion_group", fa["mosaic_fusion_group"]))
    return hints


def _is_fusible(inst: Instruction, effects: SideEffects) -> bool:
    """XLA's HloInstruction::IsFusible."""
    if inst.opcode in _NOT_FUSIBLE:
        return False
    if inst.opcode in _ALWAYS_FUSIBLE:
        return True
    if inst.opcode == "rng":
        return inst.user_count <= 1
    return not effects(inst)


def _strip_composite_attributes(call: Instruction) -> None:
    if call.attrs.get("is_composite") is True and call.frontend_attributes:
        fa = {k: v for k, v in call.frontend_attributes.items() if k not in _COMPOSITE_KEYS}
        if fa:
            call.attrs["frontend_attributes"] = fa
        else:
            call.attrs.pop("frontend_attributes", None)


def _clone_async_wrapped(clone: Instruction, wrapped: dict[Computation, Computation], module: Module) -> None:
    """Give an inlined async op its own copy of the wrapped computation (XLA clones it too)."""
    if clone.opcode not in _ASYNC:
        return
    for key in ("calls", "called_computations"):
        value = clone.attrs.get(key)
        comps = value if isinstance(value, list) else [value]
        for comp in comps:
            if isinstance(comp, Computation):
                if comp not in wrapped:
                    wrapped[comp] = clone_computation(module, comp)
                clone.replace_called_computation(comp, wrapped[comp])


def _relay_control_to_root(call: Instruction, root: Instruction, inlined: bool) -> None:
    """The call's control successors follow the inlined root (its predecessors already precede it)."""
    for succ in call.control_successors:
        if not inlined:  # root is one of the call's operands: keep the order through direct edges
            for pred in call.control_predecessors:
                pred.add_control_successor(succ)
        if succ is not root:
            root.add_control_successor(succ)


def inline_call(call: Instruction, effects: SideEffects | None = None) -> dict[Instruction, Instruction]:
    """Inline one call (XLA's CallInliner::Inline); returns callee instruction -> its replacement."""
    comp = call.parent
    module = comp.module
    effects = effects or SideEffects(module)
    callee: Computation = call.attrs["to_apply"]
    _strip_composite_attributes(call)
    hints = _fusion_hints(call)
    prefix = call.metadata.op_name if call.metadata is not None else ""
    mapping: dict[Instruction, Instruction] = {p: call.operand(p.attrs["parameter_number"]) for p in callee.parameters}
    wrapped: dict[Computation, Computation] = {}
    seen: set[Instruction] = set()
    for inst in callee.post_order():
        if inst.opcode == "parameter":
            continue
        clone = inst.clone(name=module.unique_name(inst.name), operands=[mapping[o] for o in inst.operands])
        clone.inline = inst.inline
        _clone_async_wrapped(clone, wrapped, module)
        if hints and _is_fusible(inst, effects):
            clone.attrs["frontend_attributes"] = {**dict(hints), **clone.frontend_attributes}
        prefix_op_name(clone, prefix, seen)
        mapping[inst] = comp.add(clone, before=call)
        for pred in inst.control_predecessors:
            mapping[pred].add_control_successor(clone)
        for pred in call.control_predecessors:
            pred.add_control_successor(clone)
    root = mapping[callee.root]
    _relay_control_to_root(call, root, inlined=callee.root.opcode != "parameter")
    call.drop_control_dependencies()
    comp.replace_instruction(call, root, remove_unused_operands=False)
    return mapping


# ----------------------------------------------------------------------------- the pass

def _async_computations(module: Module) -> set[Computation]:
    """Computations wrapped by async-start/update/done (`calls=`): calls in them stay (as XLA)."""
    return {c for i in module.instructions() if i.opcode in _ASYNC for c in i.called_computations}


def computation_threads(module: Module) -> dict[Computation, str]:
    """The execution thread of every computation (inherited from callers; async ops name theirs)."""
    threads: dict[Computation, str] = {}
    for comp in reversed(module.computations_post_order()):  # callers before callees
        own = comp.execution_thread or threads.get(comp) or MAIN_THREAD
        threads[comp] = own
        for inst in comp.instructions:
            thread = inst.attrs.get("async_execution_thread")
            for callee in inst.called_computations:
                if callee.execution_thread is None and callee not in threads:
                    threads[callee] = str(thread) if thread else own
    return threads


def uses_shardy(module: Module) -> bool:
    """Whether the module came from the Shardy partitioner (its frontend attributes say `xla.sdy.*`)."""
    fa = module.config.get("frontend_attributes") or {}
    return any(str(k).startswith("xla.sdy") for k in fa)


def _call_site_counts(module: Module) -> dict[Computation, int]:
    counts: dict[Computation, int] = {}
    for inst in module.instructions():
        for callee in inst.called_computations:
            counts[callee] = counts.get(callee, 0) + 1
    return counts


def _has_backend_config(inst: Instruction) -> bool:
    text = inst.backend_config
    return text is not None and text.strip() not in ("", '""')


def _next_channel_id(module: Module) -> int:
    ids = [i.attrs.get("channel_id") for i in module.instructions()]
    return max([x for x in ids if isinstance(x, int)], default=0) + 1


def _uniquify_channel_ids(comp: Computation, next_id: int) -> int:
    """Fresh channel ids for the channel instructions of `comp` (a done op keeps its start's id)."""
    for inst in comp.post_order():
        if inst.attrs.get("channel_id") is None or inst.attrs.get("is_host_transfer") is True:
            continue
        start = inst.operand(0) if inst.opcode.endswith("-done") and inst.operand_count else None
        if start is not None and start.attrs.get("channel_id") is not None:
            inst.attrs["channel_id"] = start.attrs["channel_id"]
        else:
            inst.attrs["channel_id"] = next_id
            next_id += 1
    return next_id


@register
@dataclass(frozen=True)
class CallInliner(ModulePass):
    """Inline `call` instructions, callees first (see the module docstring for XLA's rules).

    Options: `single_call_site` (only callees with one call site), `composites_to_preserve`
    (composite names left as calls; `a:b` in a spec), `uniquify_channel_ids`, `execution_threads`
    (only computations of these threads; "main" is the main thread; empty = all),
    `use_shardy_partitioner` (None: detected from the module's `xla.sdy.*` attributes), and, from
    Python, `override_policy(call) -> InlinePolicy | bool`.
    """

    name: ClassVar[str] = "call-inliner"
    single_call_site: bool = False
    composites_to_preserve: tuple[str, ...] = ()
    uniquify_channel_ids: bool = False
    execution_threads: tuple[str, ...] = ()
    use_shardy_partitioner: bool | None = None
    override_policy: OverridePolicy | None = field(default=None, compare=False, repr=False)

    def is_inlineable_call(self, inst: Instruction, async_comps: set[Computation], shardy: bool) -> bool:
        """XLA's IsInlineableCallOp: a call we may inline, frontend attributes aside."""
        callee = inst.attrs.get("to_apply")
        if inst.opcode != "call" or not isinstance(callee, Computation) or _has_backend_config(inst):
            return False
        if inst.parent in async_comps:
            return False
        if shardy and any(s in callee.name for s in _SHMAP_BODIES):
            return False
        composite = str(inst.frontend_attributes.get("composite.name", ""))
        return not (inst.attrs.get("is_composite") is True and composite in self.composites_to_preserve)

    def _policy(self, inst: Instruction) -> InlinePolicy:
        if self.override_policy is None:
            return InlinePolicy.ALLOW
        decision = self.override_policy(inst)
        if isinstance(decision, InlinePolicy):
            return decision
        return InlinePolicy.ALLOW if decision else InlinePolicy.PROHIBIT

    def should_inline(self, inst: Instruction, call_sites: dict[Computation, int], async_comps: set[Computation],
                      shardy: bool) -> bool:
        """XLA's ShouldInline: inlineable, allowed by the policy and frontend attributes, call sites."""
        if not self.is_inlineable_call(inst, async_comps, shardy):
            return False
        policy = self._policy(inst)
        if policy is InlinePolicy.PROHIBIT:
            return False
        if policy is not InlinePolicy.IGNORE_FRONTEND_ATTRIBUTES:
            inlineable = inst.frontend_attributes.get("inlineable")
            if inlineable is not None and str(inlineable) != "true":
                return False
        return not self.single_call_site or call_sites.get(inst.attrs["to_apply"], 0) == 1

    def _threads_included(self, module: Module) -> Callable[[Computation], bool]:
        if not self.execution_threads:
            return lambda comp: True
        threads = computation_threads(module)
        wanted = set(self.execution_threads)
        return lambda comp: threads.get(comp, MAIN_THREAD) in wanted

    def run(self, module: Module) -> bool:
        if "call" not in module_opcodes(module):
            return False  # no call to inline
        call_sites = _call_site_counts(module)
        async_comps = _async_computations(module)
        shardy = uses_shardy(module) if self.use_shardy_partitioner is None else self.use_shardy_partitioner
        included = self._threads_included(module)
        effects = SideEffects(module)
        next_channel = _next_channel_id(module) if self.uniquify_channel_ids else 0
        changed = False
        for comp in module.computations_post_order():
            if not included(comp):
                continue
            inlined = False
            for inst in comp.post_order():
                if inst.parent is comp and self.should_inline(inst, call_sites, async_comps, shardy):
                    inline_call(inst, effects)
                    inlined = True
            if inlined and self.uniquify_channel_ids:
                next_channel = _uniquify_channel_ids(comp, next_channel)
            changed |= inlined
        if changed:
            DeadCodeElimination().run(module)  # as XLA: drop what inlining left unused
        return changed
