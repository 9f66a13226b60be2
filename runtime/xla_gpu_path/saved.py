"""What `hlopt compile` writes, run on a GPU host: `runtime.load(DIR)` and `hlopt run DIR --inputs X.npz`.

`hlopt compile` (deviceless, on any host) writes DIR/executable.bin and DIR/signature.json: the target, the
device count, which compile the guard kept, and the entry's argument and result shapes and dtypes (per
device). `load(DIR)` checks this machine has that GPU and loads the executable the way jax's persistent
compilation cache loads a serialized one (`xla_gpu.load_executable`); `SavedExecutable.run(inputs)` checks
the inputs against the signature first. Without a GPU, loading stops with one line saying so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hlopt.hlo.ir import Module

__all__ = ["Signature", "SavedExecutable", "signature_of", "load", "read_signature", "NoGpuError",
           "SIGNATURE_FILE", "check_inputs"]

SIGNATURE_FILE = "signature.json"


class NoGpuError(RuntimeError):
    """The executable needs a GPU this machine does not have (one line)."""


@dataclass(frozen=True)
class Signature:
    """Arguments and results (shape, dtype) of a compiled module's entry, per device, and where it runs."""

    target: str
    devices: int
    arguments: tuple[tuple[tuple[int, ...], str], ...]
    results: tuple[tuple[tuple[int, ...], str], ...]
    kept: str = "hlopt"

    def as_dict(self) -> dict[str, Any]:
        """signature.json's content."""
        return {"target": self.target, "devices": self.devices, "kept": self.kept,
                "arguments": [{"shape": list(s), "dtype": d} for s, d in self.arguments],
                "results": [{"shape": list(s), "dtype": d} for s, d in self.results]}


def _leaves(shape: Any) -> list[Any]:
    return shape.leaves() if shape.is_tuple else [shape]


def signature_of(module: Module, target: str, devices: int, kept: str = "hlopt") -> Signature:
    """The signature of a module's entry (its parameters, its root's leaves)."""
    def entry(shape: Any) -> tuple[tuple[int, ...], str]:
        return tuple(int(d) for d in shape.dims), str(shape.dtype)

    return Signature(target, devices, tuple(entry(p.shape) for p in module.entry.parameters),
                     tuple(entry(s) for s in _leaves(module.entry.root.shape)), kept)


def read_signature(directory: str | Path) -> Signature:
    """DIR/signature.json; ValueError with one line when it is missing or not one."""
    path = Path(directory) / SIGNATURE_FILE
    try:
        data = json.loads(path.read_text())
        return Signature(str(data["target"]), int(data["devices"]),
                         tuple((tuple(a["shape"]), str(a["dtype"])) for a in data["arguments"]),
                         tuple((tuple(r["shape"]), str(r["dtype"])) for r in data["results"]),
                         str(data.get("kept", "hlopt")))
    except FileNotFoundError:
        raise ValueError(f"{path}: not found (is {directory} a folder `hlopt compile` wrote?)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a signature written by `hlopt compile` ({type(e).__name__}: {e})") from None


def check_inputs(signature: Signature, inputs: list[np.ndarray]) -> None:
    """ValueError with one line when the inputs do not match the signature's arguments (count, shape, dtype)."""
    if len(inputs) != len(signature.arguments):
        raise ValueError(f"{len(inputs)} inputs for {len(signature.arguments)} arguments")
    for i, (x, (shape, dtype)) in enumerate(zip(inputs, signature.arguments, strict=True)):
        if tuple(x.shape) != tuple(shape) or _dtype_name(x.dtype) != dtype:
            raise ValueError(f"argument {i}: expected {dtype}{list(shape)}, got {_dtype_name(x.dtype)}{list(x.shape)}")


def _dtype_name(dtype: Any) -> str:
    """numpy dtype -> HLO dtype name."""
    from hlopt.hlo.shape import dtype_of_numpy

    return dtype_of_numpy(np.dtype(dtype))


@dataclass
class SavedExecutable:
    """An executable `hlopt compile` wrote, loaded on this machine's GPU(s)."""

    directory: Path
    signature: Signature
    executable: Any  # runtime.Executable

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run on `inputs` (checked against the signature); the results, flattened."""
        check_inputs(self.signature, inputs)
        return self.executable.execute(inputs)


def load(directory: str | Path) -> SavedExecutable:
    """Load DIR/executable.bin on this machine's GPU(s); NoGpuError (one line) without the GPU it was compiled
    for, ValueError for a folder `hlopt compile` did not write."""
    from hlopt.hlo.parser import parse
    from hlopt.runtime.xla_gpu_path.xla_gpu import load_executable, local_target

    directory = Path(directory)
    signature = read_signature(directory)
    binary = directory / "executable.bin"
    if not binary.is_file():
        raise ValueError(f"{binary}: not found")
    here = local_target()
    if here is None:
        raise NoGpuError(f"{binary} is an XLA:GPU executable for {signature.devices} x {signature.target}; this "
                         "machine has no GPU that jax sees (run it on a GPU host with jax[cuda12])")
    if here != signature.target:
        raise NoGpuError(f"{binary} was compiled for {signature.target}; this machine's GPU is {here}")
    module = parse((directory / "hlopt.hlo").read_text(), filename=str(directory / "hlopt.hlo"))
    return SavedExecutable(directory, signature, load_executable(binary.read_bytes(), module, platform="gpu"))
