"""Typed attribute values of HLO instructions, and how each attribute key is parsed and printed.

Keys the model knows get a typed value (a tuple of ints, a `Window`, `ReplicaGroups`, ...);
any other key keeps its text verbatim as `Raw`, so nothing in a user's dump is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Raw", "Metadata", "Window", "WindowDim", "ReplicaGroups", "quote", "unquote",
    "INT_LIST_ATTRS", "INT_ATTRS", "BOOL_ATTRS", "STRING_ATTRS",
]


class Raw(str):
    """Attribute text kept verbatim (printed exactly as parsed)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Raw({str.__repr__(self)})"


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "?": "?", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_OCTAL_DIGITS = frozenset("01234567")


def unquote(text: str) -> str:
    """The value of a C-escaped, double-quoted string literal, unescaped as absl::CUnescape (XLA's lexer)
    does: `\\x` takes every hex digit that follows, `\\uXXXX` and `\\UXXXXXXXX` are code points written as
    UTF-8; a ValueError for what it rejects (an unknown escape, a byte value over 0xff, a surrogate, a
    trailing backslash). Bytes that are not UTF-8 come back as lone surrogates (`errors="surrogateescape"`),
    which `quote` writes back as the same octal escapes."""
    body = text[1:-1] if len(text) >= 2 and text[0] == '"' and text[-1] == '"' else text
    if "\\" not in body:
        return body
    out = bytearray()
    pos = 0
    while (at := body.find("\\", pos)) >= 0:
        out += body[pos:at].encode()
        pos = _unescape_one(body, at + 1, out)
    out += body[pos:].encode()
    return out.decode("utf-8", errors="surrogateescape")


def _unescape_one(body: str, at: int, out: bytearray) -> int:
    """Append to `out` the bytes of the escape whose letter is at `body[at]`; returns where the text goes on."""
    if at >= len(body):
        raise ValueError("a string cannot end with \\")
    letter = body[at]
    if letter in _ESCAPES:
        out += _ESCAPES[letter].encode()
        return at + 1
    if letter in _OCTAL_DIGITS:  # one to three octal digits
        end = at + 1
        while end < len(body) and end < at + 3 and body[end] in _OCTAL_DIGITS:
            end += 1
        return _append_byte(body, at, end, int(body[at:end], 8), out)
    if letter in "xX":  # every hex digit that follows (absl keeps a 32-bit value)
        end = at + 1
        if end >= len(body) or body[end] not in _HEX_DIGITS:
            raise ValueError("\\x must be followed by a hex digit")
        value = 0
        while end < len(body) and body[end] in _HEX_DIGITS:
            value = ((value << 4) + int(body[end], 16)) & 0xFFFFFFFF
            end += 1
        return _append_byte(body, at, end, value, out)
    if letter in "uU":
        digits = 4 if letter == "u" else 8
        written = body[at + 1 : at + 1 + digits]
        if len(written) != digits or not _HEX_DIGITS.issuperset(written):
            raise ValueError(f"\\{letter} must be followed by {digits} hex digits")
        rune = int(written, 16)
        if rune > 0x10FFFF:
            raise ValueError(f"\\{letter}{written} is over the Unicode limit (0x10FFFF)")
        if 0xD800 <= rune <= 0xDFFF:
            raise ValueError(f"\\{letter}{written} is a surrogate (0xD800-DFFF)")
        out += chr(rune).encode()
        return at + 1 + digits
    raise ValueError(f"unknown escape sequence \\{letter} in a string")


def _append_byte(body: str, at: int, end: int, value: int, out: bytearray) -> int:
    if value > 0xFF:
        raise ValueError(f"the value of \\{body[at:end]} exceeds 0xff")
    out.append(value)
    return end


_NEEDS_ESCAPE = re.compile(r'[\\"\n\t\r\x00-\x1f\x7f\udc80-\udcff]')


