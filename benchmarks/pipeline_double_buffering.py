"""Double-buffered pipelined loops on other shapes: `hlopt compile` with and without XLA's loop double buffering.

    python3 benchmarks/pipeline_double_buffering.py

For scanned steps of `benchmarks/pipeline_programs.py` at other sizes, layer counts and device counts, XLA's
estimate of `hlopt compile`'s final module (`runtime.reemit.compile_for_gpu`) with `double_buffering=False` and
`True`, as ratios to XLA:GPU's default compile of the same program (deviceless H100). `compile_for_gpu`'s default,
"best", keeps the faster of the two. Needs the XLA:GPU compiler.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import conftest  # noqa: E402,F401 - 8 CPU devices and JAX_PLATFORMS=cpu, before jax is imported

#: (program, devices, sizes)
SHAPES = (
    ("fsdp_scan", 8, {"layers": 6, "d": 256, "d_ff": 1024}),
    ("fsdp_scan", 8, {"layers": 3}),
    ("fsdp_scan", 8, {"layers": 8, "seq": 256}),
    ("fsdp_scan_remat", 8, {"layers": 5, "d": 384, "d_ff": 1536}),
    ("dp_scan", 8, {"layers": 6, "d": 256, "d_ff": 1024}),
    ("fsdp_scan", 4, {"layers": 4}),
    ("dp_scan", 4, {"layers": 4}),
)


def row(name: str, devices: int, sizes: dict) -> str:
    """One markdown row: XLA's default, without, with (us and ratios)."""
    from hlopt.hlo.parser import parse
    from hlopt.runtime.reemit import compile_for_gpu
    from hlopt.runtime.xla_gpu import estimate

    import benchmarks.pipeline_programs as programs

    programs.DEVICES = devices
    text = programs.capture(name, **sizes)
    times = []
    for double_buffering in (False, True):
        result = compile_for_gpu(parse(text), "h100", devices, double_buffering=double_buffering)
        times.append(estimate(result.final.final, "h100", devices).modeled_us)
    base = estimate(result.xla_default.final, "h100", devices).modeled_us
    shape = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return (f"| {name} | {devices} | {shape} | {base:.1f} | {times[0]:.1f} ({times[0] / base:.3f}) | "
            f"{times[1]:.1f} ({times[1] / base:.3f}) |")


def main() -> int:
    from hlopt.runtime.xla_gpu import available

    if not available():
        print("the XLA:GPU compiler is not installed: pip install 'hlopt[gpu-compile]'", file=sys.stderr)
        return 2
    print("| program | devices | sizes | XLA default (us) | without (us) | with (us) |")
    print("|---|---:|---|---:|---:|---:|")
    for name, devices, sizes in SHAPES:
        print(row(name, devices, sizes), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
