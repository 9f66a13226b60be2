"""HLO sharding annotations: split global arrays into per-device shards and assemble them back.

The text is parsed by `hlo.sharding_syntax` (the one sharding parser; `Sharding` and `parse_sharding` are
re-exported here): `{replicated}`, `{maximal device=N}`, `{manual}`, tiled `{devices=[a,b]<=[n]}` (iota,
optionally transposed `<=[x,y]T(1,0)`) or `{devices=[a,b]0,1,2,3}` (explicit), with
`last_tile_dim_replicate`, and tuple shardings `{{...}, {...}}`.
"""

from __future__ import annotations

import itertools

import numpy as np
from hlopt.hlo.sharding_syntax import Sharding, parse_sharding

__all__ = ["Sharding", "parse_sharding", "split", "assemble"]


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
