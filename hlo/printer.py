"""Printer: `hlo.ir` back to HLO text that XLA's parser accepts, losing nothing that was parsed."""

from __future__ import annotations

from typing import Any

from hlopt.hlo.attributes import Metadata, format_value
from hlopt.hlo.ir import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, Computation, Instruction, Module
from hlopt.hlo.shape import AnyShape

__all__ = ["module_text", "computation_text", "instruction_text", "shape_text"]

#: id(shape) -> (shape, text). Keyed by identity (hashing a shape walks its fields); holding the shape keeps
#: its id from being reused. Parsed shapes are interned, so this stays small.
_shape_cache: dict[int, tuple[AnyShape, str]] = {}


def shape_text(shape: AnyShape) -> str:
    """A shape's text, cached."""
    hit = _shape_cache.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    text = shape.to_text()
    if len(_shape_cache) < 200_000:
        _shape_cache[id(shape)] = (shape, text)
    return text


def module_text(module: Module) -> str:
    """The whole module."""
    out: list[str] = [_header(module), "\n\n"]
    if module.trailer:
        out.append(module.trailer.rstrip() + "\n\n")
    for comp in _callees_first(module):
        if comp.is_inline:
            continue
        _computation(comp, comp is module.entry, out, "")
        out.append("\n\n")
    return "".join(out)


def _callees_first(module: Module) -> list[Computation]:
    """The module's computations in their order, except that a callee always precedes its callers
    (XLA's parser requires it)."""
    done: set[Computation] = set()
    order: list[Computation] = []
    for start in module.computations:
        if start in done:
            continue
        stack = [(start, iter(start.called_computations()))]
        done.add(start)
        while stack:
            comp, callees = stack[-1]
            for callee in callees:
                if callee not in done and callee.module is module:
                    done.add(callee)
                    stack.append((callee, iter(callee.called_computations())))
                    break
            else:
                stack.pop()
                order.append(comp)
    return order


def _header(module: Module) -> str:
    parts = [f"HloModule {module.name}"]
    for key, value in module.config.items():
        if isinstance(value, bool):
            parts.append(f"{key}={'true' if value else 'false'}")
        else:
            parts.append(f"{key}={format_value(key, value)}")
    return ", ".join(parts)


def computation_text(comp: Computation) -> str:
    """One computation (with its inline callees inline)."""
    out: list[str] = []
    _computation(comp, comp.is_entry, out, "")
    return "".join(out)


def _signature(comp: Computation) -> str:
    params = ", ".join(f"{p.name}: {p.shape.to_text(layout=False)}" for p in comp.parameters)
    root = comp.root.shape.to_text(layout=False) if comp.root is not None else "()"
    return f"({params}) -> {root}"


def _computation(comp: Computation, is_entry: bool, out: list[str], indent: str) -> None:
    if not comp.is_inline:
        out.append(("ENTRY " if is_entry else "") + f"%{comp.name} {_signature(comp)} {{\n")
    else:
        out.append("{\n")
    inner = indent + "  "
    root = comp.root
    for inst in comp.instructions:
        if inst.inline:
            continue
        out.append(inner)
        if inst is root:
            out.append("ROOT ")
        _instruction(inst, out, inner)
        out.append("\n")
    out.append(indent + "}")
    if comp.execution_thread is not None:
        out.append(f', execution_thread="{comp.execution_thread}"')


def instruction_text(inst: Instruction) -> str:
    """One instruction as a line (no indentation, no ROOT)."""
    out: list[str] = []
    _instruction(inst, out, "")
    return "".join(out)


def _operand(op: Instruction) -> str:
    if op.inline:
        if op.opcode == "parameter":
            return f"{shape_text(op.shape)} parameter({op.attrs['parameter_number']})"
        return f"{shape_text(op.shape)} constant({op.attrs['literal'].text})"
    return "%" + op.name


def _instruction(inst: Instruction, out: list[str], indent: str) -> None:
    attrs = inst.attrs
    out.append(f"%{inst.name} = {shape_text(inst.shape)} {inst.opcode}(")
    opcode = inst.opcode
    if opcode == "parameter":
        out.append(str(attrs["parameter_number"]))
    elif opcode == "constant":
        out.append(attrs["literal"].text)
    else:
        out.append(", ".join([_operand(op) for op in inst._operands]))
    out.append(")")
    for key, value in attrs.items():
        if key == "parameter_number" or key == "literal":
            continue
        out.append(", ")
        out.append(key)
        out.append("=")
        _attribute_value(key, value, out, indent)
    if inst._control_preds:
        out.append(", control-predecessors={" + ", ".join("%" + p.name for p in inst._control_preds) + "}")


def _attribute_value(key: str, value: Any, out: list[str], indent: str) -> None:
    if key in COMPUTATION_ATTRS and isinstance(value, Computation):
        if value.is_inline:
            _computation(value, False, out, indent)
        else:
            out.append("%" + value.name)
    elif key in COMPUTATION_LIST_ATTRS and isinstance(value, list):
        out.append("{" + ", ".join("%" + c.name for c in value) + "}")
    elif isinstance(value, Metadata):
        out.append(value.to_text())
    else:
        out.append(format_value(key, value))
