"""Parser for HLO text: everything JAX and XLA print (dumps included), into `hlo.ir`.

Bad input raises `HloParseError` with file:line:col, the line, a caret and what was expected.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from hlopt.hlo.attributes import (
    METADATA_KEYS,
    MODULE_ATTRS,
    REQUIRED_ATTRS,
    Raw,
    allowed_attributes,
    check_verbatim,
    parse_typed,
)
from hlopt.hlo.gc_pause import collection_paused
from hlopt.hlo.ir import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, Computation, Instruction, Module
from hlopt.hlo.lexer import SKIP_RE, STRING_RE, UnterminatedError, blank_comments, line_col, value_end
from hlopt.hlo.literal import Literal, plain_literal_end
from hlopt.hlo.literal_syntax import LiteralSyntaxError, check_literal_text
from hlopt.hlo.opcodes import OPCODES, is_known_opcode
from hlopt.hlo.shape import DTYPES, ShapeParseError, _shape_cache, layout_problem, parse_shape, parse_shape_at

__all__ = ["parse", "parse_file", "HloParseError", "LenientParseWarning"]


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


_NAME_LIST_RE = re.compile(r"\{\s*(?:%?[A-Za-z_][\w.\-]*\s*(?:,\s*%?[A-Za-z_][\w.\-]*\s*)*)?\}")
_LENIENT_HINT = " (parse with lenient=True / --lenient to keep unknown attributes)"
_PARAM_NAME_RE = re.compile(r"[A-Za-z_][\w.\-]*:?")
_NAME_CHAR_RE = re.compile(r"[\w.\-]")
_NAME_RE = re.compile(r"%?([A-Za-z_][\w.\-]*)")
_OPCODE_RE = re.compile(r"([a-z][a-z0-9\-]*)\s*\(")
_KEY_RE = re.compile(r"([A-Za-z_][\w.\-]*)=")  # XLA's lexer: the '=' is part of the attribute name
_SHAPE_START_RE = re.compile(r"\(|([a-z][a-z0-9]*)\s*\[")
_INT_RE = re.compile(r"[0-9]+")
_TRAILER_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_HEADER_INT = frozenset({"replica_count", "num_partitions"})
_BOOL_LIST_RE = re.compile(r"true|false|\{\s*(?:(?:true|false)\s*(?:,\s*(?:true|false)\s*)*)?\}")
#: The stack-trace sections, in the order XLA requires, and the sub-attributes of their entries (None:
#: entries are quoted names).
_TRAILER_ENTRIES: tuple[tuple[str, frozenset[str] | None], ...] = (
    ("FileNames", None), ("FunctionNames", None),
    ("FileLocations", frozenset({"file_name_id", "function_name_id", "line", "end_line", "column", "end_column"})),
    ("StackFrames", frozenset({"file_location_id", "parent_frame_id"})),
)
_SIGNED_INT_RE = re.compile(r"-?[0-9]+")
_SUB_KEY_RE = re.compile(r"[A-Za-z_][\w\-]*")
_SKIP_START = frozenset(" \t\r\n/")
#: Deepest nesting of inline operands / inline computations accepted.
MAX_NESTING = 64
#: The common instruction in one match: `[ROOT] %name = f32[..]{..} opcode(inner)` with no nested parentheses.
#: A name right before '=' needs its '%' (XLA's lexer reads `name=` as an attribute name): groups 2 and 3 are
#: the name written with and without '%'.
_FAST_INST_RE = re.compile(
    r"(ROOT[ \t]+)?(?:%([A-Za-z_][\w.\-]*)[ \t]*|([A-Za-z_][\w.\-]*)[ \t]+)=[ \t]*"
    r"([a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?)[ \t]+([a-z][a-z0-9\-]*)\(([^()\n]*)\)"
)
#: `_FAST_INST_RE` after the blanks and newlines before it (one match per line when no comment comes first).
_FAST_LINE_RE = re.compile(r"[ \t\r\n]*" + _FAST_INST_RE.pattern)
_FAST_OPERANDS_RE = re.compile(r"[ \t]*(?:%?[A-Za-z_][\w.\-]*[ \t]*(?:,[ \t]*%?[A-Za-z_][\w.\-]*[ \t]*)*)?")
_OPERAND_NAMES_RE = re.compile(r"[A-Za-z_][\w.\-]*")  # the names in an operand list `_FAST_OPERANDS_RE` matched
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
_verbatim_ok: set[tuple[str, str]] = set()  # verbatim attribute texts whose syntax was checked
_SIGNATURE_TOKEN_RE = re.compile(r"[()]|/\*")
_MESH_DEVICE_IDS_RE = re.compile(r"[ \t]*,[ \t]*device_ids=(?=\()")
_MLIR_START_RE = re.compile(r"(?:#loc\S*\s*=.*\n\s*)*(?:module\b|func\.func\b)")
#: Words XLA's lexer reads as keywords or types, never as a name written without '%' (hlo_lexer.cc).
LEXER_KEYWORDS = frozenset({"HloModule", "ENTRY", "ROOT", "true", "false", "inf", "nan", "maximal", "replicated",
                            "manual", "unknown", "last_tile_dim_replicate", "shard_as", "shard_like"}) | frozenset(DTYPES)
_HEADERLESS_ENTRY_RE = re.compile(r"ENTRY\s+%?([A-Za-z_][\w.\-]*)")
_SIMPLE_OPERANDS_RE = re.compile(r"\s*((?:%?[A-Za-z_][\w.\-]*\s*,\s*)*%?[A-Za-z_][\w.\-]*)?\s*\)")


def parse(text: str, filename: str | None = None, lenient: bool = False) -> Module:
    """Parse HLO module text into a Module, rejecting what XLA's HLO parser rejects.

    With `lenient=True` (modules from newer XLA versions), attributes and metadata keys XLA's parser would
    not accept are kept verbatim (`Raw`) instead: each is listed, with its file:line:col, in the module's
    `lenient_attributes` (an empty list otherwise), and a `LenientParseWarning` says so."""
    with collection_paused():  # parsing allocates many linked objects; collections mid-parse only cost time
        parser = _Parser(text, filename, lenient)
        module = parser.parse_module()
    module.lenient_attributes = parser.lenient_attributes
    if parser.lenient_attributes:
        shown = "; ".join(parser.lenient_attributes[:5])
        more = f" (and {len(parser.lenient_attributes) - 5} more)" if len(parser.lenient_attributes) > 5 else ""
        warnings.warn(f"kept {len(parser.lenient_attributes)} attribute(s) XLA's parser does not know verbatim: "
                      f"{shown}{more}", LenientParseWarning, stacklevel=2)
    return module


def parse_file(path: str | Path, lenient: bool = False) -> Module:
    """Parse the HLO module in a file (`lenient` as in `parse`)."""
    p = Path(path)
    return parse(p.read_text(), filename=str(p), lenient=lenient)


class LenientParseWarning(UserWarning):
    """`parse(..., lenient=True)` kept attributes XLA's parser does not know (listed in the message)."""


