"""Independent numpy / ml_dtypes reference of block-scaled quantize, dequantize, matmul and cuDNN scale swizzle.

Nothing here uses hlopt or XLA: it is what `block-scaling-rewriter`'s output is checked against.

Block scaling: a tensor's last (contracting) dimension K is cut into blocks of `block` elements; each block
has one scale. The value represented is `data * scale` (both converted to a wide float). A scale tensor
has the data's shape except in the last dimension (ceil(K / block) blocks); it may be "pre-padded" (more
rows in the second-to-last dimension, more blocks in the last), the extra entries being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "BlockFormat", "FORMATS", "expand_scale", "dequantize", "quantize", "block_scaled_dot",
    "quantize_error_bound", "format_error_bound", "cudnn_swizzle_offsets", "cudnn_swizzle", "cudnn_pad",
    "random_block_scaled_operands",
]


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: data type, scale type and the block size along K."""

    name: str
    data: type
    scale: type
    block: int


FORMATS: dict[str, BlockFormat] = {
    "mxfp8": BlockFormat("mxfp8", ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, 32),
    "mxfp8_e5m2": BlockFormat("mxfp8_e5m2", ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu, 32),
    "nvfp4": BlockFormat("nvfp4", ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e4m3fn, 16),
}


def expand_scale(scale: np.ndarray, shape: tuple[int, ...], block: int | None = None) -> np.ndarray:
    """The scale repeated over its block, as float64, cut to `shape` (pre-padded scales are trimmed).

    Without `block` the block size is K // blocks (which must divide K)."""
    s = np.asarray(scale).astype(np.float64)
    k = shape[-1]
    if block is None:
        if k % s.shape[-1]:
            raise ValueError(f"K={k} is not a multiple of the {s.shape[-1]} scale blocks")
        block = k // s.shape[-1]
    blocks = -(-k // block)
    if s.shape[-1] < blocks or any(have < want for have, want in zip(s.shape[:-1], shape[:-1], strict=True)):
        raise ValueError(f"scale {s.shape} is too small for data {shape} with block {block}")
    s = s[tuple(slice(0, d) for d in shape[:-1]) + (slice(0, blocks),)]
    return np.repeat(s, block, axis=-1)[..., :k]


def dequantize(data: np.ndarray, scale: np.ndarray, block: int | None = None,
               dtype: type = np.float32) -> np.ndarray:
    """data * scale (the block's scale for every element), computed in float64, returned as `dtype`."""
    x = np.asarray(data).astype(np.float64)
    return (x * expand_scale(scale, x.shape, block)).astype(dtype)


def _max_exponent(dtype: type) -> int:
    """C++ numeric_limits<T>::max_exponent: one more than the exponent of the largest finite value."""
    return int(np.floor(np.log2(float(ml_dtypes.finfo(dtype).max)))) + 1


def quantize(x: np.ndarray, data_dtype: type, scale_dtype: type, block: int) -> tuple[np.ndarray, np.ndarray]:
    """XLA's quantize rule, in the input's float type.

    Per block: amax = max |x|; scale = amax / 2^(max_exponent(data type) - 1), rounded to the scale type;
    data = x / scale (the rounded scale, back in the input type), rounded to the data type."""
    x = np.asarray(x)
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"K={k} is not a multiple of the block size {block}")
    blocks = x.reshape(*x.shape[:-1], k // block, block)
    amax = np.abs(blocks).max(axis=-1)
    denominator = x.dtype.type(2.0 ** (_max_exponent(data_dtype) - 1))
    scale = (amax / denominator).astype(x.dtype).astype(scale_dtype)
    wide_scale = np.repeat(scale.astype(x.dtype), block, axis=-1)
    data = (x / wide_scale).astype(x.dtype).astype(data_dtype)
    return data, scale


def quantize_error_bound(x: np.ndarray, scale: np.ndarray, data_dtype: type, block: int) -> np.ndarray:
    """Per element: half a step of the data type at |x / scale|, times the scale (round to nearest)."""
    info = ml_dtypes.finfo(data_dtype)
    s = expand_scale(scale, np.shape(x), block)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.abs(np.asarray(x, np.float64)) / s
        exponent = np.floor(np.log2(np.where(v > 0, v, 1.0)))
    exponent = np.maximum(exponent, int(info.minexp))  # subnormals: the step of the smallest normal binade
    return s * 0.5 * np.exp2(exponent - int(info.nmant))


def format_error_bound(x: np.ndarray, data_dtype: type, block: int) -> np.ndarray:
    """The coarse bound of the format: each element is off by at most amax(block) * 2^-(mantissa bits + 1)."""
    info = ml_dtypes.finfo(data_dtype)
    x = np.asarray(x, np.float64)
    k = x.shape[-1]
    amax = np.abs(x.reshape(*x.shape[:-1], k // block, block)).max(axis=-1)
    return np.repeat(amax, block, axis=-1) * 2.0 ** -(int(info.nmant) + 1)


def block_scaled_dot(lhs: np.ndarray, rhs: np.ndarray, lhs_scale: np.ndarray, rhs_scale: np.ndarray | None = None,
                     global_scale: float | np.ndarray | None = None, block: int | None = None,
                     dtype: type = np.float32) -> np.ndarray:
    """Block-scaled [B,]M,K x [B,]N,K -> [B,]M,N: dequantize both sides, contract K (float64), scale, cast.

    `rhs_scale` None: rhs is used as it is. `global_scale` multiplies the result."""
    a = np.asarray(lhs).astype(np.float64) * expand_scale(lhs_scale, np.shape(lhs), block)
    b = np.asarray(rhs).astype(np.float64)
    if rhs_scale is not None:
        b = b * expand_scale(rhs_scale, b.shape, block)
    out = np.einsum("...mk,...nk->...mn", a, b)
    if global_scale is not None:
        out = out * float(np.asarray(global_scale, np.float64))
    return out.astype(dtype)


def cudnn_pad(shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes cuDNN's block-scaled dot gets: rows (dim -2) of data and scales rounded up to 128, scale
    blocks (dim -1) rounded up to 4 (nothing changes when both already fit)."""
    rows, blocks = shape[-2], scale_shape[-1]
    if rows % 128 == 0 and blocks % 4 == 0:
        return tuple(shape), tuple(scale_shape)
    padded_rows = -(-rows // 128) * 128
    padded_blocks = -(-blocks // 4) * 4
    return (*shape[:-2], padded_rows, shape[-1]), (*scale_shape[:-2], padded_rows, padded_blocks)


def cudnn_swizzle_offsets(rows: int, cols: int) -> np.ndarray:
    """Offset in the swizzled buffer of scale element (r, c), for a rows x cols scale matrix.

    The matrix is cut in 128 x 4 tiles stored one after another (row tiles outer, column tiles inner),
    512 bytes each; inside a tile, element (r, c) sits at (r % 32) * 16 + (r // 32) * 4 + c
    (the "128x4 scale factor" layout of Blackwell block-scaled MMA)."""
    if rows % 128 or cols % 4:
        raise ValueError(f"{rows} x {cols} scales are not made of 128 x 4 tiles")
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    tile = (r // 128) * (cols // 4) + c // 4
    inner = (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return tile * 512 + inner


def cudnn_swizzle(scale: np.ndarray) -> np.ndarray:
    """The scale tensor ([B,]R,C with R % 128 == 0 and C % 4 == 0) rearranged into the tile layout."""
    s = np.asarray(scale)
    rows, cols = s.shape[-2:]
    offsets = cudnn_swizzle_offsets(rows, cols).ravel()
    flat = s.reshape(-1, rows * cols)
    out = np.empty_like(flat)
    out[:, offsets] = flat
    return out.reshape(s.shape)


def random_block_scaled_operands(fmt: BlockFormat, batch: int | None, m: int, n: int, k: int, seed: int = 0,
                                 scale_exponents: tuple[int, int] = (-3, 3)) -> list[np.ndarray]:
    """Random lhs [B,]M,K, rhs [B,]N,K and their block scales (powers of two in a small range)."""
    rng = np.random.default_rng(seed)
    lead = () if batch is None else (batch,)
    blocks = -(-k // fmt.block)

    def data(rows: int) -> np.ndarray:
        return rng.standard_normal((*lead, rows, k)).astype(np.float32).astype(fmt.data)

    def scales(rows: int) -> np.ndarray:
        e = rng.integers(scale_exponents[0], scale_exponents[1], (*lead, rows, blocks))
        return np.exp2(e).astype(np.float32).astype(fmt.scale)

    return [data(m), data(n), scales(m), scales(n)]
