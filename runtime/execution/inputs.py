"""Random inputs that respect each parameter's dtype (integers in safe ranges, valid f8/f4/e8m0 values)."""

from __future__ import annotations

import numpy as np
from hlopt.hlo.ir import Module
from hlopt.hlo.shape import DTYPES, AnyShape, Shape

__all__ = ["random_array", "random_inputs"]


def random_array(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    """A random array of this shape whose values are valid and moderate for its dtype."""
    if shape.is_tuple:
        raise ValueError("tuple parameters are not supported; pass their elements")
    dt = DTYPES[shape.dtype]
    dims = tuple(max(d, 0) for d in shape.dims)
    if dt.kind == "pred":
        return rng.random(dims) < 0.5
    if dt.kind in ("sint", "uint"):
        if dt.numpy is None:
            raise ValueError(f"no numpy type for {shape.dtype}")
        low, high = (0, min(16, 2 ** dt.bits)) if dt.kind == "uint" else (-min(8, 2 ** (dt.bits - 1)),
                                                                            min(8, 2 ** (dt.bits - 1)))
        return rng.integers(low, high, size=dims).astype(dt.numpy)
    if dt.kind == "complex":
        return (rng.standard_normal(dims) + 1j * rng.standard_normal(dims)).astype(dt.numpy)
    if dt.kind == "float":
        if shape.dtype == "f8e8m0fnu":
            return np.exp2(rng.integers(-4, 5, size=dims).astype(np.float32)).astype(dt.numpy)
        return rng.standard_normal(dims).astype(np.float32).astype(dt.numpy)
    raise ValueError(f"cannot make random values of type {shape.dtype}")


def _param_shapes(module: Module | str) -> list[AnyShape]:
    if isinstance(module, str):
        from hlopt.hlo.parser import parse

        module = parse(module)
    return [p.shape for p in module.entry.parameters]


def random_inputs(module: Module | str, seed: int = 0, per_device: int | None = None) -> list[np.ndarray]:
    """Random arguments for the entry computation (of a Module or HLO text), in parameter order.

    Values are deterministic for a seed and moderate for their type: pred 50/50; signed integers in
    [-8, 8) and unsigned in [0, 16) (narrower for s2/u2/s4/u4); floats standard normal rounded to the type
    (bf16, f16, every f8 and f4e2m1fn); f8e8m0fnu powers of two 2^-4..2^4; complex with normal parts.
    With `per_device=N`, each array gets a leading axis of N (a different value per device), for modules
    that are already partitioned per device or run as replicas.
    """
    rng = np.random.default_rng(seed)
    out = []
    for shape in _param_shapes(module):
        if per_device:
            out.append(np.stack([random_array(shape, rng) for _ in range(per_device)]))
        else:
            out.append(random_array(shape, rng))
    return out
