"""Old module paths that moved into subpackages, still importable with a DeprecationWarning.

`hlopt.passes` and `hlopt.runtime` were split into subpackages (framework, fusion, collectives; execution,
jax_integration, xla_gpu_path, tuning). `import hlopt.passes.priority_fusion` (or `from hlopt.passes import
priority_fusion`) still gives the module, now `hlopt.passes.fusion.priority_fusion`, and warns once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old module path -> its home now
MOVED: dict[str, str] = {
    "hlopt.passes.base": "hlopt.passes.framework.base",
    "hlopt.passes.collective_pipeliner": "hlopt.passes.collectives.collective_pipeliner",
    "hlopt.passes.collective_pipeliner_cost": "hlopt.passes.collectives.collective_pipeliner_cost",
    "hlopt.passes.collective_pipeliner_transform": "hlopt.passes.collectives.collective_pipeliner_transform",
    "hlopt.passes.config": "hlopt.passes.framework.config",
    "hlopt.passes.fusion_budgets": "hlopt.passes.fusion.fusion_budgets",
    "hlopt.passes.fusion_building": "hlopt.passes.fusion.fusion_building",
    "hlopt.passes.fusion_cost": "hlopt.passes.fusion.fusion_cost",
    "hlopt.passes.fusion_rules": "hlopt.passes.fusion.fusion_rules",
    "hlopt.passes.fusion_run": "hlopt.passes.fusion.fusion_run",
    "hlopt.passes.fusion_trial": "hlopt.passes.fusion.fusion_trial",
    "hlopt.passes.fusion_utils": "hlopt.passes.fusion.fusion_utils",
    "hlopt.passes.match": "hlopt.passes.framework.match",
    "hlopt.passes.multi_output_fusion": "hlopt.passes.fusion.multi_output_fusion",
    "hlopt.passes.pipeline": "hlopt.passes.framework.pipeline",
    "hlopt.passes.priority_fusion": "hlopt.passes.fusion.priority_fusion",
    "hlopt.passes.registry": "hlopt.passes.framework.registry",
    "hlopt.passes.triton_softmax_priority_fusion": "hlopt.passes.fusion.triton_softmax_priority_fusion",
    "hlopt.passes.triton_tiling": "hlopt.passes.fusion.triton_tiling",
    "hlopt.passes.while_loop_all_reduce_code_motion": "hlopt.passes.collectives.while_loop_all_reduce_code_motion",
    "hlopt.passes.while_loop_all_reduce_code_motion_setup": "hlopt.passes.collectives.while_loop_all_reduce_code_motion_setup",
    "hlopt.runtime.compare": "hlopt.runtime.execution.compare",
    "hlopt.runtime.gpu_driver": "hlopt.runtime.xla_gpu_path.gpu_driver",
    "hlopt.runtime.gpu_library_calls": "hlopt.runtime.execution.gpu_library_calls",
    "hlopt.runtime.hook": "hlopt.runtime.jax_integration.hook",
    "hlopt.runtime.inputs": "hlopt.runtime.execution.inputs",
    "hlopt.runtime.jit": "hlopt.runtime.jax_integration.jit",
    "hlopt.runtime.reemit": "hlopt.runtime.xla_gpu_path.reemit",
    "hlopt.runtime.reentry": "hlopt.runtime.execution.reentry",
    "hlopt.runtime.saved": "hlopt.runtime.xla_gpu_path.saved",
    "hlopt.runtime.sharding": "hlopt.runtime.execution.sharding",
    "hlopt.runtime.tune": "hlopt.runtime.tuning.tune",
    "hlopt.runtime.tune_report": "hlopt.runtime.tuning.tune_report",
    "hlopt.runtime.tune_space": "hlopt.runtime.tuning.tune_space",
    "hlopt.runtime.xla_gpu": "hlopt.runtime.xla_gpu_path.xla_gpu",
    "hlopt.runtime.xla_stages": "hlopt.runtime.jax_integration.xla_stages",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old path to the module at its new home (the same module object, not a copy)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(new)  # what the import statement binds


def install() -> None:
    """Put the finder on `sys.meta_path` (once)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())  # before an editable install's finder of old paths
