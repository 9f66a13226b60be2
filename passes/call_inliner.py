"""call-inliner: replace `call` instructions by the body of the computation they call (XLA's CallInliner).

Before:                                        After:
    %f (a: f32[]) -> f32[] {                       ENTRY %main (p: f32[]) -> f32[] {
      %a = f32[] parameter(0)                        %p = f32[] parameter(0)
      ROOT %n = f32[] negate(%a)                     ROOT %n = f32[] negate(%p)
    }                                              }
    ENTRY %main (p: f32[]) -> f32[] {
      %p = f32[] parameter(0)
      ROOT %c = f32[] call(%p), to_apply=%f
    }

As XLA does: callees are inlined before their callers; the callee's control edges are cloned, the
call's control predecessors precede every inlined instruction and its control successors follow the
inlined root; `frontend_attributes={inlineable="false"}`, calls with a backend_config, calls inside async
computations and (Shardy) shard_map bodies stay; composite calls are inlined without their
`composite.*` attributes unless their name is in `composites_to_preserve`; the call's op_name is
prefixed ("call/inst") onto inlined instructions and into their while/conditional callees (not into
reduce/sort/scatter computations), unless the result would reach 1024 characters; in a scheduled
module the callee's sequence takes the call's place; computations left uncalled are removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlo.attributes import Metadata
from hlo.ir import Computation, Instruction, Module
from passes.base import ModulePass
from passes.dce import DeadCodeElimination
from passes.registry import register

__all__ = ["CallInliner", "inline_call", "MAX_OP_NAME_SIZE"]

MAX_OP_NAME_SIZE = 1024
_COMPOSITE_KEYS = ("composite.name", "composite.attributes", "composite.version")
_FUSION_HINTS = ("MUST_FUSE", "MAXIMAL_FUSE")
_CONTROL_FLOW = frozenset({"while", "conditional", "async-start", "async-update", "async-done"})
_SHMAP_BODIES = ("shmap_body", "xla.sdy.manual_computation_body")


def _update_op_name(inst: Instruction, prefix: str, seen: set[int]) -> None:
    """Prefix `prefix/` onto inst's op_name, and into the computations of control-flow callees."""
    if not prefix:
        return
    if inst.opcode in _CONTROL_FLOW:
        for comp in inst.called_computations:
            for inner in comp.instructions:
                if id(inner) not in seen:
                    seen.add(id(inner))
                    _update_op_name(inner, prefix, seen)
    metadata = inst.metadata.copy() if inst.metadata is not None else Metadata()
    current = metadata.op_name
    if len(prefix) + len(current) < MAX_OP_NAME_SIZE:
        metadata["op_name"] = f"{prefix}/{current}" if current else prefix
        inst.metadata = metadata


def _fusion_hint(call: Instruction) -> tuple[str, object] | None:
    fa = call.frontend_attributes
    for key in _FUSION_HINTS:
        if key in fa:
            return key, fa[key]
    return None


def inline_call(call: Instruction) -> dict[Instruction, Instruction]:
    """Inline one call; returns the map callee instruction -> clone (parameters map to operands)."""
    comp = call.parent
    module = comp.module
    callee: Computation = call.attrs["to_apply"]
    if call.attrs.get("is_composite") is True:
        fa = {k: v for k, v in call.frontend_attributes.items() if k not in _COMPOSITE_KEYS}
        call.attrs["frontend_attributes"] = fa
    hint = _fusion_hint(call)
    prefix = call.metadata.op_name if call.metadata is not None else ""
    mapping: dict[Instruction, Instruction] = {}
    for p in callee.parameters:
        mapping[p] = call.operand(p.attrs["parameter_number"])
    seen: set[int] = set()
    for inst in callee.instructions:
        if inst.opcode == "parameter":
            continue
        clone = inst.clone(name=module.unique_name(inst.name), operands=[mapping[o] for o in inst.operands])
        clone.inline = inst.inline
        if hint is not None and clone.opcode not in ("parameter", "tuple", "get-tuple-element"):
            fa = dict(clone.frontend_attributes)
            fa.setdefault(hint[0], hint[1])
            clone.attrs["frontend_attributes"] = fa
        _update_op_name(clone, prefix, seen)
        comp.add(clone, before=call)
        mapping[inst] = clone
        for pred in inst.control_predecessors:
            mapping[pred].add_control_successor(clone)
        for pred in call.control_predecessors:
            pred.add_control_successor(clone)
    new_root = mapping[callee.root]
    for succ in call.control_successors:
        new_root.add_control_successor(succ)
    call.drop_control_dependencies()
    call.replace_all_uses_with(new_root)
    if comp.root is call:
        comp.root = new_root
    comp.remove(call)
    return mapping


def _async_computations(module: Module) -> set[Computation]:
    out: set[Computation] = set()
    for inst in module.instructions():
        if inst.opcode.endswith("-start") or inst.opcode == "async-start":
            out.update(inst.called_computations)
    return out


def _is_shardy(module: Module) -> bool:
    fa = module.config.get("frontend_attributes") or {}
    return any(str(k).startswith("xla.sdy") for k in fa)


@register
@dataclass(frozen=True)
class CallInliner(ModulePass):
    """Inline `call` instructions (see the module docstring for XLA's rules)."""

    name: ClassVar[str] = "call-inliner"
    single_call_site: bool = False
    composites_to_preserve: tuple[str, ...] = ()

    def should_inline(self, inst: Instruction, call_sites: dict[Computation, int], async_comps: set,
                      shardy: bool) -> bool:
        """XLA's IsInlineableCallOp + frontend attributes + single-call-site rule."""
        if inst.opcode != "call" or "backend_config" in inst.attrs or inst.parent in async_comps:
            return False
        callee = inst.attrs.get("to_apply")
        if not isinstance(callee, Computation):
            return False
        if shardy and any(s in callee.name for s in _SHMAP_BODIES):
            return False
        if inst.attrs.get("is_composite") is True and \
                str(inst.frontend_attributes.get("composite.name", "")) in self.composites_to_preserve:
            return False
        inlineable = inst.frontend_attributes.get("inlineable")
        if inlineable is not None and str(inlineable) != "true":
            return False
        return not self.single_call_site or call_sites.get(callee, 0) == 1

    def run(self, module: Module) -> bool:
        call_sites: dict[Computation, int] = {}
        for inst in module.instructions():
            if inst.opcode == "call" and isinstance(inst.attrs.get("to_apply"), Computation):
                call_sites[inst.attrs["to_apply"]] = call_sites.get(inst.attrs["to_apply"], 0) + 1
        async_comps = _async_computations(module)
        shardy = _is_shardy(module)
        changed = False
        for comp in module.computations_post_order():
            for inst in list(comp.instructions):
                if inst.parent is comp and self.should_inline(inst, call_sites, async_comps, shardy):
                    inline_call(inst)
                    changed = True
        if changed:
            DeadCodeElimination().run(module)  # as XLA: drop what inlining left unused
        return changed
