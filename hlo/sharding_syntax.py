"""A syntax check of `sharding={...}` text as XLA's HLO parser reads it (hlopt keeps shardings verbatim).

    >>> check_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    >>> check_sharding("{devices=[8,1]<[8]}")
    Traceback (most recent call last):
    ...
    ValueError: expected '<=[...]' or a device list after devices=[8,1], got '<[8]}'
"""

from __future__ import annotations

import re

__all__ = ["check_sharding", "tuple_sharding_size"]

_SKIP_RE = re.compile(r"(?:\s+|/\*.*?\*/)*", re.S)  # XLA's lexer skips comments (`/*index=5*/`)
_WORDS = frozenset({"replicated", "maximal", "manual", "unknown", "unreduced", "last_tile_dim_replicate"})
_WORD_RE = re.compile(r"[A-Za-z_][\w\-]*")
_INTS_RE = re.compile(r"\[\s*\d+\s*(?:,\s*\d+\s*)*\]")
_DEVICE_LIST_RE = re.compile(r"\s*\d+\s*(?:,\s*\d+\s*)*")
_TRANSPOSE_RE = re.compile(r"T\(\s*\d+\s*(?:,\s*\d+\s*)*\)")
_INT_RE = re.compile(r"\s*-?\d+")
_LAST_TILE_DIMS_RE = re.compile(r"\{\s*(?:[a-z_]+\s*(?:,\s*[a-z_]+\s*)*)?\}")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def check_sharding(text: str) -> None:
    """Raise ValueError (saying what was expected) if XLA's parser would reject this sharding."""
    pos = _sharding(text, 0)
    if text[pos:].strip():
        raise ValueError(f"unexpected text after the sharding: {text[pos:pos + 30]!r}")


def tuple_sharding_size(text: str) -> int | None:
    """How many leaf shardings a tuple sharding `{{...}, {...}}` lists (None for a single sharding)."""
    pos = _SKIP_RE.match(text, 0).end() + 1
    pos = _SKIP_RE.match(text, pos).end()
    if not text.startswith("{", pos):
        return None
    count = 0
    while True:
        count += 1
        pos = _SKIP_RE.match(text, _sharding(text, pos)).end()
        if not text.startswith(",", pos):
            return count
        pos += 1


def _sharding(text: str, pos: int) -> int:
    pos = _SKIP_RE.match(text, pos).end()
    if not text.startswith("{", pos):
        raise ValueError(f"expected '{{' to start a sharding, got {text[pos:pos + 30]!r}")
    pos = _SKIP_RE.match(text, pos + 1).end()
    if text.startswith("{", pos):  # a tuple sharding: {{...}, {...}}
        while True:
            pos = _SKIP_RE.match(text, _sharding(text, pos)).end()
            if text.startswith(",", pos):
                pos += 1
                continue
            break
    else:
        pos = _single(text, pos)
    if not text.startswith("}", pos):
        raise ValueError(f"expected '}}' to end the sharding, got {text[pos:pos + 30]!r}")
    return pos + 1


def _single(text: str, pos: int) -> int:
    """The items of one (non-tuple) sharding, up to its closing brace."""
    while True:
        pos = _SKIP_RE.match(text, pos).end()
        if pos >= len(text) or text[pos] == "}":
            return pos
        m = _WORD_RE.match(text, pos)
        if m is None:
            raise ValueError(f"expected a sharding item, got {text[pos:pos + 30]!r}")
        word, pos = m.group(), m.end()
        if word in _WORDS:
            continue
        if word in ("shard_as", "shard_like"):
            pos = _expect(_INT_RE, text, pos, f"an integer after {word}")
            continue
        if not text.startswith("=", pos):
            raise ValueError(f"unknown sharding item {word!r}")
        pos += 1
        if word == "device":
            pos = _expect(_INT_RE, text, pos, "an integer after device=")
        elif word == "devices":
            pos = _devices(text, pos)
        elif word == "last_tile_dims":
            pos = _expect(_LAST_TILE_DIMS_RE, text, pos, "{manual, replicated, ...} after last_tile_dims=")
        elif word == "metadata":
            pos = _balanced(text, pos)
        else:
            raise ValueError(f"unknown sharding item {word!r}")


def _devices(text: str, pos: int) -> int:
    start = pos
    pos = _expect(_INTS_RE, text, pos, "[dimensions] after devices=")
    if text.startswith("<=", pos):
        pos = _expect(_INTS_RE, text, pos + 2, "[dimensions] after '<='")
        if text.startswith("T", pos):
            pos = _expect(_TRANSPOSE_RE, text, pos, "T(permutation)")
        return pos
    m = _DEVICE_LIST_RE.match(text, pos)
    if m is None or not m.group().strip():
        raise ValueError(f"expected '<=[...]' or a device list after devices={text[start:pos]}, "
                         f"got {text[pos:pos + 30]!r}")
    return m.end()


def _expect(pattern: re.Pattern, text: str, pos: int, what: str) -> int:
    m = pattern.match(text, pos)
    if m is None:
        raise ValueError(f"expected {what}, got {text[pos:pos + 30]!r}")
    return m.end()


def _balanced(text: str, pos: int) -> int:
    """A `{...}` value (strings skipped), e.g. the metadata of a sharding."""
    if not text.startswith("{", pos):
        raise ValueError(f"expected '{{' after metadata=, got {text[pos:pos + 30]!r}")
    depth = 0
    while pos < len(text):
        c = text[pos]
        if c == '"':
            m = _STRING_RE.match(text, pos)
            if m is None:
                break
            pos = m.end()
            continue
        depth += (c == "{") - (c == "}")
        pos += 1
        if depth == 0:
            return pos
    raise ValueError("expected '}' to close the sharding metadata")
