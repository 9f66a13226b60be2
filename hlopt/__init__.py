"""hlopt: optimize XLA HLO in Python.

The subpackages are `hlopt.hlo` (the IR, parser, printer, verifier), `hlopt.passes` (the pass framework and
passes), `hlopt.cost_model`, `hlopt.scheduler`, `hlopt.runtime` (jaxlib) and `hlopt.cli`. This module gives the
short names users type; everything that needs jax is imported on first use, so `import hlopt` stays cheap.
"""

from __future__ import annotations

import importlib
from pathlib import Path as _Path
from typing import Any

_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "hlo" / "__init__.py").is_file():
    # Run from a source checkout (installed or not): the subpackages are the checkout's top-level folders,
    # as setuptools' package-dir maps them on install.
    __path__.append(str(_CHECKOUT))

from hlopt import _moved  # noqa: E402

_moved.install()  # old module paths of what moved into subpackages

#: short name -> (module, attribute)
_SHORT_NAMES: dict[str, tuple[str, str]] = {
    "parse": ("hlopt.hlo", "parse"),
    "parse_file": ("hlopt.hlo", "parse_file"),
    "verify": ("hlopt.hlo", "verify"),
    "Module": ("hlopt.hlo", "Module"),
    "Computation": ("hlopt.hlo", "Computation"),
    "Instruction": ("hlopt.hlo", "Instruction"),
    "HloParseError": ("hlopt.hlo", "HloParseError"),
    "HloVerifyError": ("hlopt.hlo", "HloVerifyError"),
    "run_pipeline": ("hlopt.passes.framework.pipeline", "run_pipeline"),
    "Pipeline": ("hlopt.passes.framework.pipeline", "Pipeline"),
    "register": ("hlopt.passes.framework.registry", "register"),
    "get_pass": ("hlopt.passes.framework.registry", "get_pass"),
    "jit": ("hlopt.runtime", "jit"),
    "hook": ("hlopt.runtime", "hook"),
    "capture": ("hlopt.runtime", "capture"),
    "compile": ("hlopt.runtime", "compile"),
    "execute": ("hlopt.runtime", "execute"),
    "run_and_compare": ("hlopt.runtime", "run_and_compare"),
}

_SUBPACKAGES = ("hlo", "passes", "cost_model", "scheduler", "runtime", "cli")

__all__ = ["__version__", *_SHORT_NAMES]


def _installed_version() -> str:
    """The installed distribution's version (importlib.metadata is slow to import: read on first use)."""
    from importlib import metadata

    try:
        return metadata.version("hlopt")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """Import the module behind a short name on first use (and read `__version__`)."""
    if name == "__version__":
        value = globals()[name] = _installed_version()
        return value
    if name in _SHORT_NAMES:
        module_name, attribute = _SHORT_NAMES[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hlopt.{name}")
    raise AttributeError(f"module 'hlopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"__version__"} | set(_SHORT_NAMES) | set(_SUBPACKAGES))
