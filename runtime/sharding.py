"""HLO sharding annotations: split global arrays into per-device shards and assemble them back.

Handles what XLA's SPMD partitioner prints on an optimized module's parameters and root:
`{replicated}`, `{maximal device=N}`, `{manual}`, tiled `{devices=[a,b]<=[n]}` (iota, optionally
transposed `<=[x,y]T(1,0)`) or `{devices=[a,b]0,1,2,3}` (explicit), with `last_tile_dim_replicate`,
and tuple shardings `{{...}, {...}}`.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

__all__ = ["Sharding", "parse_sharding", "split", "assemble"]


@dataclass(frozen=True)
class Sharding:
    """One array's sharding: replicated, or tiles with a device assignment."""

    kind: str  # replicated | maximal | manual | tiled
    tile_dims: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()  # row-major over tile_dims
    replicate_last: bool = False
    device: int = 0


_TILED = re.compile(r"devices=\[([\d,]+)\]\s*(?:<=\[([\d,]+)\](?:T\(([\d,]+)\))?|([\d,\s]+))")


def _split_top(text: str) -> list[str]:
    from hlopt.hlo.lexer import split_top_level

    return [p.strip() for p in split_top_level(text, ",") if p.strip()]


def parse_sharding(text: str) -> Sharding | list:
    """A Sharding, or a (nested) list of them for a tuple sharding."""
    t = text.strip()
    if t.startswith("{") and t.endswith("}"):
        inner = t[1:-1].strip()
        if inner.startswith("{"):
            return [parse_sharding(p) for p in _split_top(inner)]
        t = inner
    if t.startswith("replicated") or not t:
        return Sharding("replicated")
    if t.startswith("manual"):
        return Sharding("manual")
    m = re.match(r"maximal device=(\d+)", t)
    if m:
        return Sharding("maximal", device=int(m.group(1)))
    m = _TILED.search(t)
    if m is None:
        raise ValueError(f"unsupported sharding {text!r}")
    tile = tuple(int(x) for x in m.group(1).split(","))
    n = int(np.prod(tile))
    if m.group(4) is not None:
        order = tuple(int(x) for x in m.group(4).replace(" ", "").split(",") if x)
    else:
        reshape = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(n).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        order = tuple(int(x) for x in ids.reshape(-1))
    return Sharding("tiled", tile, order, "last_tile_dim_replicate" in t)


def _blocks(sharding: Sharding, rank: int):
    """(device, tile index over the array's dims) for each tile."""
    dims = sharding.tile_dims
    for flat, idx in enumerate(itertools.product(*(range(d) for d in dims))):
        yield sharding.devices[flat], idx[:rank]


def split(x: np.ndarray, sharding: Sharding, num_devices: int) -> list[np.ndarray]:
    """The shard each device holds."""
    if sharding.kind != "tiled":
        return [x] * num_devices
    rank = x.ndim
    tiles = sharding.tile_dims[:rank]
    sizes = [d // t for d, t in zip(x.shape, tiles, strict=True)]
    out: list[np.ndarray | None] = [None] * num_devices
    for device, idx in _blocks(sharding, rank):
        sl = tuple(slice(i * s, (i + 1) * s) for i, s in zip(idx, sizes, strict=True))
        out[device] = x[sl]
    return [o if o is not None else x for o in out]


def assemble(shards: list[np.ndarray], sharding: Sharding) -> np.ndarray:
    """The global array from per-device shards."""
    if sharding.kind != "tiled":
        return shards[sharding.device if sharding.kind == "maximal" else 0]
    rank = shards[0].ndim
    tiles = sharding.tile_dims[:rank]
    shape = tuple(s * t for s, t in zip(shards[0].shape, tiles, strict=True))
    out = np.empty(shape, dtype=shards[0].dtype)
    sizes = shards[0].shape
    for device, idx in _blocks(sharding, rank):
        sl = tuple(slice(i * s, (i + 1) * s) for i, s in zip(idx, sizes, strict=True))
        out[sl] = shards[device]
    return out
