"""Printer: `hlo.ir` back to HLO text that XLA's parser accepts, losing nothing that was parsed."""

from __future__ import annotations

from typing import Any

from hlopt.hlo.attributes import INT_LIST_ATTRS, QUOTED_STRING_ATTRS, STRING_ATTRS, Metadata, format_value
from hlopt.hlo.ir import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, Computation, Instruction, Module
from hlopt.hlo.lexer import SKIP_RE, split_top_level
from hlopt.hlo.shape import AnyShape, ShapeParseError, parse_shape_at

__all__ = ["module_text", "computation_text", "instruction_text", "shape_text"]

#: id(shape) -> (shape, text). Keyed by identity (hashing a shape walks its fields); holding the shape keeps
#: its id from being reused. Parsed shapes are interned, so this stays small.
_shape_cache: dict[int, tuple[AnyShape, str]] = {}
#: The same for shapes written without their layouts (computation signatures).
_bare_shape_cache: dict[int, tuple[AnyShape, str]] = {}
#: Attributes `format_value` writes as the plain `str` value itself.
_PLAIN_STRING_ATTRS = STRING_ATTRS - QUOTED_STRING_ATTRS - INT_LIST_ATTRS
#: The text of an integer-list attribute value (`{2,0,1}`) by the tuple: a few values repeat on every layer.
_int_list_texts: dict[tuple[int, ...], str] = {}
#: Callees found while printing: computation -> its direct callees, unique, in `called_computations` order.
Callees = dict[Computation, dict[Computation, None]]


def shape_text(shape: AnyShape) -> str:
    """A shape's text, cached."""
    hit = _shape_cache.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    text = _indexed_shape_text(shape, True) if shape.is_tuple else shape.to_text()
    if len(_shape_cache) < 200_000:
        _shape_cache[id(shape)] = (shape, text)
    return text


def _bare_shape_text(shape: AnyShape) -> str:
    """A shape's text without layouts, cached."""
    hit = _bare_shape_cache.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    text = _indexed_shape_text(shape, False) if shape.is_tuple else shape.to_text(layout=False)
    if len(_bare_shape_cache) < 200_000:
        _bare_shape_cache[id(shape)] = (shape, text)
    return text


#: XLA's printer writes `/*index=i*/` before every element of a list whose index i is a non-zero multiple of this
#: (tuple shapes, operand lists, tuple shardings: ShapeUtil, HloInstruction and HloSharding printing).
INDEX_INTERVAL = 5


def _indexed(texts: list[str]) -> str:
    """`texts` joined with ", ", each element at a multiple of INDEX_INTERVAL after the first marked."""
    if len(texts) <= INDEX_INTERVAL:
        return ", ".join(texts)
    return ", ".join([f"/*index={i}*/{t}" if i and i % INDEX_INTERVAL == 0 else t for i, t in enumerate(texts)])


def _indexed_shape_text(shape: AnyShape, layout: bool) -> str:
    """A shape's text with XLA's index comments in its tuples (at every nesting level)."""
    if not shape.is_tuple:
        return shape.to_text(layout)
    return "(" + _indexed([_indexed_shape_text(e, layout) for e in shape.elements]) + ")"


def _indexed_sharding(text: str) -> str:
    """A tuple sharding `{{...}, {...}, ...}` with XLA's index comments (other shardings unchanged)."""
    if not text.startswith("{{"):
        return text
    return "{" + _indexed([part.strip() for part in split_top_level(text[1:-1])]) + "}"


def _entry_layout_text(text: str) -> str:
    """`entry_computation_layout`'s `{(parameters)->result}` with XLA's index comments (unchanged if it does
    not parse: the verifier reports that)."""
    try:
        params, end = parse_shape_at(text, 1)
        end = SKIP_RE.match(text, end).end()
        if not text.startswith("->", end):
            return text
        result, end = parse_shape_at(text, end + 2)
    except ShapeParseError:
        return text
    if text[end:].strip() != "}" or not params.is_tuple:
        return text
    return "{" + _indexed_shape_text(params, True) + "->" + _indexed_shape_text(result, True) + "}"


def module_text(module: Module) -> str:
    """The whole module. Each computation is printed first in module order (which also finds its callees),
    then the texts are put in callee-first order."""
    out: list[str] = [_header(module), "\n\n"]
    if module.trailer:
        out.append(module.trailer.rstrip() + "\n\n")
    callees: Callees = {}
    texts: dict[Computation, str] = {}
    for comp in module.computations:
        if not comp.is_inline and comp not in texts:
            texts[comp] = _top_level_text(comp, comp is module.entry, callees)
    for comp in _callees_first(module, callees):
        if comp.is_inline:
            continue
        text = texts.get(comp)
        out.append(text if text is not None else _top_level_text(comp, comp is module.entry, callees))
        out.append("\n\n")
    return "".join(out)


def _top_level_text(comp: Computation, is_entry: bool, callees: Callees) -> str:
    """One non-inline computation's text; its callees (and its inline callees' callees) go into `callees`."""
    out: list[str] = []
    _computation(comp, is_entry, out, "", callees)
    return "".join(out)


def _direct_callees(comp: Computation, callees: Callees) -> list[Computation] | dict[Computation, None]:
    """`comp.called_computations()`, from what printing found where it printed `comp`."""
    found = callees.get(comp)
    return found if found is not None else comp.called_computations()


def _callees_first(module: Module, callees: Callees) -> list[Computation]:
    """The module's computations in their order, except that a callee always precedes its callers
    (XLA's parser requires it)."""
    done: set[Computation] = set()
    order: list[Computation] = []
    for start in module.computations:
        if start in done:
            continue
        stack = [(start, iter(_direct_callees(start, callees)))]
        done.add(start)
        while stack:
            comp, it = stack[-1]
            for callee in it:
                if callee not in done and callee.module is module:
                    done.add(callee)
                    stack.append((callee, iter(_direct_callees(callee, callees))))
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
        elif key == "entry_computation_layout":
            parts.append(f"{key}={_entry_layout_text(format_value(key, value))}")
        else:
            parts.append(f"{key}={format_value(key, value)}")
    return ", ".join(parts)


