"""Parser for HLO text: everything JAX and XLA print (dumps included), into `hlo.ir`.

Bad input raises `HloParseError` with file:line:col, the line, a caret and what was expected.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hlopt.hlo.attributes import Raw, parse_typed
from hlopt.hlo.gc_pause import collection_paused
from hlopt.hlo.ir import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, Computation, Instruction, Module
from hlopt.hlo.lexer import SKIP_RE, STRING_RE, UnterminatedError, line_col, value_end
from hlopt.hlo.literal import Literal, plain_literal_end
from hlopt.hlo.opcodes import OPCODES, is_known_opcode
from hlopt.hlo.shape import DTYPES, ShapeParseError, _shape_cache, parse_shape, parse_shape_at

__all__ = ["parse", "parse_file", "HloParseError"]


class HloParseError(ValueError):
    """A syntax or reference error in HLO text, located at file:line:col."""

    def __init__(self, message: str, text: str, pos: int, filename: str | None = None):
        self.message = message
        self.filename = filename or "<text>"
        self.line, self.col, self.source_line = line_col(text, pos)
        super().__init__(str(self))

    def __str__(self) -> str:
        caret = " " * (self.col - 1) + "^"
        return f"{self.filename}:{self.line}:{self.col}: error: {self.message}\n{self.source_line}\n{caret}"


_NAME_RE = re.compile(r"%?([A-Za-z_][\w.\-]*|\d[\w.\-]*)")
_OPCODE_RE = re.compile(r"([a-z][a-z0-9\-]*)\(")
_KEY_RE = re.compile(r"([A-Za-z_][\w.\-]*)\s*=")
_SHAPE_START_RE = re.compile(r"\(|([a-z][a-z0-9]*)\[")
_INT_RE = re.compile(r"[0-9]+")
_TRAILER_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_HEADER_INT = frozenset({"replica_count", "num_partitions"})
_SKIP_START = frozenset(" \t\r\n/")
#: Deepest nesting of inline operands / inline computations accepted.
MAX_NESTING = 64
#: The common instruction in one match: `[ROOT] %name = f32[..]{..} opcode(inner)` with no nested parentheses.
_FAST_INST_RE = re.compile(
    r"(ROOT[ \t]+)?%?([A-Za-z_][\w.\-]*)[ \t]*=[ \t]*([a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?)[ \t]+"
    r"([a-z][a-z0-9\-]*)\(([^()\n]*)\)"
)
_FAST_OPERANDS_RE = re.compile(r"[ \t]*(?:%?[A-Za-z_][\w.\-]*[ \t]*(?:,[ \t]*%?[A-Za-z_][\w.\-]*[ \t]*)*)?")
_FAST_LITERAL_RE = re.compile(r"[^{}\[\]\"]*|[ \t]*\{[^{}\[\]\"]*\}[ \t]*")
#: A simple attribute: `, key=value` where value has no strings, no nesting, and a ',' or the line end follows.
_FAST_ATTR_RE = re.compile(
    r"[ \t]*,[ \t]*([A-Za-z_][\w.\-]*)=(%?[^\s,{}\[\]()\"/]+|\{[^{}\[\]()\"\n/]*\}"
    r"|\{(?:[^{}\[\]()\"\n]|\[[^{}\[\]()\"\n]*\]|\([^{}\[\]()\"\n]*\)|\"(?:[^\"\\\n]|\\.)*\")*\}"
    r"|\"(?:[^\"\\\n]|\\.)*\")(?=[ \t]*(?:,|\r?\n|$))"
)
#: Typed attribute values are immutable (except these dicts, copied): equal texts share one parsed value.
_MUTABLE_TYPED = frozenset({"metadata", "frontend_attributes"})
_typed_cache: dict[tuple[str, str], Any] = {}
_SIGNATURE_TOKEN_RE = re.compile(r"[()]|/\*")
_MESH_DEVICE_IDS_RE = re.compile(r"[ \t]*,[ \t]*device_ids=(?=\()")
_SIMPLE_OPERANDS_RE = re.compile(r"\s*((?:%?[A-Za-z_][\w.\-]*\s*,\s*)*%?[A-Za-z_][\w.\-]*)?\s*\)")


def parse(text: str, filename: str | None = None) -> Module:
    """Parse HLO module text into a Module."""
    with collection_paused():  # parsing allocates many linked objects; collections mid-parse only cost time
        return _Parser(text, filename).parse_module()


def parse_file(path: str | Path) -> Module:
    """Parse the HLO module in a file."""
    p = Path(path)
    return parse(p.read_text(), filename=str(p))


class _PendingOperands:
    """Operand references of one instruction, resolved when its computation ends.

    `refs` holds (name | (name, index) | Instruction, position) pairs, or, when `simple`, plain names of an
    operand list that starts at `pos`."""

    __slots__ = ("inst", "refs", "control", "simple", "pos")

    def __init__(self, inst: Instruction, refs: list, control: list[tuple[str, int]], simple: bool = False,
                 pos: int = 0):
        self.inst = inst
        self.refs = refs
        self.control = control
        self.simple = simple
        self.pos = pos


class _Parser:
    def __init__(self, text: str, filename: str | None):
        self.text = text
        self.filename = filename
        self.pos = 0
        self.module: Module | None = None
        self.comp_refs: list[tuple[Instruction, str, Any, int]] = []
        self.elided = False  # some instruction was written without its result shape
        self.depth = 0  # nesting of inline operands and inline computations
        self.param_pos: dict[Instruction, int] = {}  # where each parameter's number is written
        self.elided_pos: dict[Instruction, int] = {}  # where each instruction without a result shape is

    # ----------------------------------------------------------------- errors and tokens
    def error(self, message: str, pos: int | None = None) -> HloParseError:
        return HloParseError(message, self.text, self.pos if pos is None else pos, self.filename)

    def skip(self) -> None:
        pos = self.pos
        if pos < len(self.text) and self.text[pos] in _SKIP_START:
            self.pos = SKIP_RE.match(self.text, pos).end()

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            raise self.error(f"expected {what or repr(s)}")

    def name(self, what: str = "a name") -> str:
        self.skip()
        m = _NAME_RE.match(self.text, self.pos)
        if m is None:
            raise self.error(f"expected {what}")
        self.pos = m.end()
        return m.group(1)

    def shape(self):
        try:
            shape, self.pos = parse_shape_at(self.text, self.pos)
        except ShapeParseError as e:
            raise self.error(str(e), e.offset) from None
        return shape

    def raw_value(self) -> tuple[str, int]:
        self.skip()
        start = self.pos
        try:
            end = value_end(self.text, start)
        except UnterminatedError as e:
            raise self.error(str(e), e.offset) from None
        if end == start:
            raise self.error("expected an attribute value")
        self.pos = end
        return self.text[start:end].rstrip(), start

    # ----------------------------------------------------------------- module
    def parse_module(self) -> Module:
        self.skip()
        if not self.text.startswith("HloModule", self.pos):
            raise self.error("expected 'HloModule' at the start of the module")
        self.pos += len("HloModule")
        self.module = Module(self.name("the module name"))
        self.parse_header_attributes()
        entry: Computation | None = None
        while True:
            self.skip()
            if self.pos >= len(self.text):
                break
            if self.text.startswith(_TRAILER_SECTIONS, self.pos):
                self.parse_trailer()
                continue
            comp, is_entry = self.parse_computation()
            if is_entry:
                if entry is not None:
                    raise self.error("a module has one ENTRY computation; found a second")
                entry = comp
        if not self.module.computations:
            raise self.error("expected at least one computation")
        self.module.entry = entry or self.module.computations[-1]
        self.resolve_computation_refs()
        return self.module

    def parse_header_attributes(self) -> None:
        config = self.module.config
        while self.peek(","):
            self.pos += 1
            self.skip()
            m = _KEY_RE.match(self.text, self.pos)
            if m is None:
                raise self.error("expected 'key=value' in the HloModule line")
            key = m.group(1)
            self.pos = m.end()
            value, vpos = self.raw_value()
            if key == "is_scheduled":
                if value not in ("true", "false"):
                    raise self.error("expected true or false", vpos)
                config[key] = value == "true"
            elif key in _HEADER_INT:
                if not (value.isdigit() and value.isascii()):
                    raise self.error("expected an integer", vpos)
                config[key] = int(value)
            elif key == "frontend_attributes":
                config[key] = self.typed(key, value, vpos)
            else:
                config[key] = Raw(value)

    def parse_trailer(self) -> None:
        start = self.pos
        end = self.text.find("\n", start)
        if self.text[start : len(self.text) if end < 0 else end].strip() not in _TRAILER_SECTIONS:
            raise self.error("expected a section name (FileNames, FunctionNames, FileLocations, StackFrames) "
                             "alone on its line")
        lines = self.text[start:].split("\n")
        consumed = 0
        for line in lines:
            s = line.strip()
            if s and not (s in _TRAILER_SECTIONS or s[0].isdigit()):
                break
            consumed += len(line) + 1
        self.module.trailer += self.text[start : start + consumed].rstrip() + "\n\n"
        self.pos = min(len(self.text), start + consumed)

    # ----------------------------------------------------------------- computations
    def parse_computation(self) -> tuple[Computation, bool]:
        is_entry = False
        if self.text.startswith("ENTRY", self.pos) and self.text[self.pos + 5 : self.pos + 6] in (" ", "\t", "%", "\n"):
            is_entry = True
            self.pos += 5
        name = self.name("a computation name or 'ENTRY'")
        if self.peek("("):
            self.skip_signature()
        self.expect("{", "'{' to start the computation body")
        comp = Computation(name)
        self.module.add_computation(comp)
        self.parse_body(comp)
        if self.peek(","):
            save = self.pos
            self.pos += 1
            self.skip()
            m = _KEY_RE.match(self.text, self.pos)
            if m and m.group(1) == "execution_thread":
                self.pos = m.end()
                value, vpos = self.raw_value()
                comp.execution_thread = parse_typed("custom_call_target", value)
            else:
                self.pos = save
        return comp, is_entry

    def skip_signature(self) -> None:
        """Skip `(name: shape, ...) -> shape` (the parameters' own shapes are authoritative)."""
        start = pos = self.pos
        depth = 0
        text = self.text
        search = _SIGNATURE_TOKEN_RE.search
        while True:
            m = search(text, pos)
            if m is None:
                raise self.error("expected ')' to close the computation signature", start)
            pos = m.end()
            c = m.group()
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            else:
                close = text.find("*/", pos)
                if close < 0:
                    raise self.error("expected '*/' to end this comment", m.start())
                pos = close + 2
        self.pos = pos
        if self.accept("->"):
            self.skip()
            self.shape()

    def parse_body(self, comp: Computation) -> None:
        """Parse instructions up to the closing '}' and resolve their operands."""
        names: dict[str, Instruction] = {}
        pending: list[_PendingOperands] = []
        root: Instruction | None = None
        last: Instruction | None = None
        while True:
            self.skip()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                break
            if self.pos >= len(self.text):
                raise self.error("expected '}' to close the computation (or another instruction)")
            start = self.pos
            fast = self.fast_instruction(comp, names, pending)
            inst, is_root = fast if fast is not None else self.parse_instruction(comp, names, pending)
            if is_root:
                if root is not None:
                    raise self.error(f"computation {comp.name} has two ROOT instructions", start)
                root = inst
            last = inst
        if last is None:
            raise self.error(f"computation {comp.name} has no instructions")
        self.check_parameter_numbers(comp, names)
        self.resolve_operands(comp, names, pending)
        comp.root = root or last

    def check_parameter_numbers(self, comp: Computation, names: dict[str, Instruction]) -> None:
        """Parameters are numbered 0..n-1, each once (XLA's parser aborts the process otherwise)."""
        params = [i for i in names.values() if i.opcode == "parameter"]
        if not params:
            return
        seen: dict[int, Instruction] = {}
        for p in params:
            number = p.attrs["parameter_number"]
            if number in seen:
                raise self.error(f"parameter number {number} is used twice in {comp.name} "
                                 f"(%{seen[number].name} and %{p.name})", self.param_pos[p])
            seen[number] = p
            if number >= len(params):
                raise self.error(f"expected parameter numbers 0..{len(params) - 1} in {comp.name} "
                                 f"({len(params)} parameters), got {number}", self.param_pos[p])

    def fast_instruction(
        self, comp: Computation, names: dict[str, Instruction], pending: list[_PendingOperands]
    ) -> tuple[Instruction, bool] | None:
        """The common instruction (array shape, plain operand names) in one regex match; None when the line
        is anything else, or wrong: then `parse_instruction` parses it again and reports the error."""
        m = _FAST_INST_RE.match(self.text, self.pos)
        if m is None:
            return None
        root_kw, name, shape_text, opcode, inner = m.groups()
        if name in names or name in DTYPES or name == "ROOT" or (opcode not in OPCODES and not is_known_opcode(opcode)):
            return None
        shape = _shape_cache.get(shape_text)
        if shape is None:
            try:
                shape = parse_shape(shape_text)
            except ShapeParseError:
                return None
        refs: list[tuple[Any, int]] = []
        if opcode == "parameter":
            if not _INT_RE.fullmatch(inner):
                return None
            inst = Instruction(opcode, shape, name=name, parameter_number=int(inner))
            self.param_pos[inst] = m.start(5)
        elif opcode == "constant":
            if not _FAST_LITERAL_RE.fullmatch(inner) or not inner.strip():
                return None
            inst = Instruction(opcode, shape, name=name, literal=Literal(inner, shape))
        else:
            if not _FAST_OPERANDS_RE.fullmatch(inner):
                return None
            inst = Instruction(opcode, shape, name=name)
            if inner.strip():  # validated above: names, commas, blanks
                refs = inner.replace("%", "").replace(" ", "").replace("\t", "").split(",")
        end = self.pos = m.end()
        control: list[tuple[str, int]] = []
        if self.text[end : end + 1] != "\n":
            self.parse_attributes(inst, control, comp)
        comp.add(inst)
        pending.append(_PendingOperands(inst, refs, control, True, m.start(5)))
        names[name] = inst
        return inst, root_kw is not None

    def parse_instruction(
        self, comp: Computation, names: dict[str, Instruction], pending: list[_PendingOperands]
    ) -> tuple[Instruction, bool]:
        is_root = False
        if self.text.startswith("ROOT", self.pos) and self.text[self.pos + 4 : self.pos + 5] in (" ", "\t", "%"):
            is_root = True
            self.pos += 4
        name_pos = self.pos
        name = self.name("an instruction name")
        if name in DTYPES:
            raise self.error(f"illegal instruction name {name!r}: it is a primitive type (XLA rejects it)", name_pos)
        if name in names:
            raise self.error(f"instruction %{name} is defined twice in {comp.name}", name_pos)
        self.expect("=", "'=' after the instruction name")
        inst = self.parse_instruction_rhs(comp, names, pending, name)
        names[name] = inst
        return inst, is_root

    def parse_instruction_rhs(
        self, comp: Computation, names: dict[str, Instruction], pending: list[_PendingOperands], name: str
    ) -> Instruction:
        """`[shape] opcode(operands), attrs...` -> an Instruction added to comp."""
        self.skip()
        shape = None
        m = _SHAPE_START_RE.match(self.text, self.pos)
        if m is not None and (m.group(0) == "(" or m.group(1) in DTYPES):
            shape = self.shape()
            self.skip()
        elif m is not None:
            raise self.error(f"unknown primitive type {m.group(1)!r}")
        op_pos = self.pos
        m = _OPCODE_RE.match(self.text, self.pos)
        if m is None:
            raise self.error("expected an opcode followed by '('")
        opcode = m.group(1)
        if not is_known_opcode(opcode):
            raise self.error(f"unknown opcode {opcode!r}", op_pos)
        self.pos = m.end()
        inst = Instruction(opcode, shape, name=name)
        if shape is None:
            inst.shape_elided = self.elided = True
            self.elided_pos[inst] = op_pos
        refs: list[tuple[Any, int]] = []
        if opcode == "parameter":
            self.skip()
            mm = _INT_RE.match(self.text, self.pos)
            if mm is None:
                raise self.error("expected the parameter number")
            inst.attrs["parameter_number"] = int(mm.group())
            self.param_pos[inst] = mm.start()
            self.pos = mm.end()
            self.expect(")", "')' after the parameter number")
        elif opcode == "constant":
            lit_start = self.pos
            try:
                end = plain_literal_end(self.text, self.pos) or value_end(self.text, self.pos)
            except UnterminatedError as e:
                raise self.error(str(e), e.offset) from None
            if not self.text.startswith(")", end):
                raise self.error("expected ')' after the literal", end)
            if shape is None:
                raise self.error("a constant needs its shape written before 'constant'", op_pos)
            inst.attrs["literal"] = Literal(self.text[lit_start:end], shape)
            self.pos = end + 1
        else:
            refs = self.parse_operands(comp, names, pending)
        control: list[tuple[str, int]] = []
        self.parse_attributes(inst, control, comp)
        comp.add(inst)
        pending.append(_PendingOperands(inst, refs, control))
        return inst

    def parse_operands(
        self, comp: Computation, names: dict[str, Instruction], pending: list[_PendingOperands]
    ) -> list[tuple[Any, int]]:
        refs: list[tuple[Any, int]] = []
        fast = _SIMPLE_OPERANDS_RE.match(self.text, self.pos)
        if fast is not None:  # the common case: `%a, %b)` with no shapes or inline operands
            body = fast.group(1)
            if body:
                offset = fast.start(1)
                for part in body.split(","):
                    name = part.strip()
                    at = offset + part.index(name)
                    offset += len(part) + 1
                    refs.append((name[1:] if name[0] == "%" else name, at))
            self.pos = fast.end()
            return refs
        if self.accept(")"):
            return refs
        while True:
            self.skip()
            ref_pos = self.pos
            op_shape = None
            m = _SHAPE_START_RE.match(self.text, self.pos)
            if m is not None and (m.group(0) == "(" or m.group(1) in DTYPES):
                op_shape = self.shape()  # an operand's written shape is redundant unless it is inline
                self.skip()
                ref_pos = self.pos
            m = _OPCODE_RE.match(self.text, self.pos)
            if m is not None and is_known_opcode(m.group(1)):
                refs.append((self.parse_inline_operand(comp, names, pending, op_shape), ref_pos))
            else:
                ref = self.name("an operand name")
                if self.text.startswith("#", self.pos):
                    mm = _INT_RE.match(self.text, self.pos + 1)
                    if mm is None:
                        raise self.error("expected a tuple index after '#'")
                    self.pos = mm.end()
                    refs.append(((ref, int(mm.group())), ref_pos))
                else:
                    refs.append((ref, ref_pos))
            if self.accept(","):
                continue
            self.expect(")", "',' or ')' in the operand list")
            return refs

    def parse_inline_operand(
        self, comp: Computation, names: dict[str, Instruction], pending: list[_PendingOperands], shape
    ) -> Instruction:
        """An operand written as an instruction, e.g. `s32[] constant(1)`: added before its user."""
        op_pos = self.pos
        self.enter(op_pos)
        m = _OPCODE_RE.match(self.text, self.pos)
        opcode = m.group(1)
        self.pos = m.end()
        inst = Instruction(opcode, shape)
        inst.shape_elided = shape is None
        self.elided_pos[inst] = op_pos
        self.elided |= shape is None
        refs: list[tuple[Any, int]] = []
        if opcode == "constant":
            try:
                end = value_end(self.text, self.pos)
            except UnterminatedError as e:
                raise self.error(str(e), e.offset) from None
            if shape is None:
                raise self.error("an inline constant needs its shape", op_pos)
            if not self.text.startswith(")", end):
                raise self.error("expected ')' after the literal", end)
            inst.attrs["literal"] = Literal(self.text[self.pos : end], shape)
            self.pos = end + 1
        elif opcode == "parameter":
            self.skip()
            mm = _INT_RE.match(self.text, self.pos)
            if mm is None or shape is None:
                raise self.error("an inline parameter needs its shape and number", op_pos)
            inst.attrs["parameter_number"] = int(mm.group())
            self.param_pos[inst] = mm.start()
            self.pos = mm.end()
            self.expect(")", "')' after the parameter number")
        else:
            refs = self.parse_operands(comp, names, pending)
        inst.name = self.module.unique_name(f"{opcode}.anon")  # after its operands, as XLA names them
        comp.add(inst)
        names[inst.name] = inst
        pending.append(_PendingOperands(inst, refs, []))
        inst.inline = opcode in ("constant", "parameter")
        self.depth -= 1
        return inst

    def enter(self, pos: int) -> None:
        """One level deeper into inline operands/computations (an error past MAX_NESTING)."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"inline operands and computations nested more than {MAX_NESTING} levels deep", pos)

    # ----------------------------------------------------------------- attributes
    def parse_attributes(self, inst: Instruction, control: list[tuple[str, int]], comp: Computation) -> None:
        text = self.text
        attrs = inst.attrs
        fast = _FAST_ATTR_RE.match
        while True:
            m = fast(text, self.pos)
            if m is not None:
                key, value = m.groups()
                if key in attrs or key in _SLOW_KEYS:
                    m = None  # the general path below reports it / handles it
                else:
                    self.pos = m.end()
                    attrs[key] = Raw(value) if key in _RAW_KEYS else self.typed(key, value, m.start(2))
                    continue
            pos = SKIP_RE.match(text, self.pos).end()
            if not text.startswith(",", pos):
                self.pos = pos
                return
            self.pos = SKIP_RE.match(text, pos + 1).end()
            m = _KEY_RE.match(text, self.pos)
            if m is None:
                raise self.error("expected 'attribute=value'")
            key = m.group(1)
            key_pos = self.pos
            self.pos = SKIP_RE.match(text, m.end()).end()
            if key in attrs:
                raise self.error(f"attribute {key!r} is given twice", key_pos)
            if key in COMPUTATION_ATTRS and text.startswith("{", self.pos):
                attrs[key] = self.parse_inline_computation()
                continue
            value, vpos = self.raw_value()
            if key == "replica_groups" and value.startswith("mesh["):
                value = self.mesh_device_ids(value, vpos)
            if key in COMPUTATION_ATTRS:
                attrs[key] = None
                self.comp_refs.append((inst, key, value.lstrip("%"), vpos))
            elif key in COMPUTATION_LIST_ATTRS:
                if not (value.startswith("{") and value.endswith("}")):
                    raise self.error("expected '{%comp, ...}'", vpos)
                names = [v.strip().lstrip("%") for v in value[1:-1].split(",") if v.strip()]
                attrs[key] = []
                self.comp_refs.append((inst, key, names, vpos))
            elif key == "control-predecessors":
                if not (value.startswith("{") and value.endswith("}")):
                    raise self.error("expected '{%inst, ...}'", vpos)
                control.extend((v.strip().lstrip("%"), vpos) for v in value[1:-1].split(",") if v.strip())
            elif key == "metadata":
                attrs[key] = self.typed(key, value, vpos)
            elif key in _RAW_KEYS:
                attrs[key] = Raw(value)
            else:
                attrs[key] = self.typed(key, value, vpos)

    def mesh_device_ids(self, value: str, vpos: int) -> str:
        """`mesh[...], device_ids=(...) {axes}`: the comma before `device_ids` belongs to the value."""
        m = _MESH_DEVICE_IDS_RE.match(self.text, self.pos)
        if m is None:
            return value
        try:
            end = value_end(self.text, m.end())
        except UnterminatedError as e:
            raise self.error(str(e), e.offset) from None
        self.pos = end
        return self.text[vpos:end].rstrip()

    def typed(self, key: str, value: str, vpos: int) -> Any:
        cached = _typed_cache.get((key, value))
        if cached is not None:
            return cached.copy() if key in _MUTABLE_TYPED else cached
        try:
            result = parse_typed(key, value)
        except (ValueError, IndexError) as e:
            raise self.error(f"bad value for attribute {key!r}: {e}", vpos) from None
        if len(_typed_cache) < 100_000:
            _typed_cache[(key, value)] = result
            if key in _MUTABLE_TYPED:  # dicts: every instruction gets its own copy
                return result.copy()
        return result

    def parse_inline_computation(self) -> Computation:
        self.enter(self.pos)
        self.pos += 1  # '{'
        comp = Computation(self.module.unique_name("_"))
        comp.is_inline = True
        self.module.add_computation(comp)
        self.parse_body(comp)
        self.depth -= 1
        return comp

    # ----------------------------------------------------------------- resolution
    def resolve_operands(
        self, comp: Computation, names: dict[str, Instruction], pending: list[_PendingOperands]
    ) -> None:
        for p in pending:
            if p.simple:
                try:
                    ops = [names[r] for r in p.refs]
                except KeyError:
                    ref = next(r for r in p.refs if r not in names)
                    where = re.compile(r"%?" + re.escape(ref) + r"(?![\w.\-])").search(self.text, p.pos)
                    raise self.error(f"operand %{ref} is not defined in computation {comp.name}",
                                     where.start() if where else p.pos) from None
                p.inst.replace_operands(ops)
                for ref, pos in p.control:
                    target = names.get(ref)
                    if target is None:
                        raise self.error(f"control predecessor %{ref} is not defined in {comp.name}", pos)
                    target.add_control_successor(p.inst)
                continue
            ops = []
            for ref, pos in p.refs:
                if isinstance(ref, Instruction):
                    ops.append(ref)
                    continue
                if isinstance(ref, tuple):
                    ops.append(self.tuple_shorthand(comp, names, ref, pos, p.inst))
                    continue
                target = names.get(ref)
                if target is None:
                    raise self.error(f"operand %{ref} is not defined in computation {comp.name}", pos)
                ops.append(target)
            p.inst.replace_operands(ops)
            for ref, pos in p.control:
                target = names.get(ref)
                if target is None:
                    raise self.error(f"control predecessor %{ref} is not defined in {comp.name}", pos)
                target.add_control_successor(p.inst)

    def tuple_shorthand(
        self, comp: Computation, names: dict[str, Instruction], ref: tuple[str, int], pos: int, user: Instruction
    ) -> Instruction:
        base, index = ref
        target = names.get(base)
        if target is None:
            raise self.error(f"operand %{base} is not defined in computation {comp.name}", pos)
        gte = Instruction("get-tuple-element", None, [target], name=self.module.unique_name(f"{base}.gte"),
                          index=index)
        gte.shape_elided = self.elided = True
        self.elided_pos[gte] = pos
        comp.add(gte, before=user)
        return gte

    def resolve_computation_refs(self) -> None:
        by_name = {c.name: c for c in self.module.computations}
        for inst, key, ref, pos in self.comp_refs:
            if isinstance(ref, list):
                comps = []
                for r in ref:
                    if r not in by_name:
                        raise self.error(f"computation %{r} is not defined", pos)
                    comps.append(by_name[r])
                inst.attrs[key] = comps
            else:
                if ref not in by_name:
                    raise self.error(f"computation %{ref} is not defined", pos)
                inst.attrs[key] = by_name[ref]
        self.infer_elided_shapes()

    def infer_elided_shapes(self) -> None:
        """Give instructions written without a result shape their inferred shape (callees first)."""
        from hlopt.hlo.shape_inference import ShapeInferenceError, infer_shape

        if not self.elided:
            return
        for comp in self.module.computations_post_order():
            for inst in comp.post_order():
                if inst.shape is None:
                    try:
                        inst.shape = infer_shape(inst)
                    except ShapeInferenceError as e:
                        raise HloParseError(
                            f"cannot infer the shape of %{inst.name} ({e}); write its result shape",
                            self.text, self.elided_pos.get(inst, len(self.text)), self.filename,
                        ) from None


#: Attributes kept verbatim even though they are common.
_RAW_KEYS = frozenset(
    {"sharding", "backend_config", "operand_precision", "precision_config", "statistics", "origin",
     "result_accuracy", "output_to_operand_aliasing", "operand_layout_constraints", "raw_backend_config",
     "schedule_type", "custom_call_schedule", "slice_sizes_raw", "algorithm"}
)

#: Attributes the fast attribute path leaves to the general one (computations, lists of names, control edges).
_SLOW_KEYS = COMPUTATION_ATTRS | COMPUTATION_LIST_ATTRS | {"control-predecessors"}

_ = STRING_RE  # re-exported for attribute helpers
