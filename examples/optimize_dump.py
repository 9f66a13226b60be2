"""The offline workflow: dump a jax program's HLO with XLA_FLAGS, optimize the dump directory with hlopt.

    python3 examples/optimize_dump.py [WORKDIR]

The dump is taken with `--xla_dump_large_constants` (XLA elides big literals otherwise, and an elided
literal cannot be run). `hlopt check` then runs every module of the program before XLA's optimizations
that does real work (more than a handful of instructions), largest first, not only the first by name
(which is often a one-instruction `convert`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = """
import jax, jax.numpy as jnp
x = jnp.ones((8, 16)).astype(jnp.bfloat16).astype(jnp.float32)   # a small convert module of its own
f = jax.jit(lambda x, w: jnp.tanh(x @ w).sum(0) * 2.0 + 0.0)
f(x, jnp.ones((16, 4))).block_until_ready()
"""

#: Modules with fewer instructions than this are dumps of single jnp operations, not the program.
MIN_INSTRUCTIONS = 5


def modules_that_matter(dump: Path) -> list[Path]:
    """The dump's modules before XLA's optimizations with real work in them, largest first."""
    from hlopt import hlo

    sized = []
    for path in dump.glob("*before_optimizations.txt"):
        count = hlo.parse_file(path).instruction_count()
        if count >= MIN_INSTRUCTIONS:
            sized.append((count, path))
    return [path for _, path in sorted(sized, key=lambda t: (-t[0], t[1].name))]


def main() -> None:
    """Dump, then `hlopt opt DUMP -p default -o OUT`, and `hlopt check` on every module that matters."""
    work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hlopt-dump-"))
    dump, out = work / "dump", work / "optimized"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_large_constants", JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, "-c", PROGRAM], check=True, env=env)
    hlopt = [sys.executable, "-m", "hlopt.cli.main"]
    subprocess.run([*hlopt, "opt", str(dump), "-p", "default", "-o", str(out), "--timing"], check=True)
    checked = modules_that_matter(dump)
    if not checked:
        raise SystemExit(f"no module with {MIN_INSTRUCTIONS} or more instructions in {dump}")
    for path in checked:
        subprocess.run([*hlopt, "check", str(path), "-p", "default"], check=True)
    print(f"optimized {len(list(out.iterdir()))} modules into {out}; checked {len(checked)} on XLA:CPU: "
          + ", ".join(p.name for p in checked))


if __name__ == "__main__":
    main()