def quote(value: str) -> str:
    """A double-quoted, C-escaped string literal for `value`."""
    if not _NEEDS_ESCAPE.search(value):
        return f'"{value}"'
    out = []
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):03o}")
        elif 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte that is not UTF-8 (`unquote`'s surrogateescape)
            out.append(f"\\{ord(ch) - 0xDC00:03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# ----------------------------------------------------------------------------- metadata

#: One `key=value` of metadata; as in XLA's lexer the '=' belongs to the key (no space before it).
_META_ITEM_RE = re.compile(r'\s*([A-Za-z_][\w.]*)=\s*("(?:[^"\\]|\\.)*"|\{[^{}]*\}|[^\s},]+)', re.S)
_META_SEP_RE = re.compile(r"\s*,")
_SIGNED_RE = re.compile(r"-?\d+")


def _metadata_value(key: str, value: str, seen: dict, lenient: bool) -> Any:
    """The typed value of one metadata item (ValueError for what XLA's parser rejects)."""
    if key in seen:
        raise ValueError(f"metadata key {key!r} is given twice")
    kind = METADATA_KEYS.get(key)
    if kind is None and not lenient:
        raise ValueError(f"unknown metadata key {key!r}; expected one of {', '.join(sorted(METADATA_KEYS))}")
    if kind == "string" and not value.startswith('"'):
        raise ValueError(f"expected a quoted string for metadata {key}, got {value!r}")
    if kind == "int" and not _SIGNED_RE.fullmatch(value):
        raise ValueError(f"expected an integer for metadata {key}, got {value!r}")
    if value.startswith('"'):
        return unquote(value)
    if _SIGNED_RE.fullmatch(value):
        return int(value)
    return Raw(value)


class Metadata(dict):
    """`metadata={op_type="..." op_name="..." source_file="..." source_line=N ...}` as an ordered dict.

    String values are unescaped `str`; numbers are `int`; anything else is `Raw`.
    """

    @classmethod
    def parse(cls, text: str, lenient: bool = False) -> Metadata:
        """Parse the brace form as XLA does: known keys (`METADATA_KEYS`) once each, strings quoted, numbers
        plain, optional commas between items. `lenient` keeps unknown keys (verbatim) instead of failing."""
        body = text.strip()
        if not (body.startswith("{") and body.endswith("}")):
            raise ValueError("expected '{key=value ...}' for metadata")
        body = body[1:-1]
        md = cls()
        lead = _META_SEP_RE.match(body, 0)
        pos = lead.end() if lead is not None and _META_ITEM_RE.match(body, lead.end()) else 0  # `{,op_name=..}`
        while True:
            m = _META_ITEM_RE.match(body, pos)
            if m is None:
                if body[pos:].strip():
                    raise ValueError(f"expected key=value in metadata, got {body[pos:pos + 30].strip()!r}")
                return md
            md[m.group(1)] = _metadata_value(m.group(1), m.group(2), md, lenient)
            pos = m.end()
            sep = _META_SEP_RE.match(body, pos)
            if sep is not None and _META_ITEM_RE.match(body, sep.end()):
                pos = sep.end()  # an optional ',' between items, as XLA allows

    def to_text(self) -> str:
        """The brace form."""
        parts = []
        for k, v in self.items():
            if isinstance(v, Raw):
                parts.append(f"{k}={v}")
            elif isinstance(v, bool):
                parts.append(f"{k}={'true' if v else 'false'}")
            elif isinstance(v, int):
                parts.append(f"{k}={v}")
            else:
                parts.append(f"{k}={quote(str(v))}")
        return "{" + " ".join(parts) + "}"

    def copy(self) -> Metadata:
        """A shallow copy."""
        return Metadata(self)

    @property
    def op_name(self) -> str:
        """The op_name ('' if absent)."""
        return str(self.get("op_name", ""))


# ----------------------------------------------------------------------------- windows


@dataclass(frozen=True, slots=True)
class WindowDim:
    """One dimension of a convolution / reduce-window window."""

    size: int = 1
    stride: int = 1
    pad_low: int = 0
    pad_high: int = 0
    lhs_dilate: int = 1
    rhs_dilate: int = 1
    reversal: bool = False


@dataclass(frozen=True, slots=True)
class Window:
    """`window={size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`."""

    dims: tuple[WindowDim, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Window:
        """Parse the brace form."""
        t = text.strip()
        if not (t.startswith("{") and t.endswith("}")):
            raise ValueError("expected '{size=.. stride=.. pad=..}'")
        fields: dict[str, list[str]] = {}
        for item in t[1:-1].split():
            key, _, value = item.partition("=")
            pattern = _WINDOW_PAD_RE if key == "pad" else _WINDOW_INTS_RE
            if not pattern.fullmatch(value):
                raise ValueError(f"expected {key}=" + ("lo_hi per dimension joined by 'x'" if key == "pad" else
                                                      "integers joined by 'x'") + f", got {item!r}")
            fields[key] = value.split("x")
        rank = max((len(v) for v in fields.values()), default=0)
        for key, values in fields.items():
            if len(values) != rank:
                raise ValueError(f"expected {rank} values for window field {key!r}, got {len(values)}")

        def ints(key: str, default: int) -> list[int]:
            return [int(x) for x in fields[key]] if key in fields else [default] * rank

        pads = [tuple(int(p) for p in x.split("_")) for x in fields["pad"]] if "pad" in fields else [(0, 0)] * rank
        unknown = set(fields) - {"size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"}
        if unknown:
            raise ValueError(f"expected window fields size, stride, pad, lhs_dilate, rhs_dilate, rhs_reversal; "
                             f"got {sorted(unknown)}")
        size, stride = ints("size", 1), ints("stride", 1)
        lhs, rhs, rev = ints("lhs_dilate", 1), ints("rhs_dilate", 1), ints("rhs_reversal", 0)
        dims = tuple(
            WindowDim(size[i], stride[i], pads[i][0], pads[i][1], lhs[i], rhs[i], bool(rev[i])) for i in range(rank)
        )
        return cls(dims)

    def to_text(self) -> str:
        """The brace form, omitting fields at their defaults like XLA."""
        if not self.dims:
            return "{}"
        d = self.dims
        parts = ["size=" + "x".join(str(x.size) for x in d)]
        if any(x.stride != 1 for x in d):
            parts.append("stride=" + "x".join(str(x.stride) for x in d))
        if any(x.pad_low or x.pad_high for x in d):
            parts.append("pad=" + "x".join(f"{x.pad_low}_{x.pad_high}" for x in d))
        if any(x.lhs_dilate != 1 for x in d):
            parts.append("lhs_dilate=" + "x".join(str(x.lhs_dilate) for x in d))
        if any(x.rhs_dilate != 1 for x in d):
            parts.append("rhs_dilate=" + "x".join(str(x.rhs_dilate) for x in d))
        if any(x.reversal for x in d):
            parts.append("rhs_reversal=" + "x".join(str(int(x.reversal)) for x in d))
        return "{" + " ".join(parts) + "}"


# ----------------------------------------------------------------------------- replica groups

_IOTA_RE = re.compile(r"\[(\d+(?:,\d+)*)\]<=\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?")
_GROUPS_RE = re.compile(r"\{\s*(?:\{[\d\s,\-]*\}\s*(?:,\s*\{[\d\s,\-]*\}\s*)*)?\}")
_INTS_RE = re.compile(r"\s*(?:-?\d+\s*(?:,\s*-?\d+\s*)*)?")
_INT_RE = re.compile(r"-?\d+")
_WINDOW_INTS_RE = re.compile(r"-?\d+(?:x-?\d+)*")
_WINDOW_PAD_RE = re.compile(r"-?\d+_-?\d+(?:x-?\d+_-?\d+)*")
_SLICE_ITEM = r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]"
_SLICE_RE = re.compile(rf"\{{\s*(?:{_SLICE_ITEM}\s*(?:,\s*{_SLICE_ITEM}\s*)*)?\}}")
_PAIRS_RE = re.compile(r"\{\s*(?:\{\s*\d+\s*,\s*\d+\s*\}\s*(?:,\s*\{\s*\d+\s*,\s*\d+\s*\}\s*)*)?\}")
_PADDING_RE = re.compile(r"-?\d+_-?\d+(?:_\d+)?(?:x-?\d+_-?\d+(?:_\d+)?)*")


def _ints(body: str, what: str) -> tuple[int, ...]:
    """`1,0,2` -> (1, 0, 2), strictly (ValueError naming `what` otherwise)."""
    if not _INTS_RE.fullmatch(body):
        raise ValueError(f"expected a list of integers for {what}, got {{{body}}}")
    return tuple(int(x) for x in body.split(",")) if body.strip() else ()


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """Replica groups: an explicit list `{{0,1},{2,3}}`, the iota form `[2,4]<=[4,2]T(1,0)`, or the mesh-axes
    form `mesh['x'=2,'y'=4] {'y'}` (kept as written in `mesh`; `groups()` expands it as XLA does)."""

    explicit: tuple[tuple[int, ...], ...] | None = None
    iota_shape: tuple[int, ...] = ()
    iota_reshape: tuple[int, ...] = ()
    iota_transpose: tuple[int, ...] = ()
    mesh: str = ""

    @classmethod
    def parse(cls, text: str) -> ReplicaGroups:
        """Parse any of the three forms."""
        t = text.strip()
        if t.startswith("mesh["):
            _mesh_groups(t)  # validates
            return cls(None, mesh=t)
        m = _IOTA_RE.fullmatch(t.replace(" ", ""))
        if m:
            shape = tuple(int(x) for x in m.group(1).split(",") if x)
            reshape = tuple(int(x) for x in m.group(2).split(",") if x)
            perm = tuple(int(x) for x in m.group(3).split(",") if x) if m.group(3) else ()
            return cls(None, shape, reshape, perm)
        if not _GROUPS_RE.fullmatch(t):
            raise ValueError(f"expected replica groups like {{{{0,1}},{{2,3}}}} or [2,4]<=[8], got {text.strip()!r}")
        groups = re.findall(r"\{([^{}]*)\}", t[1:-1])
        return cls(tuple(_ints(g, "a replica group") for g in groups))  # ids out of range: the verifier's

    @classmethod
    def of(cls, groups: list[list[int]] | tuple[tuple[int, ...], ...]) -> ReplicaGroups:
        """Explicit groups."""
        return cls(tuple(tuple(g) for g in groups))

    def groups(self) -> list[list[int]]:
        """The groups as explicit lists of device ids."""
        if self.explicit is not None:
            return [list(g) for g in self.explicit]
        if self.mesh:
            return _mesh_groups(self.mesh)
        import numpy as np

        ids = np.arange(int(np.prod(self.iota_reshape))).reshape(self.iota_reshape)
        if self.iota_transpose:
            ids = ids.transpose(self.iota_transpose)
        return ids.reshape(self.iota_shape).tolist()

    @property
    def is_empty(self) -> bool:
        """True for `{}` (all devices in one group)."""
        return self.explicit == ()

    def to_text(self) -> str:
        """XLA's text form."""
        if self.mesh:
            return self.mesh
        if self.explicit is not None:
            return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in self.explicit) + "}"
        text = "[" + ",".join(map(str, self.iota_shape)) + "]<=[" + ",".join(map(str, self.iota_reshape)) + "]"
        if self.iota_transpose:
            text += "T(" + ",".join(map(str, self.iota_transpose)) + ")"
        return text


_MESH_RE = re.compile(
    r"mesh\[(?P<axes>'[^']*'=\d+(?:,'[^']*'=\d+)*)\]"
    r"(?:,device_ids=\((?:(?P<ids>\d+(?:,\d+)*)|\[(?P<iota>\d+(?:,\d+)*)\](?:T\((?P<perm>\d+(?:,\d+)*)\))?)\))?"
    r"\{(?P<refs>'[^']*'(?::\(\d+\)\d+)?(?:,'[^']*'(?::\(\d+\)\d+)?)*)\}"
)
_MESH_AXIS_RE = re.compile(r"'([^']*)'=(\d+)")
_MESH_REF_RE = re.compile(r"'([^']*)'(?::\((\d+)\)(\d+))?")


def _mesh_device_ids(m: re.Match, total: int):
    """The mesh's device array, flattened: `device_ids=(3,1,...)` as listed, `device_ids=([4,2]T(1,0))` an iota
    reshaped and transposed (XLA's IotaTileAssignment, as in `devices=[...]<=[4,2]T(1,0)`), else 0..total-1."""
    import numpy as np

    if m["ids"] is not None:
        return np.array([int(x) for x in m["ids"].split(",")])
    if m["iota"] is None:
        return np.arange(total)
    reshape = [int(x) for x in m["iota"].split(",")]
    perm = [int(x) for x in m["perm"].split(",")] if m["perm"] else list(range(len(reshape)))
    if int(np.prod(reshape)) != total or sorted(perm) != list(range(len(reshape))):
        raise ValueError(f"mesh device_ids [{m['iota']}]T({m['perm'] or ''}) must reshape the mesh's {total} "
                         f"devices, with a permutation of its dimensions")
    return np.arange(total).reshape(reshape).transpose(perm).reshape(-1)


def _mesh_groups(text: str) -> list[list[int]]:
    """Expand `mesh['a'=2,'b'=4][, device_ids=(...)] {'b', 'a':(1)2}` as XLA's MeshAxesReplicaGroupList does
    (openxla/xla replica_group.cc): reshape the mesh's device array so every (sub-)axis is a dimension, move
    the grouped ones last (in mesh order), and cut the flattened array into groups. Iota meshes give the
    groups XLA CPU (jaxlib 0.10.2) runs; with explicit `device_ids` that runtime was seen to form the groups
    of the iota mesh instead, where XLA's source (followed here) uses the ids."""
    import numpy as np

    m = _MESH_RE.fullmatch("".join(text.split()))
    if m is None:
        raise ValueError(f"expected mesh['axis'=size,...][, device_ids=(...)] {{'axis',...}}, got {text!r}")
    axes = [(name, int(size)) for name, size in _MESH_AXIS_RE.findall(m["axes"])]
    names = [a for a, _ in axes]
    sizes = [n for _, n in axes]
    if len(set(names)) != len(names) or any(n < 1 for n in sizes):
        raise ValueError(f"mesh axes must have distinct names and sizes >= 1, got {m['axes']}")
    total = int(np.prod(sizes))
    ids = _mesh_device_ids(m, total)
    if sorted(ids.tolist()) != list(range(total)):
        raise ValueError(f"mesh device_ids must be a permutation of 0..{total - 1}")
    per_dim: dict[int, list[tuple[int, int | None, int | None]]] = {}
    for order, (name, pre, size) in enumerate(_MESH_REF_RE.findall(m["refs"])):
        if name not in names:
            raise ValueError(f"replica group axis {name!r} is not a mesh axis ({', '.join(names)})")
        dim = names.index(name)
        sub = (int(pre), int(size)) if pre else None
        if sub is not None and (sub[0] < 1 or sub[1] < 2 or sizes[dim] % (sub[0] * sub[1]) or sub[1] >= sizes[dim]):
            raise ValueError(f"sub-axis {name}:({pre}){size} does not divide axis {name} of size {sizes[dim]}")
        per_dim.setdefault(dim, []).append((order, *sub) if sub else (order, None, None))
    reshape: list[int] = []
    grouped: list[int] = []
    for dim, full in enumerate(sizes):
        refs = per_dim.get(dim)
        offset = len(reshape)
        if not refs:
            reshape.append(full)
            continue
        if len(refs) == 1 and refs[0][1] is None:
            reshape.append(full)
            grouped.append(offset)
            continue
        if any(r[1] is None for r in refs):
            raise ValueError("a full mesh axis cannot be combined with its sub-axes")
        dims: list[int] = []
        aggregate: dict[int, int] = {}  # ref order -> local dim
        product = 1
        for order, pre, size in sorted(refs, key=lambda r: r[1]):
            if pre != product:
                if pre % product:
                    raise ValueError("overlapping sub-axes in replica groups")
                dims.append(pre // product)
                product = pre
            aggregate[order] = len(dims)
            dims.append(size)
            product *= size
        if product != full:
            dims.append(full // product)
        reshape.extend(dims)
        grouped.extend(offset + aggregate[order] for order in sorted(aggregate))
    per_group = int(np.prod([reshape[g] for g in grouped])) if grouped else 1
    perm = [d for d in range(len(reshape)) if d not in grouped] + grouped
    flat = ids.reshape(sizes).reshape(reshape).transpose(perm).reshape(-1)
    return flat.reshape(-1, per_group).tolist()


# ----------------------------------------------------------------------------- key tables

#: Attributes whose value is `{i,j,...}`: parsed to a tuple of ints.
INT_LIST_ATTRS = frozenset(
    {
        "dimensions", "lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims",
        "offset_dims", "collapsed_slice_dims", "start_index_map", "slice_sizes", "update_window_dims",
        "inserted_window_dims", "scatter_dims_to_operand_dims", "operand_batching_dims",
        "start_indices_batching_dims", "input_batching_dims", "scatter_indices_batching_dims", "fft_length",
        "dynamic_slice_sizes", "lhs_ragged_dims", "rhs_group_dims", "lhs_contracting_dims_scales",
    }
)
#: Attributes whose value is an integer.
INT_ATTRS = frozenset(
    {
        "index", "channel_id", "index_vector_dim", "feature_index", "exponent_bits", "mantissa_bits",
        "iota_dimension", "batch_group_count", "feature_group_count", "k", "split_count", "split_dimension",
        "concat_dimension", "all_gather_dimension", "scatter_dimension", "tuple_index",
    }
)
#: Attributes whose value is true/false.
BOOL_ATTRS = frozenset(
    {
        "is_composite", "constrain_layout", "use_global_device_ids", "indices_are_sorted", "unique_indices",
        "is_stable", "largest", "is_host_transfer", "is_cross_program_prefetch", "custom_call_has_side_effect",
    }
)
#: Attributes whose value is a bare word or a quoted string: kept as `str` (quotes stripped, unescaped).
STRING_ATTRS = frozenset(
    {
        "direction", "type", "kind", "custom_call_target", "dim_labels", "async_execution_thread",
        "api_version", "distribution", "algorithm", "fft_type", "custom_call_schedule", "mode",
        "rng_algorithm", "async_group_id", "schedule",
    }
)
#: String attributes XLA writes with quotes.
QUOTED_STRING_ATTRS = frozenset({"custom_call_target", "async_execution_thread"})


def is_typed(key: str) -> bool:
    """Whether the key gets a typed value (not Raw)."""
    return (
        key in INT_LIST_ATTRS or key in INT_ATTRS or key in BOOL_ATTRS or key in STRING_ATTRS
        or key in ("slice", "padding", "window", "replica_groups", "source_target_pairs", "metadata",
                   "frontend_attributes")
    )


def format_value(key: str, value: Any) -> str:
    """The text of attribute `key` with a typed or raw value."""
    if isinstance(value, Raw):
        return value
    if key in INT_LIST_ATTRS or (isinstance(value, tuple) and all(isinstance(v, int) for v in value)):
        return "{" + ",".join(map(str, value)) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote(value) if key in QUOTED_STRING_ATTRS else value
    if hasattr(value, "to_text"):
        return value.to_text()
    if key == "slice":
        return "{" + ", ".join(_slice_text(s) for s in value) + "}"
    if key == "source_target_pairs":
        return "{" + ",".join("{" + f"{a},{b}" + "}" for a, b in value) + "}"
    if key == "frontend_attributes":
        return "{" + ",".join(f"{k}={v if isinstance(v, Raw) else quote(str(v))}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot print attribute {key}={value!r}")


def _slice_text(s: tuple[int, int, int]) -> str:
    start, limit, stride = s
    return f"[{start}:{limit}]" if stride == 1 else f"[{start}:{limit}:{stride}]"


@dataclass(frozen=True, slots=True)
class PaddingConfig:
    """`padding=lo_hi[_interior]x...` of a pad instruction."""

    dims: tuple[tuple[int, int, int], ...]

    @classmethod
    def parse(cls, text: str) -> PaddingConfig:
        """Parse `0_1x2_3_1`."""
        if not _PADDING_RE.fullmatch(text.strip()):
            raise ValueError(f"expected lo_hi[_interior] per dimension joined by 'x', got {text.strip()!r}")
        dims = []
        for part in text.strip().split("x"):
            nums = [int(p) for p in part.split("_")]
            if len(nums) == 2:
                nums.append(0)
            dims.append(tuple(nums))
        return cls(tuple(dims))

    def to_text(self) -> str:
        """XLA's text form."""
        return "x".join(f"{lo}_{hi}" + (f"_{i}" if i else "") for lo, hi, i in self.dims)


def parse_typed(key: str, text: str, lenient: bool = False) -> Any:
    """Parse the text of a known attribute into its typed value (ValueError if malformed); `lenient` lets
    metadata keep keys XLA's parser does not know."""
    t = text.strip()
    if key in INT_LIST_ATTRS:
        if not (t.startswith("{") and t.endswith("}")):
            raise ValueError(f"expected '{{...}}' list of integers for {key}")
        body = t[1:-1].strip()
        if "{" in body:
            return Raw(text)  # nested form (e.g. slice_sizes of a dynamic collective-permute)
        return _ints(body, key)
    if key in INT_ATTRS:
        if not _INT_RE.fullmatch(t):
            raise ValueError(f"expected an integer for {key}, got {t!r}")
        return int(t)
    if key in BOOL_ATTRS:
        if t not in ("true", "false"):
            raise ValueError(f"expected true or false for {key}")
        return t == "true"
    if key in STRING_ATTRS:
        return _string_value(key, t)
    if key == "slice":
        if not _SLICE_RE.fullmatch(t):
            raise ValueError(f"expected '{{[start:limit:stride], ...}}' for slice, got {t!r}")
        out = []
        for m in re.finditer(_SLICE_ITEM, t):
            out.append((int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)))
        return tuple(out)
    if key == "padding":
        return PaddingConfig.parse(t)
    if key == "window":
        return Window.parse(t)
    if key == "replica_groups":
        return ReplicaGroups.parse(t)
    if key == "source_target_pairs":
        if not _PAIRS_RE.fullmatch(t):
            raise ValueError(f"expected '{{{{source,target}}, ...}}' for source_target_pairs, got {t!r}")
        return tuple((int(a), int(b)) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", t))
    if key == "metadata":
        return Metadata.parse(t, lenient)
    if key == "frontend_attributes":
        return _parse_frontend_attributes(t)
    return Raw(text)


#: The words XLA's parser accepts for enum-valued attributes.
ENUM_VALUES: dict[str, frozenset[str]] = {
    "direction": frozenset({"EQ", "NE", "LT", "LE", "GT", "GE"}),
    "type": frozenset({"FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED"}),
    "fft_type": frozenset({"FFT", "IFFT", "RFFT", "IRFFT"}),
    "kind": frozenset({"kLoop", "kInput", "kOutput", "kCustom"}),
    "distribution": frozenset({"rng_uniform", "rng_normal"}),
    "api_version": frozenset({"API_VERSION_ORIGINAL", "API_VERSION_STATUS_RETURNING",
                              "API_VERSION_STATUS_RETURNING_UNIFIED", "API_VERSION_TYPED_FFI"}),
    "schedule": frozenset({"SCHEDULE_NONE", "SCHEDULE_LATEST", "SCHEDULE_EARLIEST"}),
}
_WHOLE_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BARE_WORD_RE = re.compile(r"[A-Za-z_][\w.\-]*")
_INDEX = r"\{\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\}"
_ALIAS = rf"{_INDEX}\s*:\s*\(\s*\d+\s*,\s*{_INDEX}\s*\)"
_ALIASING_RE = re.compile(rf"\{{\s*(?:{_ALIAS}\s*(?:,\s*{_ALIAS}\s*)*)?\}}")
_DIM_LABELS_RE = re.compile(r"[0-9a-z?]+_[0-9a-z?]+->[0-9a-z?]+")


def _string_value(key: str, t: str) -> str:
    """A string attribute: one quoted string where XLA writes quotes, else one word (of ENUM_VALUES[key])."""
    if key in QUOTED_STRING_ATTRS:
        if not _WHOLE_STRING_RE.fullmatch(t):
            raise ValueError(f"expected one quoted string for {key}, got {t!r}")
        return unquote(t)
    allowed = ENUM_VALUES.get(key)
    if allowed is not None and t not in allowed:
        raise ValueError(f"expected one of {', '.join(sorted(allowed))} for {key}, got {t!r}")
    if key == "dim_labels" and not _DIM_LABELS_RE.fullmatch(t):
        raise ValueError(f"expected dim_labels like b01f_01io->b01f, got {t!r}")
    if t.startswith('"'):
        if not _WHOLE_STRING_RE.fullmatch(t):
            raise ValueError(f"expected one quoted string for {key}, got {t!r}")
        return unquote(t)
    return t


def check_verbatim(key: str, text: str) -> None:
    """Syntax checks XLA's parser makes on attributes hlopt keeps verbatim (ValueError if it would reject)."""
    t = text.strip()
    if key == "backend_config":
        if _WHOLE_STRING_RE.fullmatch(t):
            unquote(t)  # its escapes must be ones XLA's lexer reads (the text itself is kept)
        elif not (t.startswith("{") and t.endswith("}")):
            raise ValueError(f"expected a quoted string or a {{...}} dictionary for backend_config, got {t[:40]!r}")
    if key == "output_to_operand_aliasing" and not _ALIASING_RE.fullmatch(t):
        raise ValueError(f"expected {{{{output index}}: (operand, {{operand index}}), ...}}, got {t[:60]!r}")
    if key == "sharding":
        from hlopt.hlo.sharding_syntax import check_sharding

        check_sharding(t)


def _balanced(text: str) -> bool:
    """Whether `text` is one brace group `{...}` (braces outside strings balance, and the first closes last):
    XLA reads a braced frontend-attribute value as raw text up to its matching brace, whatever other brackets
    it holds."""
    depth = 0
    pos = 0
    while pos < len(text):
        c = text[pos]
        if c == '"':
            m = _WHOLE_STRING_RE.match(text, pos)
            if m is None:
                return False
            pos = m.end()
            continue
        depth += (c == "{") - (c == "}")
        pos += 1
        if depth <= 0:
            return depth == 0 and pos == len(text)
    return False


def _parse_frontend_attributes(t: str) -> dict[str, Any]:
    from hlopt.hlo.lexer import split_top_level

    if not (t.startswith("{") and t.endswith("}")):
        raise ValueError("expected '{key=\"value\", ...}' for frontend_attributes")
    out: dict[str, Any] = {}
    if not t[1:-1].strip():
        return out
    for item in split_top_level(t[1:-1], ",", braces_only=True):
        item = item.strip()
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        braced = value.startswith("{") and value.endswith("}") and _balanced(value)  # a dictionary, verbatim
        if not eq or not _BARE_WORD_RE.fullmatch(key) or not (braced or _WHOLE_STRING_RE.fullmatch(value)):
            raise ValueError(f"expected key=\"value\" in frontend_attributes, got {item!r}")
        out[key] = Raw(value) if braced else unquote(value)
    return out


# ----------------------------------------------------------------------------- which attributes each opcode takes

#: Attributes XLA's parser accepts on every instruction.
GENERIC_ATTRS = frozenset(
    {"sharding", "frontend_attributes", "statistics", "parameter_replication", "control-predecessors", "origin",
     "metadata", "backend_config"}
)
_COLLECTIVE = ("replica_groups", "channel_id", "constrain_layout", "use_global_device_ids")
_DOT_DIMS = ("lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims",
             "operand_precision")
_ACCURACY = ("result_accuracy",)
_CHANNEL = ("channel_id", "is_host_transfer")


def _table(spec: dict[str, tuple[str, ...]], *opcodes_and_attrs: tuple[tuple[str, ...], tuple[str, ...]]
           ) -> dict[str, frozenset[str]]:
    out = {op: frozenset(attrs) for op, attrs in spec.items()}
    for opcodes, attrs in opcodes_and_attrs:
        for op in opcodes:
            out[op] = frozenset(attrs)
    return out


#: The attributes (beyond GENERIC_ATTRS) XLA's HLO parser accepts per opcode (openxla/xla hlo_parser.cc,
#: CreateInstruction); an opcode missing here is not checked.
OPCODE_ATTRS: dict[str, frozenset[str]] = _table(
    {
        "parameter": (), "constant": (), "iota": ("iota_dimension",), "topk": ("k", "largest"),
        "all-gather": (*_COLLECTIVE, "dimensions"), "all-gather-start": (*_COLLECTIVE, "dimensions"),
        "all-reduce": (*_COLLECTIVE, "to_apply"), "all-reduce-start": (*_COLLECTIVE, "to_apply"),
        "reduce-scatter": (*_COLLECTIVE, "to_apply", "dimensions"),
        "all-to-all": ("replica_groups", "channel_id", "dimensions", "constrain_layout"),
        "ragged-all-to-all": ("replica_groups", "channel_id", "dimensions"),
        "collective-broadcast": ("replica_groups", "channel_id"),
        "collective-permute": ("source_target_pairs", "channel_id", "slice_sizes"),
        "collective-permute-start": ("source_target_pairs", "channel_id", "slice_sizes"),
        "async-start": ("async_execution_thread", "calls"), "async-update": ("async_execution_thread", "calls"),
        "async-done": ("async_execution_thread", "calls"), "copy-start": ("cross_program_prefetch_index",),
        "reshape": ("inferred_dimension",), "sort": ("dimensions", "is_stable", "to_apply"),
        "while": ("condition", "body"), "recv": _CHANNEL, "recv-done": _CHANNEL, "send": _CHANNEL,
        "send-done": _CHANNEL, "get-tuple-element": ("index",), "call": ("to_apply", "is_composite"),
        "reduce-window": ("window", "to_apply"),
        "convolution": ("window", "dim_labels", "feature_group_count", "batch_group_count", "operand_precision"),
        "fft": ("fft_type", "fft_length"),
        "triangular-solve": ("left_side", "lower", "unit_diagonal", "transpose_a"), "cholesky": ("lower",),
        "compare": ("direction", "type"), "broadcast": ("dimensions",), "concatenate": ("dimensions",),
        "map": ("to_apply", "dimensions"), "reduce": ("to_apply", "dimensions"), "reverse": ("dimensions",),
        "select-and-scatter": ("select", "scatter", "window"), "slice": ("slice",),
        "dynamic-slice": ("dynamic_slice_sizes",), "transpose": ("dimensions",),
        "batch-norm-training": ("epsilon", "feature_index"), "batch-norm-inference": ("epsilon", "feature_index"),
        "batch-norm-grad": ("epsilon", "feature_index"), "pad": ("padding",),
        "fusion": ("calls", "kind", "output_to_operand_aliasing"), "infeed": ("infeed_config",),
        "outfeed": ("outfeed_config", "outfeed_shape"), "rng": ("distribution",), "rng-get-and-update-state": ("delta",),
        "rng-bit-generator": ("algorithm",), "reduce-precision": ("exponent_bits", "mantissa_bits"),
        "conditional": ("true_computation", "false_computation", "branch_computations"),
        "custom-call": ("custom_call_target", "window", "dim_labels", "feature_group_count", "batch_group_count",
                        "operand_layout_constraints", "custom_call_has_side_effect", "to_apply",
                        "called_computations", "output_to_operand_aliasing", "padding_type", "literal",
                        "operand_precision", "schedule", "api_version"),
        "dot": (*_DOT_DIMS, "sparsity", "algorithm"),
        "ragged-dot": (*_DOT_DIMS, "lhs_ragged_dims", "rhs_group_dims"),
        "gather": ("offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim", "slice_sizes",
                   "indices_are_sorted", "operand_batching_dims", "start_indices_batching_dims"),
        "scatter": ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                    "index_vector_dim", "to_apply", "indices_are_sorted", "unique_indices", "input_batching_dims",
                    "scatter_indices_batching_dims"),
        "domain": ("domain",), "get-dimension-size": ("dimensions",), "set-dimension-size": ("dimensions",),
    },
    (("expm1", "exponential-minus-one", "log", "log-plus-one", "logistic", "sqrt", "cbrt", "rsqrt", "tanh", "erf",
      "sine", "cosine", "tan", "exponential", "acos", "acosh", "asin", "asinh", "atanh", "cosh", "sinh"),
     _ACCURACY),
    (("abs", "all-gather-done", "all-reduce-done", "round-nearest-afz", "round-nearest-even", "bitcast", "ceil",
      "count-leading-zeros", "collective-permute-done", "copy", "copy-done", "opt-barrier", "imag", "is-finite",
      "floor", "not", "negate", "popcnt", "real", "sign", "add", "divide", "multiply", "subtract", "atan2",
      "complex", "maximum", "minimum", "power", "remainder", "and", "or", "xor", "shift-left",
      "shift-right-arithmetic", "shift-right-logical", "stochastic-convert", "clamp", "select", "convert",
      "bitcast-convert", "replica-id", "partition-id", "dynamic-reshape", "after-all", "add-dependency", "tuple",
      "dynamic-update-slice"), ()),
)

#: Attributes XLA's parser requires per opcode (broadcast's `dimensions` only for a non-scalar operand).
REQUIRED_ATTRS: dict[str, frozenset[str]] = {
    op: frozenset(attrs) for op, attrs in {
        "iota": ("iota_dimension",), "topk": ("k",), "all-gather": ("dimensions",),
        "all-gather-start": ("dimensions",), "all-reduce": ("to_apply",), "all-reduce-start": ("to_apply",),
        "reduce-scatter": ("to_apply", "dimensions"), "collective-broadcast": ("replica_groups",),
        "collective-permute": ("source_target_pairs",), "collective-permute-start": ("source_target_pairs",),
        "sort": ("dimensions", "to_apply"), "while": ("condition", "body"), "get-tuple-element": ("index",),
        "call": ("to_apply",), "reduce-window": ("to_apply",), "convolution": ("dim_labels",),
        "fft": ("fft_type", "fft_length"), "compare": ("direction",), "concatenate": ("dimensions",),
        "map": ("to_apply",), "reduce": ("to_apply", "dimensions"), "reverse": ("dimensions",),
        "select-and-scatter": ("select", "scatter"), "slice": ("slice",), "dynamic-slice": ("dynamic_slice_sizes",),
        "transpose": ("dimensions",), "batch-norm-training": ("epsilon", "feature_index"),
        "batch-norm-inference": ("epsilon", "feature_index"), "batch-norm-grad": ("epsilon", "feature_index"),
        "pad": ("padding",), "fusion": ("calls", "kind"), "rng": ("distribution",),
        "rng-get-and-update-state": ("delta",), "rng-bit-generator": ("algorithm",),
        "reduce-precision": ("exponent_bits", "mantissa_bits"), "custom-call": ("custom_call_target",),
        "gather": ("offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim", "slice_sizes"),
        "scatter": ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                    "index_vector_dim", "to_apply"),
        "domain": ("domain",), "get-dimension-size": ("dimensions",), "set-dimension-size": ("dimensions",),
        "async-start": ("calls",),
    }.items()
}

#: Keys of `metadata={...}` XLA's parser accepts, and the kind of value each takes.
METADATA_KEYS: dict[str, str] = {
    "op_type": "string", "op_name": "string", "source_file": "string", "deduplicated_name": "string",
    "scheduling_name": "string", "source_line": "int", "source_end_line": "int", "source_column": "int",
    "source_end_column": "int", "stack_frame_id": "int", "profile_type": "any", "metadata_payload": "any",
}

#: Keys of the HloModule line XLA's parser accepts.
MODULE_ATTRS = frozenset(
    {"alias_passthrough_params", "allow_spmd_sharding_propagation_to_output",
     "allow_spmd_sharding_propagation_to_parameters", "buffer_donor", "entry_computation_layout",
     "frontend_attributes", "input_output_alias", "is_scheduled", "num_partitions", "origin_recovery_table",
     "replica_count"}
)


def allowed_attributes(opcode: str) -> frozenset[str] | None:
    """Every attribute XLA's parser accepts on `opcode` (None when the opcode is not in the table).

    `<op>-start/-update/-done` async wrappers take their wrapped op's attributes too."""
    own = OPCODE_ATTRS.get(opcode)
    if own is not None:
        return GENERIC_ATTRS | own
    for suffix in ("-start", "-update", "-done"):
        if opcode.endswith(suffix):
            wrapped = OPCODE_ATTRS.get(opcode[: -len(suffix)])
            if wrapped is not None:
                return GENERIC_ATTRS | wrapped | OPCODE_ATTRS["async-start"]
    return None
