"""A syntax check of the text of a `constant(...)` literal against its shape, as XLA's HLO parser checks it:
nesting as deep as the rank, as many elements per dimension as the shape has, and values of the element
type (integers for integer types, true/false or 0/1 for pred, `(re, im)` pairs for complex).

    >>> check_literal_text("{{1, 2}, {3, 4}}", parse_shape("f32[2,2]"))
    >>> try:
    ...     check_literal_text("{1, 2, 3}", parse_shape("f32[2]"))
    ... except LiteralSyntaxError as e:
    ...     print(e)
    expected 2 element(s) in this dimension of f32[2], got 3
"""

from __future__ import annotations

import re

from hlopt.hlo.shape import DTYPES, AnyShape, Shape, parse_shape

__all__ = ["check_literal_text", "LiteralSyntaxError"]

_ = parse_shape  # used by the doctest

_TOKEN_RE = re.compile(
    r"(?P<skip>\s+|/\*.*?\*/)|(?P<punct>[{}(),])|(?P<elided>\.\.\.)"
    r"|(?P<value>-?(?:inf|nan(?:\(0x[0-9a-fA-F]+\))?)|true|false"
    r"|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|-\.\d+(?:[eE][-+]?\d+)?)",  # `-.5` as XLA's lexer reads it; `.5` not
    re.S,
)
_INT_RE = re.compile(r"-?\d+")


class LiteralSyntaxError(ValueError):
    """A literal XLA's parser would reject; `.offset` is where in the literal text."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def check_literal_text(text: str, shape: AnyShape) -> None:
    """Raise LiteralSyntaxError if XLA's parser would reject `text` as a literal of `shape`.

    `{...}` (values elided by the printer) passes: whether such a module may be used is decided elsewhere."""
    tokens = _tokens(text)
    if [t for _, t in tokens] in (["{", "...", "}"], []):
        if tokens:
            return
        raise LiteralSyntaxError("expected a literal", 0)
    end = _Reader(tokens, text).literal(0, shape)
    if end != len(tokens):
        raise LiteralSyntaxError(f"unexpected {tokens[end][1]!r} after the literal", tokens[end][0])


def _tokens(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            raise LiteralSyntaxError(f"unexpected {text[pos:pos + 12]!r} in a literal", pos)
        if m.lastgroup != "skip":
            out.append((pos, m.group()))
        pos = m.end()
    return out


def _int_fits(value: int, dtype: str) -> bool:
    """Whether an integer literal value is in the range of the integer type."""
    dt = DTYPES[dtype]
    if dt.kind == "uint":
        return 0 <= value < 1 << dt.bits
    return -(1 << (dt.bits - 1)) <= value < 1 << (dt.bits - 1)


class _Reader:
    def __init__(self, tokens: list[tuple[int, str]], text: str):
        self.tokens = tokens
        self.text = text
        self.dtype = ""

    def at(self, i: int) -> str:
        return self.tokens[i][1] if i < len(self.tokens) else ""

    def fail(self, i: int, message: str) -> LiteralSyntaxError:
        offset = self.tokens[i][0] if i < len(self.tokens) else len(self.text)
        return LiteralSyntaxError(message, offset)

    def expect(self, i: int, token: str, what: str) -> int:
        if self.at(i) != token:
            raise self.fail(i, f"expected {token!r} {what}, got {self.at(i) or 'the end'!r}")
        return i + 1

    def literal(self, i: int, shape: AnyShape) -> int:
        """Check one literal of `shape` starting at token i; the index after it."""
        if shape.is_tuple:
            i = self.expect(i, "(", "to start a tuple literal")
            for k, element in enumerate(shape.elements):
                if k:
                    i = self.expect(i, ",", "between the elements of a tuple literal")
                i = self.literal(i, element)
            return self.expect(i, ")", "to end a tuple literal")
        if not shape.is_array:
            return len(self.tokens)  # token / opaque literals: not checked
        if shape.rank and self.at(i) != "{" and shape.numel == 1:
            return self.scalar(i, shape)  # XLA reads a lone value for a one-element array
        return self.nested(i, shape, 0)

    def nested(self, i: int, shape: Shape, depth: int) -> int:
        if depth == shape.rank:
            return self.scalar(i, shape)
        i = self.expect(i, "{", f"(nested array of rank {shape.rank} for {shape.to_text(layout=False)})")
        count = 0
        while self.at(i) != "}":
            if count and self.at(i) == ",":
                i += 1
                if self.at(i) == "}":
                    break  # XLA accepts a trailing comma
            i = self.nested(i, shape, depth + 1)
            count += 1
        size = shape.dims[depth]
        if count != size and not (shape.is_dynamic_dim(depth) and count <= size):
            raise self.fail(i, f"expected {size} element(s) in this dimension of "
                               f"{shape.to_text(layout=False)}, got {count}")
        return i + 1

    def scalar(self, i: int, shape: Shape) -> int:
        self.dtype = shape.dtype
        kind = DTYPES[shape.dtype].kind
        if kind == "complex":
            i = self.expect(i, "(", "to start a complex value (re, im)")
            i = self.number(i, "float")
            i = self.expect(i, ",", "between the parts of a complex value")
            i = self.number(i, "float")
            return self.expect(i, ")", "to end a complex value")
        return self.number(i, kind)

    def number(self, i: int, kind: str) -> int:
        tok = self.at(i)
        if tok in ("", "{", "}", "(", ")", ",", "..."):
            raise self.fail(i, f"expected a value, got {tok or 'the end'!r}")
        if kind == "pred":
            ok = tok in ("true", "false", "0", "1")
        elif kind in ("sint", "uint"):
            ok = bool(_INT_RE.fullmatch(tok)) and _int_fits(int(tok), self.dtype)
        else:
            ok = tok not in ("true", "false")
        if not ok:
            wanted = {"pred": "true or false", "sint": f"an integer that fits {self.dtype}",
                      "uint": f"a non-negative integer that fits {self.dtype}"}
            raise self.fail(i, f"expected {wanted.get(kind, 'a number')}, got {tok!r}")
        return i + 1
