"""The fusion machinery in one import, for the passes and plugins that imported it from here. It lives in
modules by concern:

- `fusion_rules`: XLA:GPU's fusibility rules, heroes, fusion kinds, in-place and scatter rules, which
  computations fuse (no cost model);
- `fusion_cost`: `Profile` of an instruction or fusion, `FusionCostModel` (fusion's view of `cost_model`);
- `fusion_budgets`: `Budgets` and the rules that read profiles (budgets, code size, heavy computations);
- `fusion_run`: `FusionPass`, `FusionRun` (the state of one run) and `Explanation`;
- `fusion_building`: building and merging fusions as XLA prints them;
- `dot_strength_reduction`, `select_and_scatter_expander`: XLA:GPU's pre-fusion rewrites.
"""

from __future__ import annotations

import warnings

from hlopt.hlo.ir import Module
from hlopt.passes import (
    dot_strength_reduction,
    select_and_scatter_expander,
)
from hlopt.passes.dot_strength_reduction import *  # noqa: F403 - re-exported
from hlopt.passes.fusion import (
    fusion_budgets,
    fusion_building,
    fusion_cost,
    fusion_rules,
    fusion_run,
)
from hlopt.passes.fusion.fusion_budgets import *  # noqa: F403
from hlopt.passes.fusion.fusion_building import *  # noqa: F403
from hlopt.passes.fusion.fusion_cost import *  # noqa: F403
from hlopt.passes.fusion.fusion_cost import _FusionCostModel  # noqa: F401 - re-exported (deprecated name)
from hlopt.passes.fusion.fusion_rules import *  # noqa: F403
from hlopt.passes.fusion.fusion_run import *  # noqa: F403
from hlopt.passes.select_and_scatter_expander import *  # noqa: F403

#: The modules this one gathers; each one's public names are this module's.
_PARTS = (fusion_rules, fusion_cost, fusion_budgets, fusion_run, fusion_building, dot_strength_reduction,
          select_and_scatter_expander)

__all__ = [name for part in _PARTS for name in part.__all__] + ["clear_caches", "flush_computations"]


def clear_caches() -> None:
    """Deprecated, does nothing: a fusion run's caches live in its `FusionRun` and go with it."""
    warnings.warn("fusion_utils.clear_caches() is deprecated and does nothing: per-run caches live in the "
                  "run's FusionRun", DeprecationWarning, stacklevel=2)


def flush_computations(module: Module) -> None:
    """Deprecated, does nothing: a builder called without `run=` puts its computations into the module
    before it returns, and a `FusionRun` puts them in at `finish()`."""
    warnings.warn("fusion_utils.flush_computations() is deprecated and does nothing: builders without run= "
                  "apply their edits, FusionRun.finish() applies a run's", DeprecationWarning, stacklevel=2)
