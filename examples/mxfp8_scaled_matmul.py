"""An MXFP8 `jax.nn.scaled_matmul`, lowered for CUDA, rewritten by block-scaling-rewriter and run on CPU.

    python3 examples/mxfp8_scaled_matmul.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hlopt.passes.framework.pipeline import run_pipeline

from hlopt import hlo, runtime


def main() -> None:
    """Lower for CUDA (works without a GPU), expand the block-scaled dot, run on XLA CPU, check."""
    rng = np.random.default_rng(0)
    batch, m, n, k, block = 2, 32, 16, 128, 32
    lhs = rng.standard_normal((batch, m, k)).astype(ml_dtypes.float8_e4m3fn)
    rhs = rng.standard_normal((batch, n, k)).astype(ml_dtypes.float8_e4m3fn)
    lhs_scale = np.exp2(rng.integers(-3, 3, (batch, m, k // block))).astype(ml_dtypes.float8_e8m0fnu)
    rhs_scale = np.exp2(rng.integers(-3, 3, (batch, n, k // block))).astype(ml_dtypes.float8_e8m0fnu)

    def f(a, b, sa, sb):
        return jax.nn.scaled_matmul(a, b, sa, sb, preferred_element_type=jnp.float32)

    text = jax.jit(f).trace(lhs, rhs, lhs_scale, rhs_scale).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
    module = hlo.parse(text)
    print("before:", [str(i.get("custom_call_target")) for i in module.instructions() if i.opcode == "custom-call"])
    run_pipeline(module, "block-scaling-rewriter,call-inliner,simplify")
    print("after: ", sorted({i.opcode for i in module.instructions()}))
    out = runtime.execute(module, [lhs, rhs, lhs_scale, rhs_scale])[0]
    deq = lambda x, s: np.asarray(x, np.float32) * np.repeat(np.asarray(s, np.float32), block, axis=-1)  # noqa: E731
    want = np.einsum("bmk,bnk->bmn", deq(lhs, lhs_scale), deq(rhs, rhs_scale))
    print("max |XLA CPU - numpy| =", float(np.abs(out - want).max()), "of max", float(np.abs(want).max()))


if __name__ == "__main__":
    main()
