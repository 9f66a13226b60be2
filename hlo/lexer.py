"""Low-level scanning helpers shared by the parser and attribute parsers."""

from __future__ import annotations

import re

__all__ = ["SKIP_RE", "STRING_RE", "value_end", "split_top_level", "line_col", "blank_comments"]

#: Whitespace and comments (`/* ... */`, `// ...`).
SKIP_RE = re.compile(r"(?:[ \t\r\n]+|/\*.*?\*/|//[^\n]*)*", re.S)
#: A double-quoted, C-escaped string.
STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_STRUCT_RE = re.compile(r'[,\n{}\[\]()"/]')
#: A string (kept) or a comment (dropped), for `blank_comments`.
_STRING_OR_COMMENT_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|/\*.*?\*/|//[^\n]*', re.S)
_COMMENT_START_RE = re.compile(r"/[*/]")
_OPEN = frozenset("{[(")
_INLINE_NEXT_INSTRUCTION_RE = re.compile(r"[ \t]+(?:ROOT[ \t]+)?%?[A-Za-z_][\w.\-]*:?[ \t]*=[ \t]*[a-z(]")
_NEXT_INSTRUCTION_RE = re.compile(r"[ \t]*(?:ROOT[ \t]+)?%?[A-Za-z_][\w.\-]*[ \t]*=[ \t]*[a-z(]")
_CLOSE = frozenset("}])")
_CLOSER = {"{": "}", "[": "]", "(": ")"}


class UnterminatedError(ValueError):
    """A string or bracket that never closes; `.offset` is where it opened."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def value_end(text: str, pos: int) -> int:
    """End of an attribute value starting at `pos`: the first top-level ',' or newline, an unmatched closer, or
    the start of the next instruction on the same line (XLA's parser reads tokens, not lines). Inside braces
    only braces nest: `{mesh = #sdy.mesh<["i"=8]>}` is one value whatever its other brackets (as XLA reads a
    braced dictionary)."""
    depth = braces = 0
    search = _STRUCT_RE.search
    opened: list[int] = []
    top = pos  # where the current stretch outside brackets starts
    while True:
        m = search(text, pos)
        if m is None:
            if depth:
                raise _unbalanced(text, opened[-1])
            return _before_next_instruction(text, top, len(text))
        c = m.group()
        p = m.start()
        if c == '"':
            s = STRING_RE.match(text, p)
            if s is None:
                raise UnterminatedError("expected '\"' to end this string (unterminated string)", p)
            pos = s.end()
            continue
        if c == "/":
            end = _comment_end(text, p)
            if end is None:  # a lone '/' is part of the value
                pos = p + 1
                continue
            if depth == 0 and text.startswith("//", p):
                return _before_next_instruction(text, top, p)  # a line comment after the value ends it
            pos = end
            continue
        if braces and c in "[]()":
            pos = p + 1
            continue
        if c in _OPEN:
            if depth == 0:
                end = _before_next_instruction(text, top, p)
                if end != p:
                    return end
            depth += 1
            braces += c == "{"
            opened.append(p)
        elif c in _CLOSE:
            if depth == 0:
                return _before_next_instruction(text, top, p)
            depth -= 1
            braces -= c == "}"
            opened.pop()
            top = p + 1
        elif depth == 0:
            return _before_next_instruction(text, top, p)
        elif c == "\n" and _NEXT_INSTRUCTION_RE.match(text, p + 1):
            raise _unbalanced(text, opened[-1])
        pos = p + 1


def _before_next_instruction(text: str, start: int, end: int) -> int:
    """`end`, or where an instruction starts in `text[start:end]` (after the value, on the same line)."""
    if end - start < 4 or (" " not in text[start:end] and "\t" not in text[start:end]):
        return end
    m = _INLINE_NEXT_INSTRUCTION_RE.search(text, start, end)
    return m.start() if m is not None else end


def _comment_end(text: str, pos: int) -> int | None:
    """End of the comment starting at `pos` (None if none starts there); XLA's lexer skips comments anywhere."""
    if text.startswith("/*", pos):
        end = text.find("*/", pos + 2)
        if end < 0:
            raise UnterminatedError("expected '*/' to end this comment (unterminated comment)", pos)
        return end + 2
    if text.startswith("//", pos):
        end = text.find("\n", pos)
        return len(text) if end < 0 else end
    return None


def blank_comments(text: str) -> str:
    """`text` with every comment outside strings overwritten by spaces (newlines kept), so that offsets, lines
    and columns stay those of `text`. XLA's lexer skips comments between any two tokens (its printer writes
    `/*index=5*/` inside shapes, operand lists and shardings); the parser then sees only whitespace."""
    first = _COMMENT_START_RE.search(text)
    if first is None:
        return text
    pieces: list[str] = []
    last = 0
    for m in _STRING_OR_COMMENT_RE.finditer(text, text.rfind("\n", 0, first.start()) + 1):
        if m.group().startswith('"'):
            continue
        pieces.append(text[last:m.start()])
        pieces.append(re.sub(r"[^\n]", " ", m.group()))
        last = m.end()
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


def _unbalanced(text: str, pos: int) -> UnterminatedError:
    closer = _CLOSER[text[pos]]
    return UnterminatedError(f"expected {closer!r} to close this {text[pos]!r} (unbalanced bracket in attribute value)",
                             pos)


def split_top_level(text: str, sep: str = ",", braces_only: bool = False) -> list[str]:
    """Split on `sep` outside brackets (only `{}` with `braces_only`) and strings."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(text)
    opens, closes = ("{", "}") if braces_only else (_OPEN, _CLOSE)
    while i < n:
        c = text[i]
        if c == '"':
            m = STRING_RE.match(text, i)
            i = m.end() if m else n
            continue
        if c in opens:
            depth += 1
        elif c in closes:
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def line_col(text: str, pos: int) -> tuple[int, int, str]:
    """1-based line and column of `pos`, and that line's text."""
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    if end < 0:
        end = len(text)
    return line, pos - start + 1, text[start:end]
