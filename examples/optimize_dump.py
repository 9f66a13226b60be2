"""The offline workflow: dump a jax program's HLO with XLA_FLAGS, optimize the dump directory with hlopt.

    python3 examples/optimize_dump.py [WORKDIR]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = """
import jax, jax.numpy as jnp
f = jax.jit(lambda x, w: jnp.tanh(x @ w).sum(0) * 2.0 + 0.0)
f(jnp.ones((8, 16)), jnp.ones((16, 4))).block_until_ready()
"""


def main() -> None:
    """Dump, then `hlopt opt DUMP -p default -o OUT` and `hlopt check` on one module."""
    work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hlopt-dump-"))
    dump, out = work / "dump", work / "optimized"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}", JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, "-c", PROGRAM], check=True, env=env)
    subprocess.run(["hlopt", "opt", str(dump), "-p", "default", "-o", str(out), "--timing"], check=True)
    before = sorted(dump.glob("*before_optimizations.txt"))[0]
    subprocess.run(["hlopt", "check", str(before), "-p", "default"], check=True)
    print(f"optimized {len(list(out.iterdir()))} modules into {out}")


if __name__ == "__main__":
    main()