class _PendingOperands:
    """Operand references of one instruction, resolved when its computation ends: (name | (name, index) |
    Instruction, position) pairs."""

    __slots__ = ("inst", "refs", "control")

    def __init__(self, inst: Instruction, refs: list, control: list[tuple[str, int]]):
        self.inst = inst
        self.refs = refs
        self.control = control


#: The operands of an instruction `_Parser.fast_instructions` parsed: (instruction, plain operand names,
#: control predecessors, where its operand list starts).
_SimplePending = tuple[Instruction, list[str], list[tuple[str, int]], int]
_NO_REFS: list[str] = []  # never written: shared by the instructions without operands
_NO_CONTROL: list[tuple[str, int]] = []  # never written: shared by the instructions without attributes


class _Parser:
    def __init__(self, text: str, filename: str | None, lenient: bool = False):
        self.source = text  # what errors show
        self.text = blank_comments(text)  # what is parsed: comments are whitespace, offsets unchanged
        self.filename = filename
        self.lenient = lenient
        self.lenient_attributes: list[str] = []  # what lenient mode kept: "file:line:col: where key"
        self.pos = 0
        self.module: Module | None = None
        self.comp_refs: list[tuple[Instruction, str, Any, int]] = []
        self.elided = False  # some instruction was written without its result shape
        self.depth = 0  # nesting of inline operands and inline computations
        self.param_pos: dict[Instruction, int] = {}  # where each parameter's number is written
        self.elided_pos: dict[Instruction, int] = {}  # where each instruction without a result shape is
        self.declared_results: list[tuple[Computation, tuple[Any, int]]] = []  # signatures' result shapes
        self.written_shapes: list[tuple[str, Any, int]] = []  # operands written with a shape, in this body

    # ----------------------------------------------------------------- errors and tokens
    def error(self, message: str, pos: int | None = None) -> HloParseError:
        message = message.replace("\n", "\\n")  # one line, whatever the text it quotes (a layout may span lines)
        return HloParseError(message, self.source, self.pos if pos is None else pos, self.filename)

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

    def unknown_attribute(self, key: str, pos: int, where: str, allowed: frozenset[str] | set[str]) -> None:
        """An attribute XLA's parser does not accept here: an error, or (lenient) noted and kept."""
        if not self.lenient:
            raise self.error(f"unexpected attribute {key!r} {where}; expected one of {', '.join(sorted(allowed))}"
                             + _LENIENT_HINT, pos)
        line, col, _ = line_col(self.text, pos)
        self.lenient_attributes.append(f"{self.filename or '<text>'}:{line}:{col}: {key} {where}")

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            raise self.error(f"expected {what or repr(s)}")

    def name(self, what: str = "a name") -> str:
        self.skip()
        m = _NAME_RE.match(self.text, self.pos)
        if m is None:
            raise self.error(f"expected {what}")
        if m.group(1) in LEXER_KEYWORDS and not m.group().startswith("%") and \
                not self.text.startswith(":", m.end()):
            raise self.error(f"expected {what}: {m.group(1)!r} is a keyword to XLA's lexer (write %{m.group(1)})")
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
        if self.text.startswith("HloModule", self.pos):
            self.pos += len("HloModule")
            self.module = Module(self.name("the module name"))
            self.parse_header_attributes()
        else:
            self.module = Module(self.headerless_module_name())
        entry: Computation | None = None
        while True:
            self.skip()
            if self.pos >= len(self.text):
                break
            if self.text.startswith(_TRAILER_SECTIONS, self.pos):
                if self.module.computations or self.module.trailer:
                    raise self.error("the FileNames, FunctionNames, FileLocations and StackFrames sections come "
                                     "once, right after the HloModule line")
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
        self.check_declared_results()
        self.module._note_unnoted()
        return self.module

    def headerless_module_name(self) -> str:
        """A module written without its `HloModule` line starts with its ENTRY computation; XLA's parser then
        names it `module_<entry name>`."""
        m = _HEADERLESS_ENTRY_RE.match(self.text, self.pos)
        if m is None and _MLIR_START_RE.match(self.text, self.pos):
            raise self.error("this is StableHLO/MLIR text, not HLO: print HLO with jax's "
                             "`lowered.as_text(dialect='hlo')`, or convert it with "
                             "`hlopt.runtime.mlir_to_hlo_text(text)` (the hlopt command converts it itself)")
        if m is None:
            raise self.error("expected 'HloModule' at the start of the module (or, without that line, the "
                             "ENTRY computation)")
        return f"module_{m.group(1)}"

    def check_declared_results(self) -> None:
        """A signature's result shape must match the root's (layouts aside), as XLA's parser checks."""
        if not self.declared_results:
            return
        from hlopt.hlo.shape_inference import shapes_compatible

        for comp, (shape, pos) in self.declared_results:
            root = comp.root
            if root is not None and root.shape is not None and not shapes_compatible(root.shape, shape):
                raise self.error(f"computation {comp.name} declares result {shape.to_text(layout=False)} but its "
                                 f"root %{root.name} is {root.shape.to_text(layout=False)}", pos)

    def parse_header_attributes(self) -> None:
        config = self.module.config
        while self.peek(","):
            self.pos += 1
            self.skip()
            m = _KEY_RE.match(self.text, self.pos)
            if m is None:
                raise self.error("expected 'key=value' in the HloModule line")
            key = m.group(1)
            key_pos = self.pos
            self.pos = m.end()
            value, vpos = self.raw_value()
            if key in config:
                raise self.error(f"attribute {key!r} is given twice", key_pos)
            if key not in MODULE_ATTRS:
                self.unknown_attribute(key, key_pos, "in the HloModule line", MODULE_ATTRS)
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
                self.check_header_value(key, value, vpos)
                config[key] = Raw(value)

    def check_header_value(self, key: str, value: str, vpos: int) -> None:
        """Check the syntax of the header values XLA's parser checks (the value stays verbatim)."""
        if key == "entry_computation_layout":
            if not (value.startswith("{") and value.endswith("}")):
                raise self.error("expected '{(parameter shapes)->result shape}'", vpos)
            self.program_shape(value[1:-1], vpos + 1, "entry_computation_layout")
        elif key.startswith("allow_spmd_sharding_propagation_to_"):
            if not _BOOL_LIST_RE.fullmatch(value):
                raise self.error(f"expected true, false or a list such as {{true,false}} for {key}", vpos)

    def program_shape(self, text: str, offset: int, what: str) -> None:
        """`(shape, ...)->shape` (parameter names not allowed), as in entry_computation_layout."""
        pos = SKIP_RE.match(text, 0).end()
        if not text.startswith("(", pos):
            raise self.error(f"expected '(' to start the parameter shapes of {what}", offset + pos)
        pos = SKIP_RE.match(text, pos + 1).end()
        if not text.startswith(")", pos):
            while True:
                pos = self.shape_in(text, pos, offset)
                pos = SKIP_RE.match(text, pos).end()
                if text.startswith(",", pos):
                    pos = SKIP_RE.match(text, pos + 1).end()
                    continue
                if not text.startswith(")", pos):
                    raise self.error(f"expected ',' or ')' in the parameter shapes of {what}", offset + pos)
                break
        pos = SKIP_RE.match(text, pos + 1).end()
        if not text.startswith("->", pos):
            raise self.error(f"expected '->' and the result shape in {what}", offset + pos)
        pos = self.shape_in(text, pos + 2, offset, result=True)
        if text[pos:].strip():
            raise self.error(f"unexpected text after the result shape of {what}", offset + pos)

    def shape_in(self, text: str, pos: int, offset: int, result: bool = False) -> int:
        """A shape of entry_computation_layout. XLA's parser checks the layouts of a tuple result's elements
        there (and no others: a parameter's or an array result's are the verifier's)."""
        try:
            shape, end = parse_shape_at(text, pos)
        except ShapeParseError as e:
            raise self.error(str(e), offset + e.offset) from None
        problem = layout_problem(shape) if result and shape.is_tuple else None
        if problem:
            raise self.error(problem, offset + SKIP_RE.match(text, pos).end())
        return end

    def parse_trailer(self) -> None:
        """The stack-trace sections (all four, in XLA's order), kept verbatim in `module.trailer`."""
        start = self.pos
        for section, keys in _TRAILER_ENTRIES:
            self.skip()
            if not (self.text.startswith(section, self.pos) and
                    not _NAME_CHAR_RE.match(self.text, self.pos + len(section))):
                raise self.error(f"expected {section!r} (FileNames, FunctionNames, FileLocations and StackFrames "
                                 "come together, in this order)")
            self.pos += len(section)
            while True:
                self.skip()
                m = _SIGNED_INT_RE.match(self.text, self.pos)
                if m is None:
                    break
                self.pos = m.end()
                self.skip()
                if keys is None:  # `id "name"`; XLA's parser takes a missing name as ""
                    q = STRING_RE.match(self.text, self.pos)
                    if q is not None:
                        self.pos = q.end()
                else:
                    self.sub_attributes(keys, f"in a {section} entry")
        self.module.trailer += self.text[start : self.pos].strip() + "\n\n"

    def sub_attributes(self, keys: frozenset[str], where: str) -> None:
        """`{key=int key=int ...}` with every key of `keys` exactly once (commas between items optional)."""
        self.expect("{", f"'{{' to start the sub-attributes {where}")
        seen: set[str] = set()
        while True:
            self.skip()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                break
            m = _SUB_KEY_RE.match(self.text, self.pos)
            if m is None:
                raise self.error(f"expected a sub-attribute name or '}}' {where}")
            key = m.group()
            if key not in keys:
                raise self.error(f"unexpected sub-attribute {key!r} {where}; expected {', '.join(sorted(keys))}")
            if key in seen:
                raise self.error(f"sub-attribute {key!r} is given twice {where}")
            seen.add(key)
            self.pos = m.end()
            if not self.text.startswith("=", self.pos):
                raise self.error(f"expected '=' right after {key}")
            self.pos += 1
            self.skip()
            v = _SIGNED_INT_RE.match(self.text, self.pos)
            if v is None:
                raise self.error(f"expected an integer for {key}")
            self.pos = v.end()
            if self.accept(",") and self.peek("}"):
                raise self.error(f"expected a sub-attribute name after ',' {where}")
        missing = sorted(keys - seen)
        if missing:
            raise self.error(f"sub-attribute(s) {', '.join(missing)} missing {where}", self.pos - 1)

    # ----------------------------------------------------------------- computations
    def parse_computation(self) -> tuple[Computation, bool]:
        is_entry = False
        if self.text.startswith("ENTRY", self.pos) and self.text[self.pos + 5 : self.pos + 6] in (" ", "\t", "%", "\n"):
            is_entry = True
            self.pos += 5
        name = self.name("a computation name or 'ENTRY'")
        result = self.signature() if self.peek("(") else None
        self.expect("{", "'{' to start the computation body")
        comp = Computation(name)
        self.module.add_computation(comp)
        self.parse_body(comp)
        if result is not None:
            self.declared_results.append((comp, result))
        if self.peek(","):
            save = self.pos
            self.pos += 1
            self.skip()
            m = _KEY_RE.match(self.text, self.pos)
            if m and m.group(1) == "execution_thread":
                self.pos = m.end()
                value, vpos = self.raw_value()
                try:
                    comp.execution_thread = parse_typed("custom_call_target", value)
                except ValueError as e:
                    raise self.error(f"bad execution_thread of computation {comp.name}: {e}", vpos) from None
            else:
                self.pos = save
        return comp, is_entry

    def signature(self) -> tuple[Any, int]:
        """`(name: shape, ...) -> shape`: the declared result shape and where it is (the parameters' own
        shapes are authoritative, as in XLA)."""
        self.expect("(")
        if not self.accept(")"):
            while True:
                self.skip()
                m = _PARAM_NAME_RE.match(self.text, self.pos)  # XLA's lexer: `name:` is one token
                if m is None:
                    raise self.error("expected a parameter name (written `name: shape`)")
                self.pos = m.end()
                self.skip()
                self.shape()
                if self.accept(","):
                    continue
                self.expect(")", "',' or ')' in the parameter list")
                break
        self.expect("->", "'->' and the result shape after the parameter list")
        self.skip()
        pos = self.pos
        return self.shape(), pos

    def parse_body(self, comp: Computation) -> None:
        """Parse instructions up to the closing '}' and resolve their operands."""
        names: dict[str, Instruction] = {}
        pending: list[_PendingOperands | _SimplePending] = []
        outer_written, self.written_shapes = self.written_shapes, []
        root: Instruction | None = None
        last: Instruction | None = None
        while True:
            root, last = self.fast_instructions(comp, names, pending, root, last)
            self.skip()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                break
            if self.pos >= len(self.text):
                raise self.error("expected '}' to close the computation (or another instruction)")
            start = self.pos
            inst, is_root = self.parse_instruction(comp, names, pending)
            if is_root:
                if root is not None:
                    raise self.error(f"computation {comp.name} has two ROOT instructions", start)
                root = inst
            last = inst
        if last is None:
            raise self.error(f"computation {comp.name} has no instructions")
        self.check_parameter_numbers(comp, names)
        self.resolve_operands(comp, names, pending)
        self.check_written_operand_shapes(names)
        self.written_shapes = outer_written
        comp.set_root(root or last)
        comp._stamp_parsed()

    def check_written_operand_shapes(self, names: dict[str, Instruction]) -> None:
        """An operand written with its shape (`f32[4] %x`) must have that shape, layouts aside (as in XLA)."""
        if not self.written_shapes:
            return
        from hlopt.hlo.shape_inference import shapes_compatible

        for ref, shape, pos in self.written_shapes:
            target = names.get(ref)
            if target is not None and target.shape is not None and not shapes_compatible(shape, target.shape):
                raise self.error(f"operand %{ref} is written as {shape.to_text(layout=False)} but is "
                                 f"{target.shape.to_text(layout=False)}", pos)

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

    def fast_instructions(
        self, comp: Computation, names: dict[str, Instruction], pending: list, root: Instruction | None,
        last: Instruction | None,
    ) -> tuple[Instruction | None, Instruction | None]:
        """The run of common instructions (array shape, plain operand names, one regex match each) at the
        current position, added to `comp`; returns the (root, last instruction) so far. It stops before the
        first line that is anything else, or wrong: `parse_instruction` parses that one and reports errors.
        Operands defined above are taken at once while nothing of the body waits in `pending` (a name defined
        further down, control predecessors, an instruction `parse_instruction` parsed); from then on every
        instruction waits for `resolve_operands`, so that each instruction's users come in the order of the
        text either way."""
        text = self.text
        match = _FAST_INST_RE.match
        match_line = _FAST_LINE_RE.match
        run: list[Instruction] = []  # added to comp at the end of the run
        note = self.module._unnoted.append
        while True:
            m = match_line(text, self.pos)
            if m is None:  # a comment before the line, or a line of another kind
                pos = self.pos
                if text[pos : pos + 1] in _SKIP_START:
                    pos = self.pos = SKIP_RE.match(text, pos).end()
                m = match(text, pos)
                if m is None:
                    break
            root_kw, name, bare_name, shape_text, opcode, inner = m.groups()
            name = name or bare_name
            if name in names or name in DTYPES or name == "ROOT" or bare_name in LEXER_KEYWORDS or \
                    (opcode not in OPCODES and not is_known_opcode(opcode)):
                break
            shape = _shape_cache.get(shape_text)
            if shape is None:
                try:
                    shape = parse_shape(shape_text)
                except ShapeParseError:
                    break
            refs: list[str] = _NO_REFS
            ops: list[Instruction] | None = None
            if opcode == "parameter" or opcode == "constant":
                inst = self.fast_leaf(m, opcode, shape, name, inner)
                if inst is None:
                    break
            elif inner[:1] == "%" and inner.count("%") == inner.count(",") + 1 and \
                    (ops := self.defined_operands(refs := inner[1:].split(", %"), names)) is not None:
                inst = Instruction(opcode, shape, name=name)  # operands as XLA prints them, all defined above
            elif _FAST_OPERANDS_RE.fullmatch(inner):
                inst = Instruction(opcode, shape, name=name)
                refs = _OPERAND_NAMES_RE.findall(inner)  # validated above: names, '%', commas, blanks
            else:
                break
            end = self.pos = m.end()
            control: list[tuple[str, int]] = _NO_CONTROL
            if text[end : end + 1] != "\n":
                control = []
                self.parse_attributes(inst, control, comp)
            if opcode in REQUIRED_ATTRS:
                self.check_required_attributes(inst, m.start(5))
            run.append(inst)
            note(name)
            if pending or control:  # after a deferred instruction, all are: users keep the instructions' order
                pending.append((inst, refs, control, m.start(6)))
            elif ops is not None:
                inst._take_parsed_operands(ops, len(refs) < 2 or len(set(refs)) == len(refs))
            elif refs:
                try:
                    ops = [names[r] for r in refs]
                except KeyError:  # a name defined further down (or not at all): resolved at the end
                    pending.append((inst, refs, control, m.start(6)))
                else:
                    inst._take_parsed_operands(ops, len(refs) < 2 or len(set(refs)) == len(refs))
            names[name] = inst
            if root_kw is not None:
                if root is not None:
                    raise self.error(f"computation {comp.name} has two ROOT instructions", m.start(1))
                root = inst
            last = inst
        if run:
            comp._extend_parsed(run)
        return root, last

    @staticmethod
    def defined_operands(refs: list[str], names: dict[str, Instruction]) -> list[Instruction] | None:
        """The instructions `refs` name, if all are defined above (None otherwise). `refs` is an operand list
        `%a, %b` split at ", %": when each piece is a defined name, the text was exactly that form."""
        try:
            return [names[r] for r in refs]
        except KeyError:
            return None

    def fast_leaf(self, m: re.Match, opcode: str, shape: Any, name: str, inner: str) -> Instruction | None:
        """A parameter or constant line `fast_instructions` matched (`m`): its instruction, or None if the
        number or literal is anything unusual."""
        if opcode == "parameter":
            if not _INT_RE.fullmatch(inner):
                return None
            inst = Instruction(opcode, shape, name=name, parameter_number=int(inner))
            self.param_pos[inst] = m.start(6)
            return inst
        if not _FAST_LITERAL_RE.fullmatch(inner) or not inner.strip():
            return None
        return Instruction(opcode, shape, name=name, literal=self.parse_literal(m.start(6), m.end(6), shape))

    def parse_instruction(
        self, comp: Computation, names: dict[str, Instruction], pending: list
    ) -> tuple[Instruction, bool]:
        is_root = False
        if self.text.startswith("ROOT", self.pos) and self.text[self.pos + 4 : self.pos + 5] in (" ", "\t", "%"):
            is_root = True
            self.pos += 4
        self.skip()
        name_pos = self.pos
        name = self.name("an instruction name")
        if self.text.startswith(":", self.pos) and not self.text.startswith("%", name_pos):
            self.pos += 1  # XLA's lexer reads `name:` as one name token
        if self.text.startswith("=", self.pos) and not self.text.startswith("%", name_pos):
            raise self.error("expected a space or '%' before '=': XLA reads `name=` as an attribute name", name_pos)
        if name in DTYPES:
            raise self.error(f"illegal instruction name {name!r}: it is a primitive type (XLA rejects it)", name_pos)
        if name in names:
            raise self.error(f"instruction %{name} is defined twice in {comp.name}", name_pos)
        self.expect("=", "'=' after the instruction name")
        inst = self.parse_instruction_rhs(comp, names, pending, name)
        names[name] = inst
        return inst, is_root

    def parse_instruction_rhs(
        self, comp: Computation, names: dict[str, Instruction], pending: list, name: str
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
            mm = _SIGNED_INT_RE.match(self.text, self.pos)
            if mm is None:
                raise self.error("expected the parameter number")
            if int(mm.group()) < 0:
                raise self.error("parameter number must be >= 0")
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
            inst.attrs["literal"] = self.parse_literal(lit_start, end, shape)
            self.pos = end + 1
        else:
            refs = self.parse_operands(comp, names, pending)
        control: list[tuple[str, int]] = []
        self.parse_attributes(inst, control, comp)
        self.check_required_attributes(inst, op_pos)
        comp.add(inst)
        pending.append(_PendingOperands(inst, refs, control))
        return inst

    def check_required_attributes(self, inst: Instruction, op_pos: int) -> None:
        """The attributes XLA's parser requires on this opcode are all there."""
        missing = REQUIRED_ATTRS.get(inst.opcode, frozenset()).difference(inst.attrs)
        if missing:
            raise self.error(f"expected attribute(s) {', '.join(sorted(missing))} (required on {inst.opcode})", op_pos)

    def parse_literal(self, start: int, end: int, shape: Any) -> Literal:
        """The literal written in `text[start:end]` (inside `constant(...)`), checked against its shape as XLA's
        parser checks it; the one place constants' values are read."""
        text = self.text[start:end]
        try:
            check_literal_text(text, shape)
        except LiteralSyntaxError as e:
            raise self.error(f"bad literal for {shape.to_text(layout=False)}: {e}", start + e.offset) from None
        return Literal(text, shape)

    def parse_operands(
        self, comp: Computation, names: dict[str, Instruction], pending: list
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
        while True:
            self.skip()
            if self.text.startswith(",", self.pos):  # XLA's parser skips empty items: `f(a,, b)`, `f(,a)`
                self.pos += 1
                continue
            if self.accept(")"):
                return refs
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
                    if op_shape is not None:
                        self.written_shapes.append((ref, op_shape, ref_pos))
                    if self.text.startswith(":", self.pos) and self.text[ref_pos] != "%":
                        self.pos += 1  # XLA's lexer reads `name:` as one name token (as in signatures)
            if self.accept(","):
                continue
            self.expect(")", "',' or ')' in the operand list")
            return refs

    def parse_inline_operand(
        self, comp: Computation, names: dict[str, Instruction], pending: list, shape
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
            inst.attrs["literal"] = self.parse_literal(self.pos, end, shape)
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
        allowed = _allowed_attributes(inst.opcode)
        while True:
            m = fast(text, self.pos)
            if m is not None:
                key, value = m.groups()
                if key in attrs or (allowed is not None and key not in allowed) or \
                        (key in _SLOW_KEYS and not self.fast_computation_ref(inst, key, value, m.start(2))):
                    m = None  # the general path below reports it / handles it
                else:
                    self.pos = m.end()
                    if key not in _SLOW_KEYS:
                        _store(attrs, key, self.fast_value(key, value, m.start(2)))
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
            if allowed is not None and key not in allowed:
                self.unknown_attribute(key, key_pos, f"on {inst.opcode}", allowed)
                attrs[key] = Raw(self.raw_value()[0])
                continue
            if key in COMPUTATION_ATTRS and text.startswith("{", self.pos):
                attrs[key] = self.parse_inline_computation()
                continue
            if key in COMPUTATION_LIST_ATTRS and text.startswith("{", SKIP_RE.match(text, self.pos + 1).end()):
                attrs[key] = self.parse_inline_computation_list()
                continue
            value, vpos = self.raw_value()
            if key == "replica_groups" and value.startswith("mesh["):
                value = self.mesh_device_ids(value, vpos)
            if key in COMPUTATION_ATTRS:
                attrs[key] = None
                self.comp_refs.append((inst, key, value.lstrip("%"), vpos))
            elif key in COMPUTATION_LIST_ATTRS:
                if not _NAME_LIST_RE.fullmatch(value):
                    raise self.error("expected '{%comp, ...}'", vpos)
                names = [v.strip().lstrip("%") for v in value[1:-1].split(",") if v.strip()]
                attrs[key] = []
                self.comp_refs.append((inst, key, names, vpos))
            elif key == "control-predecessors":
                if not _NAME_LIST_RE.fullmatch(value):
                    raise self.error("expected '{%inst, ...}'", vpos)
                control.extend((v.strip().lstrip("%"), vpos) for v in value[1:-1].split(",") if v.strip())
            elif key == "metadata":
                attrs[key] = self.typed(key, value, vpos)
            elif key in _RAW_KEYS:
                attrs[key] = self.verbatim(key, value, vpos)
            else:
                attrs[key] = self.typed(key, value, vpos)

    def fast_computation_ref(self, inst: Instruction, key: str, value: str, vpos: int) -> bool:
        """A `_FAST_ATTR_RE` match of a key the fast path leaves to the general one: taken here (True) when it
        names one computation (`to_apply=%comp`), as the general path would take it."""
        if key not in COMPUTATION_ATTRS or value[0] in _NOT_A_NAME_START:
            return False
        _store(inst.attrs, key, None)
        self.comp_refs.append((inst, key, value.lstrip("%"), vpos))
        return True

    def fast_value(self, key: str, value: str, vpos: int) -> Any:
        """The value of a simple attribute (`_FAST_ATTR_RE`): verbatim or typed, from the caches if there."""
        if key in _RAW_KEYS:
            return self.verbatim(key, value, vpos)
        cached = _typed_cache.get((key, value))
        if cached is not None and key not in _MUTABLE_TYPED:
            return cached
        return self.typed(key, value, vpos)

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
            result = self.lenient_metadata(value) if self.lenient and key == "metadata" else None
            if result is None:
                hint = "" if self.lenient or "unknown metadata key" not in str(e) else _LENIENT_HINT
                raise self.error(f"bad value for attribute {key!r}: {e}{hint}", vpos) from None
            for k in result:
                if k not in METADATA_KEYS:
                    self.unknown_attribute(k, vpos, "in metadata", frozenset(METADATA_KEYS))
            return result
        if len(_typed_cache) < 100_000:
            _typed_cache[(key, value)] = result
            if key in _MUTABLE_TYPED:  # dicts: every instruction gets its own copy
                return result.copy()
        return result

    def verbatim(self, key: str, value: str, vpos: int) -> Raw:
        """An attribute kept as text, once its syntax is checked as XLA's parser checks it."""
        if (key, value) not in _verbatim_ok:
            try:
                check_verbatim(key, value)
            except ValueError as e:
                if not self.lenient:
                    raise self.error(f"bad value for attribute {key!r}: {e}", vpos) from None
                self.unknown_attribute(key, vpos, f"with a value XLA's parser would reject ({e})", frozenset())
                return Raw(value)
            if len(_verbatim_ok) < 100_000:
                _verbatim_ok.add((key, value))
        return Raw(value)

    @staticmethod
    def lenient_metadata(value: str) -> Any:
        """Metadata with keys XLA does not know kept; None if it is malformed even so."""
        try:
            result = parse_typed("metadata", value, lenient=True)
        except (ValueError, IndexError):
            return None
        return result if any(k not in METADATA_KEYS for k in result) else None

    def parse_inline_computation(self) -> Computation:
        self.enter(self.pos)
        self.pos += 1  # '{'
        comp = Computation(self.module.unique_name("_"))
        comp.is_inline = True
        self.module.add_computation(comp)
        self.parse_body(comp)
        self.depth -= 1
        return comp

    def parse_inline_computation_list(self) -> list[Computation]:
        """`{ {...}, {...} }`: computations written inline in a list (XLA's canonical print of branches)."""
        self.pos += 1  # '{'
        comps: list[Computation] = []
        while True:
            self.skip()
            if not self.text.startswith("{", self.pos):
                raise self.error("expected '{' to start an inline computation (a list is written all inline "
                                 "or all by name)")
            comps.append(self.parse_inline_computation())
            if self.accept(","):
                continue
            self.expect("}", "',' or '}' after an inline computation")
            return comps

    # ----------------------------------------------------------------- resolution
    def resolve_operands(
        self, comp: Computation, names: dict[str, Instruction], pending: list
    ) -> None:
        for p in pending:
            if type(p) is tuple:  # _SimplePending
                inst, refs, control, at = p
                try:
                    ops = [names[r] for r in refs]
                except KeyError:
                    ref = next(r for r in refs if r not in names)
                    where = re.compile(r"%?" + re.escape(ref) + r"(?![\w.\-])").search(self.text, at)
                    raise self.error(f"operand %{ref} is not defined in computation {comp.name}",
                                     where.start() if where else at) from None
                inst._take_parsed_operands(ops, len(refs) < 2 or len(set(refs)) == len(refs))
                for ref, pos in control:
                    target = names.get(ref)
                    if target is None:
                        raise self.error(f"control predecessor %{ref} is not defined in {comp.name}", pos)
                    target.add_control_successor(inst)
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

_allowed_cache: dict[str, frozenset[str] | None] = {}


def _allowed_attributes(opcode: str) -> frozenset[str] | None:
    """The attributes XLA's parser accepts on `opcode` (None: not checked), cached per opcode."""
    try:
        return _allowed_cache[opcode]
    except KeyError:
        result = _allowed_cache[opcode] = allowed_attributes(opcode)
        return result


#: Writes attributes of instructions being parsed without stamping them (`Computation._stamp_parsed` does).
_store = dict.__setitem__
#: First characters of `_FAST_ATTR_RE` values that are not a computation's name.
_NOT_A_NAME_START = frozenset('{"')
#: Attributes the fast attribute path leaves to the general one (computations, lists of names, control edges).
_SLOW_KEYS = COMPUTATION_ATTRS | COMPUTATION_LIST_ATTRS | {"control-predecessors"}

_ = STRING_RE  # re-exported for attribute helpers
