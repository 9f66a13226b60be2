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
from hlopt.passes.dot_strength_reduction import (  # noqa: F401 - re-exported
    DOT_STRENGTH_REDUCTION_THRESHOLD,
    is_strength_reducible_dot,
    strength_reduce_dot,
)
from hlopt.passes.fusion_budgets import (  # noqa: F401 - re-exported
    DEFAULT_BUDGETS,
    Budgets,
    budget_refusal,
    creates_heavy_computation,
    merged_too_large,
)
from hlopt.passes.fusion_building import (  # noqa: F401 - re-exported
    fuse_into_multi_output,
    fuse_into_new_fusion,
    fuse_producer,
    merge_into_multi_output,
    remove_fusion,
    wrap_in_fusion,
)
from hlopt.passes.fusion_cost import (  # noqa: F401 - re-exported
    FULL_DEVICE_THREADS,
    XLA_OP_COST,
    FlopsSource,
    FusionCostModel,
    InstructionFlops,
    Profile,
    _FusionCostModel,
    instruction_flops,
    merge_profiles,
    param_reads_multiple,
    profile_of,
    reads_elements_multiple_times,
)
from hlopt.passes.fusion_rules import (  # noqa: F401 - re-exported
    EW,
    FUSIBLE_KINDS,
    GEMM_REWRITE_SIZE_THRESHOLD,
    MAX_BASIC_BLOCK_SPLITS,
    MAX_IR_SIZE,
    MAX_OPERANDS_AND_OUTPUTS,
    MAX_UNNESTED_REDUCTIONS,
    SHARED_MEMORY_PER_BLOCK,
    SIGNIFICANT_REDUCE,
    SPLITS_BLOCKS,
    WARP,
    byte_size,
    element_count,
    find_hero,
    fusible_computations,
    fusion_kind,
    fusion_roots,
    in_place_operand,
    in_place_refusal,
    is_elementwise,
    is_fusible,
    is_gemm_dot,
    is_gemm_epilogue,
    is_multi_output,
    is_row_reduction,
    is_tiled_transpose,
    is_unnested_reduction,
    keeps_reduction_hero,
    reduction_groups,
    reduction_hero,
    scatter_refusal,
    unique,
    with_layouts,
)
from hlopt.passes.fusion_run import (  # noqa: F401 - re-exported
    Explanation,
    FusionPass,
    FusionRun,
)
from hlopt.passes.select_and_scatter_expander import (  # noqa: F401 - re-exported
    can_expand_select_and_scatter,
    expand_select_and_scatter,
)

__all__ = [
    "MAX_OPERANDS_AND_OUTPUTS", "MAX_UNNESTED_REDUCTIONS", "MAX_IR_SIZE", "MAX_BASIC_BLOCK_SPLITS",
    "SHARED_MEMORY_PER_BLOCK", "SIGNIFICANT_REDUCE", "WARP", "EW", "SPLITS_BLOCKS", "FUSIBLE_KINDS",
    "is_elementwise", "is_multi_output", "is_fusible", "GEMM_REWRITE_SIZE_THRESHOLD", "is_gemm_dot",
    "is_gemm_epilogue", "with_layouts", "element_count", "byte_size", "reduction_groups",
    "is_unnested_reduction", "is_row_reduction", "is_tiled_transpose", "find_hero", "keeps_reduction_hero",
    "fusion_roots", "fusion_kind", "reduction_hero", "in_place_operand", "in_place_refusal", "scatter_refusal",
    "fusible_computations", "unique", "reads_elements_multiple_times", "Profile", "XLA_OP_COST",
    "FULL_DEVICE_THREADS", "instruction_flops", "FlopsSource", "InstructionFlops", "merge_profiles",
    "profile_of", "param_reads_multiple", "FusionCostModel", "Budgets", "DEFAULT_BUDGETS", "budget_refusal",
    "merged_too_large", "creates_heavy_computation", "FusionPass", "FusionRun", "Explanation", "wrap_in_fusion",
    "fuse_into_new_fusion", "fuse_producer", "fuse_into_multi_output", "merge_into_multi_output",
    "remove_fusion", "DOT_STRENGTH_REDUCTION_THRESHOLD", "is_strength_reducible_dot", "strength_reduce_dot",
    "can_expand_select_and_scatter", "expand_select_and_scatter", "clear_caches", "flush_computations",
]


def clear_caches() -> None:
    """Deprecated, does nothing: a fusion run's caches live in its `FusionRun` and go with it."""
    warnings.warn("fusion_utils.clear_caches() is deprecated and does nothing: per-run caches live in the "
                  "run's FusionRun", DeprecationWarning, stacklevel=2)


def flush_computations(module: Module) -> None:
    """Deprecated, does nothing: a builder called without `run=` puts its computations into the module
    before it returns, and a `FusionRun` puts them in at `finish()`."""
    warnings.warn("fusion_utils.flush_computations() is deprecated and does nothing: builders without run= "
                  "apply their edits, FusionRun.finish() applies a run's", DeprecationWarning, stacklevel=2)