def computation_text(comp: Computation) -> str:
    """One computation (with its inline callees inline)."""
    out: list[str] = []
    _computation(comp, comp.is_entry, out, "", {})
    return "".join(out)


def _signature(comp: Computation) -> str:
    params = ", ".join([f"{p.name}: {_bare_shape_text(p.shape)}" for p in comp.parameters])
    root = _bare_shape_text(comp.root.shape) if comp.root is not None else "()"
    return f"({params}) -> {root}"


def _computation(comp: Computation, is_entry: bool, out: list[str], indent: str, callees: Callees) -> None:
    """Append `comp`'s text to `out`, and record the callees of it and of its inline callees in `callees`."""
    if not comp.is_inline:
        out.append(("ENTRY " if is_entry else "") + f"%{comp.name} {_signature(comp)} {{\n")
    else:
        out.append("{\n")
    found: dict[Computation, None] = {}
    inner = indent + "  "
    root = comp.root
    for inst in comp.instructions:
        if inst.inline:
            for callee in inst.called_computations:
                found[callee] = None
            continue
        line = _line(inst, inner, found, callees)
        out.append(f"{inner}ROOT {line}\n" if inst is root else f"{inner}{line}\n")
    callees[comp] = found
    out.append(indent + "}")
    if comp.execution_thread is not None:
        out.append(f', execution_thread="{comp.execution_thread}"')


def instruction_text(inst: Instruction) -> str:
    """One instruction as a line (no indentation, no ROOT)."""
    return _line(inst, "", {}, {})


def _operand(op: Instruction) -> str:
    if op.inline:
        if op.opcode == "parameter":
            return f"{shape_text(op.shape)} parameter({op.attrs['parameter_number']})"
        return f"{shape_text(op.shape)} constant({op.attrs['literal'].text})"
    return "%" + op.name


def _line(inst: Instruction, indent: str, found: dict[Computation, None], callees: Callees) -> str:
    """One instruction's line; the computations it calls go into `found` (inline ones' callees into
    `callees`)."""
    attrs = inst.attrs
    opcode = inst.opcode
    shape = inst.shape
    hit = _shape_cache.get(id(shape))
    text = hit[1] if hit is not None and hit[0] is shape else shape_text(shape)
    if opcode == "parameter":
        args = str(attrs["parameter_number"])
        more = len(attrs) > 1  # attributes but the one printed as the argument
    elif opcode == "constant":
        args = attrs["literal"].text
        more = len(attrs) > 1
    else:
        args = _operands_text(inst._operands)
        more = bool(attrs)
    line = f"%{inst.name} = {text} {opcode}({args})"
    if more:
        line = _with_attributes(line, attrs, indent, found, callees)
    if inst._control_preds:
        line += ", control-predecessors={" + ", ".join(["%" + p.name for p in inst._control_preds]) + "}"
    return line


def _operands_text(ops: list[Instruction]) -> str:
    """The operand list inside an instruction's parentheses (one or two operands without a loop)."""
    n = len(ops)
    if n == 2:
        a, b = ops
        if not (a.inline or b.inline):
            return f"%{a.name}, %{b.name}"
    elif n == 1:
        op = ops[0]
        return _operand(op) if op.inline else "%" + op.name
    return _indexed([_operand(op) if op.inline else "%" + op.name for op in ops])


def _with_attributes(line: str, attrs: dict[str, Any], indent: str, found: dict[Computation, None],
                     callees: Callees) -> str:
    """`line` followed by `, key=value` for each attribute (but the parameter number and literal)."""
    for key, value in attrs.items():
        cls = value.__class__
        if cls is tuple and key in INT_LIST_ATTRS:
            text = _int_list_texts.get(value)
            if text is None:
                text = "{" + ",".join(map(str, value)) + "}"
                if len(_int_list_texts) < 100_000:
                    _int_list_texts[value] = text
            line += f", {key}={text}"
        elif cls is Computation and key in COMPUTATION_ATTRS and not value.is_inline:
            found[value] = None
            line += f", {key}=%{value.name}"
        elif cls is str and key in _PLAIN_STRING_ATTRS:
            line += f", {key}={value}"
        elif key != "parameter_number" and key != "literal":
            parts = [f", {key}="]
            _attribute_value(key, value, parts, indent, found, callees)
            line += "".join(parts)
    return line


def _attribute_value(key: str, value: Any, out: list[str], indent: str, found: dict[Computation, None],
                     callees: Callees) -> None:
    if key in COMPUTATION_ATTRS and isinstance(value, Computation):
        found[value] = None
        if value.is_inline:
            _computation(value, False, out, indent, callees)
        else:
            out.append("%" + value.name)
    elif key in COMPUTATION_LIST_ATTRS and isinstance(value, list):
        for callee in value:
            if isinstance(callee, Computation):
                found[callee] = None
        if value and all(c.is_inline for c in value):
            out.append("{\n")
            for i, callee in enumerate(value):
                out.append(indent + "  " if i == 0 else ",\n" + indent + "  ")
                _computation(callee, False, out, indent + "  ", callees)
            out.append("\n" + indent + "}")
        else:
            out.append("{" + ", ".join("%" + c.name for c in value) + "}")
    elif isinstance(value, Metadata):
        out.append(value.to_text())
    elif key == "sharding":
        out.append(_indexed_sharding(format_value(key, value)))
    else:
        out.append(format_value(key, value))
