"""Primitive types, layouts and shapes of HLO, as HLO text spells them.

Shapes are frozen and hashable; parsing caches by text, so the same shape string
yields the same object.

    >>> s = parse_shape("f32[8,<=16]{1,0:T(8,128)}")
    >>> s.dims, s.dynamic, s.layout.tiles
    ((8, 16), (False, True), ((8, 128),))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

__all__ = [
    "DType",
    "DTYPES",
    "Layout",
    "Shape",
    "TupleShape",
    "AnyShape",
    "ShapeParseError",
    "parse_shape",
    "default_layout",
    "is_row_major",
    "scalar",
]


@dataclass(frozen=True, slots=True)
class DType:
    """An HLO primitive type: its text name, bit width, kind and numpy equivalent."""

    name: str
    bits: int
    kind: str  # pred | sint | uint | float | complex | token | opaque
    numpy: np.dtype | None = field(default=None, compare=False)

    @property
    def is_float(self) -> bool:
        """True for real floating-point types (f4..f64, bf16, f8 variants)."""
        return self.kind == "float"

    @property
    def is_integral(self) -> bool:
        """True for signed and unsigned integer types."""
        return self.kind in ("sint", "uint")

    @property
    def is_complex(self) -> bool:
        """True for c64 and c128."""
        return self.kind == "complex"


def _np(name: str) -> np.dtype | None:
    try:
        return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    except TypeError:
        return None


_DTYPE_TABLE = [
    ("pred", 1 * 8, "pred", np.dtype(np.bool_)),
    ("s1", 1, "sint", None),
    ("s2", 2, "sint", _np("int2")),
    ("s4", 4, "sint", _np("int4")),
    ("s8", 8, "sint", np.dtype(np.int8)),
    ("s16", 16, "sint", np.dtype(np.int16)),
    ("s32", 32, "sint", np.dtype(np.int32)),
    ("s64", 64, "sint", np.dtype(np.int64)),
    ("u1", 1, "uint", None),
    ("u2", 2, "uint", _np("uint2")),
    ("u4", 4, "uint", _np("uint4")),
    ("u8", 8, "uint", np.dtype(np.uint8)),
    ("u16", 16, "uint", np.dtype(np.uint16)),
    ("u32", 32, "uint", np.dtype(np.uint32)),
    ("u64", 64, "uint", np.dtype(np.uint64)),
    ("f16", 16, "float", np.dtype(np.float16)),
    ("bf16", 16, "float", _np("bfloat16")),
    ("f32", 32, "float", np.dtype(np.float32)),
    ("f64", 64, "float", np.dtype(np.float64)),
    ("c64", 64, "complex", np.dtype(np.complex64)),
    ("c128", 128, "complex", np.dtype(np.complex128)),
    ("f8e4m3fn", 8, "float", _np("float8_e4m3fn")),
    ("f8e5m2", 8, "float", _np("float8_e5m2")),
    ("f8e4m3", 8, "float", _np("float8_e4m3")),
    ("f8e3m4", 8, "float", _np("float8_e3m4")),
    ("f8e4m3fnuz", 8, "float", _np("float8_e4m3fnuz")),
    ("f8e5m2fnuz", 8, "float", _np("float8_e5m2fnuz")),
    ("f8e4m3b11fnuz", 8, "float", _np("float8_e4m3b11fnuz")),
    ("f8e8m0fnu", 8, "float", _np("float8_e8m0fnu")),
    ("f4e2m1fn", 4, "float", _np("float4_e2m1fn")),
    ("token", 0, "token", None),
    ("opaque", 0, "opaque", None),
]

#: Every primitive type by its HLO text name.
DTYPES: dict[str, DType] = {n: DType(n, b, k, d) for n, b, k, d in _DTYPE_TABLE}


def dtype_of_numpy(dt: np.dtype) -> str:
    """The HLO type name of a numpy/ml_dtypes dtype."""
    dt = np.dtype(dt)
    for d in DTYPES.values():
        if d.numpy is not None and d.numpy == dt and d.name not in ("s1", "u1"):
            return d.name
    raise ValueError(f"no HLO type for numpy dtype {dt}")


class ShapeParseError(ValueError):
    """A shape string that is not valid HLO; `.offset` is where it went wrong."""

    def __init__(self, message: str, offset: int = 0):
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Layout:
    """A layout: minor-to-major order, tiles, element size, memory space, other items verbatim."""

    minor_to_major: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...] = ()
    element_size_bits: int = 0
    memory_space: int = 0
    extra: str = ""  # other layout items (D(..), L(..), #(..), *(..), SC(..), P(..), M(..)) verbatim

    def to_text(self) -> str:
        """The layout as HLO prints it, braces included."""
        text = ",".join(map(str, self.minor_to_major))
        if not (self.tiles or self.element_size_bits or self.memory_space or self.extra):
            return "{" + text + "}"
        items: list[tuple[int, str]] = []
        if self.tiles:
            items.append((1, "T" + "".join(_tile_text(t) for t in self.tiles)))
        if self.element_size_bits:
            items.append((5, f"E({self.element_size_bits})"))
        if self.memory_space:
            items.append((6, f"S({self.memory_space})"))
        if self.extra:  # XLA's parser wants the items in the order its printer writes them
            items.extend((_ITEM_RANK.get(m.group(1), 10), m.group(0)) for m in _EXTRA_ITEM_RE.finditer(self.extra))
            items.sort(key=lambda item: item[0])
        return "{" + text + ":" + "".join(t for _, t in items) + "}"

    __str__ = to_text


#: Rank of each layout item in XLA's print order (D, T, L, #, *, E, S, SC, P, M).
_ITEM_RANK = {"D": 0, "T": 1, "L": 2, "#": 3, "*": 4, "E": 5, "S": 6, "SC": 7, "P": 8, "M": 9}
_EXTRA_ITEM_RE = re.compile(r"([A-Z#*]+)\((?:[^()]|\([^()]*\))*\)")


def _tile_text(tile: tuple[int, ...]) -> str:
    return "(" + ",".join("*" if d == -1 else str(d) for d in tile) + ")"


def default_layout(rank: int) -> Layout:
    """The descending (row-major) layout XLA gives an array of this rank."""
    return Layout(tuple(range(rank - 1, -1, -1)))


def is_row_major(shape: Shape) -> bool:
    """Whether `shape`'s elements lie in row-major order over its dimensions larger than one (no layout: the
    default one), so that any reshape of it is a bitcast."""
    layout = shape.layout
    if layout is None or len(layout.minor_to_major) != shape.rank:
        return True
    kept = [d for d in reversed(layout.minor_to_major) if shape.dims[d] != 1]
    return kept == sorted(kept)


@dataclass(frozen=True, slots=True)
class Shape:
    """An array (or token/opaque) shape: element type, dimensions, dynamic flags, optional layout."""

    dtype: str
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()
    layout: Layout | None = None
    _hash: int = field(default=0, init=False, repr=False, compare=False)  # computed on first use

    is_tuple = False

    def __hash__(self) -> int:
        h = self._hash
        if not h:
            h = hash((self.dtype, self.dims, self.dynamic, self.layout)) or 1
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Shape:
            return NotImplemented
        return (self.dtype == other.dtype and self.dims == other.dims and self.dynamic == other.dynamic
                and self.layout == other.layout)

    def __reduce__(self) -> tuple:
        return Shape, (self.dtype, self.dims, self.dynamic, self.layout)  # the hash is per process

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.dims)

    @property
    def is_array(self) -> bool:
        """True unless the element type is token or opaque."""
        return self.dtype not in ("token", "opaque")

    @property
    def element_type(self) -> DType:
        """The DType of the elements."""
        return DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        """Number of elements (upper bound for dynamic dims)."""
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def byte_size(self) -> int:
        """Bytes of the array; sub-byte types packed, pred is one byte."""
        return (self.numel * DTYPES[self.dtype].bits + 7) // 8

    def is_dynamic_dim(self, i: int) -> bool:
        """Whether dimension i is dynamic (`<=N` or `?`)."""
        return bool(self.dynamic) and self.dynamic[i]

    def leaves(self) -> list[Shape]:
        """The array shapes inside (itself)."""
        return [self]

    def with_dtype(self, dtype: str) -> Shape:
        """This shape with another element type."""
        return Shape(dtype, self.dims, self.dynamic, self.layout)

    def with_dims(self, dims: tuple[int, ...] | list[int], layout: Layout | None = None) -> Shape:
        """A static shape of the same type with new dimensions (and the given layout)."""
        return Shape(self.dtype, tuple(dims), (), layout)

    def with_layout(self, layout: Layout | None) -> Shape:
        """This shape with another layout (None drops it)."""
        return Shape(self.dtype, self.dims, self.dynamic, layout)

    def without_layout(self) -> Shape:
        """This shape without a layout."""
        return self.with_layout(None) if self.layout is not None else self

    def with_default_layout(self) -> Shape:
        """This shape with the row-major layout."""
        return self.with_layout(default_layout(self.rank))

    def compatible(self, other: AnyShape) -> bool:
        """Same type and dimensions, layouts ignored."""
        return (
            not other.is_tuple
            and self.dtype == other.dtype
            and self.dims == other.dims
            and (self.dynamic or (False,) * self.rank) == (other.dynamic or (False,) * other.rank)
        )

    def to_text(self, layout: bool = True) -> str:
        """The shape as HLO prints it."""
        if self.dynamic:
            dims = ",".join(
                ("?" if d < 0 else f"<={d}") if dyn else str(d)
                for d, dyn in zip(self.dims, self.dynamic, strict=True)
            )
        else:
            dims = ",".join(map(str, self.dims))
        text = f"{self.dtype}[{dims}]"
        if layout and self.layout is not None:
            written = self.layout.to_text()
            if written != "{}":  # XLA writes a scalar's plain layout as nothing (and rejects `f32[]{}`)
                text += written
        return text

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"Shape({self.to_text()})"


@dataclass(frozen=True, slots=True)
class TupleShape:
    """A tuple of shapes (possibly nested)."""

    elements: tuple[AnyShape, ...] = ()
    _hash: int = field(default=0, init=False, repr=False, compare=False)  # computed on first use

    is_tuple = True
    is_array = False
    dims: tuple[int, ...] = ()
    layout = None

    def __hash__(self) -> int:
        h = self._hash
        if not h:
            h = hash((self.elements,)) or 1
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not TupleShape:
            return NotImplemented
        return self.elements == other.elements

    def __reduce__(self) -> tuple:
        return TupleShape, (self.elements,)  # the hash is per process

    def __getitem__(self, i: int) -> AnyShape:
        return self.elements[i]

    def __len__(self) -> int:
        return len(self.elements)

    @property
    def byte_size(self) -> int:
        """Bytes of all leaves."""
        return sum(s.byte_size for s in self.elements)

    def leaves(self) -> list[Shape]:
        """All array shapes inside, depth first."""
        out: list[Shape] = []
        for e in self.elements:
            out.extend(e.leaves())
        return out

    def without_layout(self) -> TupleShape:
        """This shape with every layout dropped."""
        return TupleShape(tuple(e.without_layout() for e in self.elements))

    def with_default_layout(self) -> TupleShape:
        """Every leaf with its row-major layout."""
        return TupleShape(tuple(e.with_default_layout() for e in self.elements))

    def compatible(self, other: AnyShape) -> bool:
        """Same structure, types and dimensions, layouts ignored."""
        return (
            other.is_tuple
            and len(other.elements) == len(self.elements)
            and all(a.compatible(b) for a, b in zip(self.elements, other.elements, strict=True))
        )

    def to_text(self, layout: bool = True) -> str:
        """The shape as HLO prints it."""
        return "(" + ", ".join(e.to_text(layout) for e in self.elements) + ")"

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"TupleShape({self.to_text()})"


AnyShape = Shape | TupleShape


def scalar(dtype: str) -> Shape:
    """A rank-0 shape of this type."""
    return Shape(dtype, ())


# ----------------------------------------------------------------------------- parsing

_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\s*\[([^\]]*)\]")
_SKIP_RE = re.compile(r"(?:\s+|/\*.*?\*/)*", re.S)
_LAYOUT_ITEM_RE = re.compile(r"T((?:\([^()]*\))+)|E\((\d+)\)|S\((\d+)\)|[A-Z#*]+\((?:[^()]|\([^()]*\))*\)")
#: Deepest tuple nesting accepted (deeper input is an error, not a RecursionError).
MAX_TUPLE_DEPTH = 64
_shape_cache: dict[str, AnyShape] = {}
_array_cache: dict[str, Shape] = {}
_ARRAY_WITH_LAYOUT_RE = re.compile(r"[a-z][a-z0-9]*\[[^\]]*\](?:\{[^{}]*\})?")
_SKIP_START = frozenset(" \t\r\n/")
_LAYOUT_START_RE = re.compile(r"(?:\s|/\*.*?\*/)*[0-9]", re.S)
_SIGNED_INT_LIST_RE = re.compile(r"\s*-?[0-9]+\s*(?:,\s*-?[0-9]+\s*)*")
_TILE_RE = re.compile(r"\s*(?:[0-9]+|\*)\s*(?:,\s*(?:[0-9]+|\*)\s*)*")


def layout_problem(shape: AnyShape) -> str | None:
    """Why a layout of `shape` (or of a tuple's leaf) is invalid, or None: a layout lists each dimension once,
    minor to major (XLA's parser takes any integers; its verifier, `LayoutUtil::ValidateLayoutInShape`, checks)."""
    if shape.is_tuple:
        return next(filter(None, map(layout_problem, shape.elements)), None)
    layout = shape.layout
    if layout is None or sorted(layout.minor_to_major) == list(range(len(shape.dims))):
        return None
    return (f"layout {{{','.join(map(str, layout.minor_to_major))}}} of {shape.to_text(layout=False)} does not list "
            f"each of its {len(shape.dims)} dimension(s) once (minor to major)")


def parse_shape(text: str) -> AnyShape:
    """Parse a whole shape string such as `f32[2,3]{1,0}` or `(s32[], f32[4])`."""
    cached = _shape_cache.get(text)
    if cached is not None:
        return cached
    shape, end = parse_shape_at(text, 0)
    end = _SKIP_RE.match(text, end).end()
    if end != len(text):
        raise ShapeParseError(f"unexpected text after shape: {text[end:]!r}", end)
    if len(_shape_cache) < 100_000:
        _shape_cache[text] = shape
    return shape


def parse_shape_at(text: str, pos: int, depth: int = 0) -> tuple[AnyShape, int]:
    """Parse a shape starting at `pos`; return it and the offset after it."""
    if pos < len(text) and text[pos] in _SKIP_START:
        pos = _SKIP_RE.match(text, pos).end()
    if text.startswith("(", pos):
        if depth >= MAX_TUPLE_DEPTH:
            raise ShapeParseError(f"tuple shape nested more than {MAX_TUPLE_DEPTH} levels deep", pos)
        return _parse_tuple(text, pos, depth + 1)
    fast = _ARRAY_WITH_LAYOUT_RE.match(text, pos)
    if fast is not None and (text.startswith("{", fast.end()) or (
            text[fast.end() - 1] == "]" and text[fast.end():fast.end() + 1] in _SKIP_START
            and _spaced_layout_start(text, fast.end()) != fast.end())):
        fast = None  # a layout with nested braces (e.g. `P(shape{...})`) or after a space: no fast path
    if fast is not None:
        key = fast.group()
        cached = _array_cache.get(key)
        if cached is not None:
            return cached, fast.end()
    m = _ARRAY_RE.match(text, pos)
    if m is None:
        raise ShapeParseError("expected a shape", pos)
    dtype = m.group(1)
    if dtype not in DTYPES:
        raise ShapeParseError(f"unknown primitive type {dtype!r}", pos)
    dims, dynamic = _parse_dims(m.group(2), m.start(2))
    end = m.end()
    layout = None
    if dims and not text.startswith("{", end) and text[end:end + 1] in _SKIP_START:
        end = _spaced_layout_start(text, end)
    if text.startswith("{", end):
        close = _matching_brace(text, end)
        layout = _parse_layout(text[end + 1 : close], end + 1)
        if not dims and layout == Layout(()):
            raise ShapeParseError(f"expected no layout after the scalar shape {text[pos:end]} (XLA writes none)", end)
        if len(layout.minor_to_major) != len(dims):
            raise ShapeParseError(f"expected a layout listing each of the {len(dims)} dimension(s) of "
                                  f"{text[pos:end]} once (minor to major), got {{{text[end + 1 : close]}}}", end)
        end = close + 1  # which dimensions it lists is the verifier's to check, as in XLA
    shape = Shape(dtype, dims, dynamic, layout)
    if fast is not None and fast.end() == end and len(_array_cache) < 100_000:
        _array_cache[fast.group()] = shape
    return shape, end


def _spaced_layout_start(text: str, end: int) -> int:
    """Where a layout written after spaces or comments starts (`bf16[1,128] {1,0}`: XLA's lexer skips them),
    or `end` when what follows is not a layout (`-> f32[4] {` opens a computation's body)."""
    brace = _SKIP_RE.match(text, end).end()
    if text.startswith("{", brace) and _LAYOUT_START_RE.match(text, brace + 1):
        return brace
    return end


def _parse_tuple(text: str, pos: int, depth: int) -> tuple[TupleShape, int]:
    pos += 1
    elements: list[AnyShape] = []
    pos = _SKIP_RE.match(text, pos).end()
    if text.startswith(")", pos):
        return TupleShape(()), pos + 1
    while True:
        shape, pos = parse_shape_at(text, pos, depth)
        elements.append(shape)
        pos = _SKIP_RE.match(text, pos).end()
        if text.startswith(",", pos):
            pos += 1
            continue
        if text.startswith(")", pos):
            return TupleShape(tuple(elements)), pos + 1
        raise ShapeParseError("expected ',' or ')' in tuple shape", pos)


def _parse_dims(body: str, offset: int) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    if not body.strip():
        return (), ()
    dims: list[int] = []
    dyn: list[bool] = []
    for part in body.split(","):
        p = part.strip()
        if p.startswith("<="):
            p, is_dyn = p[2:].strip(), True
        elif p == "?":
            dims.append(-1)
            dyn.append(True)
            continue
        else:
            is_dyn = False
        if not (p.isdigit() and p.isascii()):
            raise ShapeParseError(f"expected a dimension size, got {part.strip()!r}", offset)
        dims.append(int(p))
        dyn.append(is_dyn)
    return tuple(dims), (tuple(dyn) if any(dyn) else ())


#: What a layout's next line may start with (XLA's lexer reads across lines; comments are blanked by then).
_LAYOUT_CONTINUES = frozenset("0123456789,:}-TESP*")


def _matching_brace(text: str, pos: int) -> int:
    depth = 0
    for i in range(pos, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        elif c == "\n" and text[i + 1:i + 80].lstrip(" \t\r")[:1] not in _LAYOUT_CONTINUES:
            break  # the next line starts something else: the layout was never closed
    raise ShapeParseError("expected '}' to close the layout", pos)


def _parse_layout(body: str, offset: int) -> Layout:
    m2m_text, _, items = body.partition(":")
    m2m_text = m2m_text.strip()
    if m2m_text and not _SIGNED_INT_LIST_RE.fullmatch(m2m_text):
        raise ShapeParseError(f"expected a minor-to-major list of integers, got {m2m_text!r}", offset)
    m2m = tuple(int(x) for x in m2m_text.split(",")) if m2m_text else ()
    tiles: list[tuple[int, ...]] = []
    esize = mspace = 0
    extra: list[str] = []
    pos = 0
    items = items.strip()
    while pos < len(items):
        m = _LAYOUT_ITEM_RE.match(items, pos)
        if m is None:
            raise ShapeParseError(f"expected a layout item such as T(8,128), E(4) or S(1), got {items[pos:]!r}", offset)
        if m.group(1) is not None:
            for t in re.findall(r"\(([^()]*)\)", m.group(1)):
                if not _TILE_RE.fullmatch(t):
                    raise ShapeParseError(f"expected tile sizes (integers or '*'), got ({t})", offset)
                tiles.append(tuple(-1 if x.strip() == "*" else int(x) for x in t.split(",")))
        elif m.group(2) is not None:
            esize = int(m.group(2))
        elif m.group(3) is not None:
            mspace = int(m.group(3))
        else:
            extra.append(m.group(0))
        pos = m.end()
    return Layout(m2m, tuple(tiles), esize, mspace, "".join(extra))
