"""`sharding={...}` as XLA's HLO parser reads it: one parser, for the syntax check the HLO parser makes (hlopt
keeps the attribute's text verbatim) and for the structure the runtime splits arrays by.

    >>> check_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    >>> parse_sharding("{devices=[2,2]<=[2,2]T(1,0)}").devices
    (0, 2, 1, 3)
    >>> check_sharding("{devices=[8,1]<[8]}")
    Traceback (most recent call last):
    ...
    ValueError: expected '<=[...]' or a device list after devices=[8,1], got '<[8]}'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["Sharding", "check_sharding", "parse_sharding", "tuple_sharding_size"]

_SKIP_RE = re.compile(r"(?:\s+|/\*.*?\*/)*", re.S)  # XLA's lexer skips comments (`/*index=5*/`)
_KINDS = frozenset({"replicated", "maximal", "manual", "unknown", "unreduced"})
_WORDS = _KINDS | {"last_tile_dim_replicate"}
_WORD_RE = re.compile(r"[A-Za-z_][\w\-]*")
_INTS_RE = re.compile(r"\[\s*\d+\s*(?:,\s*\d+\s*)*\]")
_DEVICE_LIST_RE = re.compile(r"\s*\d+\s*(?:,\s*\d+\s*)*")
_TRANSPOSE_RE = re.compile(r"T\(\s*\d+\s*(?:,\s*\d+\s*)*\)")
_INT_RE = re.compile(r"\s*-?\d+")
_LAST_TILE_DIMS_RE = re.compile(r"\{\s*(?:[a-z_]+\s*(?:,\s*[a-z_]+\s*)*)?\}")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


@dataclass(frozen=True)
class Sharding:
    """One array's sharding: `kind` is replicated, maximal (on `device`), manual, unknown, unreduced, or
    tiled: `tile_dims` tiles, held by `devices` (row-major over the tiles), the last tile dimension
    replicated (`replicate_last`) or of the kinds `last_tile_dims` names."""

    kind: str
    tile_dims: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    replicate_last: bool = False
    device: int = 0
    last_tile_dims: tuple[str, ...] = ()

    @property
    def device_count(self) -> int:
        """Devices this sharding spans (1 if not tiled; the maximal device's number plus one)."""
        if self.kind == "maximal":
            return self.device + 1
        return len(self.devices) if self.kind == "tiled" else 1


def check_sharding(text: str) -> None:
    """Raise ValueError (saying what was expected) if XLA's parser would reject this sharding."""
    parse_sharding(text)


def parse_sharding(text: str) -> Sharding | list:
    """The Sharding, or a (nested) list of them for a tuple sharding `{{...}, {...}}`; ValueError, saying what
    was expected, where XLA's parser would reject it."""
    value, pos = _sharding(text, 0)
    if text[pos:].strip():
        raise ValueError(f"unexpected text after the sharding: {text[pos:pos + 30]!r}")
    return value


def tuple_sharding_size(text: str) -> int | None:
    """How many leaf shardings a tuple sharding `{{...}, {...}}` lists (None for a single sharding)."""
    value = parse_sharding(text)
    return len(value) if isinstance(value, list) else None


def _sharding(text: str, pos: int) -> tuple[Sharding | list, int]:
    pos = _SKIP_RE.match(text, pos).end()
    if not text.startswith("{", pos):
        raise ValueError(f"expected '{{' to start a sharding, got {text[pos:pos + 30]!r}")
    pos = _SKIP_RE.match(text, pos + 1).end()
    value: Sharding | list
    if text.startswith("{", pos):  # a tuple sharding: {{...}, {...}}
        value = []
        while True:
            element, pos = _sharding(text, pos)
            value.append(element)
            pos = _SKIP_RE.match(text, pos).end()
            if text.startswith(",", pos):
                pos += 1
                continue
            break
    else:
        value, pos = _single(text, pos)
    if not text.startswith("}", pos):
        raise ValueError(f"expected '}}' to end the sharding, got {text[pos:pos + 30]!r}")
    return value, pos + 1


def _single(text: str, pos: int) -> tuple[Sharding, int]:
    """The items of one (non-tuple) sharding, up to its closing brace."""
    items: dict[str, object] = {}
    while True:
        pos = _SKIP_RE.match(text, pos).end()
        if pos >= len(text) or text[pos] == "}":
            return _build(items), pos
        m = _WORD_RE.match(text, pos)
        if m is None:
            raise ValueError(f"expected a sharding item, got {text[pos:pos + 30]!r}")
        word, pos = m.group(), m.end()
        if word in _WORDS:
            items[word] = True
            continue
        if word in ("shard_as", "shard_like"):
            pos = _expect(_INT_RE, text, pos, f"an integer after {word}")
            continue
        if not text.startswith("=", pos):
            raise ValueError(f"unknown sharding item {word!r}")
        pos += 1
        if word == "device":
            start = pos
            pos = _expect(_INT_RE, text, pos, "an integer after device=")
            items["device"] = int(text[start:pos])
        elif word == "devices":
            items["devices"], pos = _devices(text, pos)
        elif word == "last_tile_dims":
            start = pos
            pos = _expect(_LAST_TILE_DIMS_RE, text, pos, "{manual, replicated, ...} after last_tile_dims=")
            items["last_tile_dims"] = tuple(w.strip() for w in text[start + 1:pos - 1].split(",") if w.strip())
        elif word == "metadata":
            pos = _balanced(text, pos)
        else:
            raise ValueError(f"unknown sharding item {word!r}")


def _build(items: dict[str, object]) -> Sharding:
    """The Sharding the parsed items describe."""
    if "devices" in items:
        tile_dims, devices = items["devices"]
        return Sharding("tiled", tile_dims, devices, bool(items.get("last_tile_dim_replicate")),
                        last_tile_dims=items.get("last_tile_dims", ()))
    if "maximal" in items:
        return Sharding("maximal", device=int(items.get("device", 0)))
    kind = next((k for k in ("manual", "unknown", "unreduced") if k in items), "replicated")
    return Sharding(kind)


def _devices(text: str, pos: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], int]:
    """`[tiles]<=[reshape]T(perm)` (an iota, reshaped and transposed) or `[tiles]0,1,...`: (tiles, devices)."""
    start = pos
    pos = _expect(_INTS_RE, text, pos, "[dimensions] after devices=")
    tiles = _ints(text[start:pos])
    if text.startswith("<=", pos):
        reshape_at = pos + 2
        pos = _expect(_INTS_RE, text, reshape_at, "[dimensions] after '<='")
        reshape = _ints(text[reshape_at:pos])
        perm = tuple(range(len(reshape)))
        if text.startswith("T", pos):
            perm_at = pos
            pos = _expect(_TRANSPOSE_RE, text, pos, "T(permutation)")
            perm = _ints(text[perm_at + 1:pos])
        return (tiles, _iota_devices(reshape, perm)), pos
    m = _DEVICE_LIST_RE.match(text, pos)
    if m is None or not m.group().strip():
        raise ValueError(f"expected '<=[...]' or a device list after devices={text[start:pos]}, "
                         f"got {text[pos:pos + 30]!r}")
    return (tiles, _ints(m.group())), m.end()


def _iota_devices(reshape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """0..n-1 reshaped to `reshape`, transposed by `perm`, flattened (XLA's IotaTileAssignment)."""
    if sorted(perm) != list(range(len(reshape))):
        return tuple(range(math.prod(reshape)))  # not a permutation: the verifier's to report
    strides = [math.prod(reshape[i + 1:]) for i in range(len(reshape))]
    dims = [reshape[p] for p in perm]
    out = []
    for flat in range(math.prod(dims)):
        index, rest = [], flat
        for d in reversed(dims):
            index.append(rest % d)
            rest //= d
        index.reverse()
        out.append(sum(index[i] * strides[p] for i, p in enumerate(perm)))
    return tuple(out)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


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
