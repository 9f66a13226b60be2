"""passes: the pass framework (base classes, registry, pipelines) and hlopt's built-in passes."""

from hlopt.passes.framework.base import ComputationPass, ExpanderPass, ModulePass, Pass
from hlopt.passes.framework.registry import (
    create_pass,
    get_pass,
    load_plugin_file,
    register,
    registered_passes,
)

#: Modules of this package whose import registers the built-in passes. Passes of the higher layers (the
#: scheduler's async-collective-creator and latency-hiding-scheduler) register in `hlopt/pipelines.py`, which
#: the registry loads after these (`registry.OWN_PLUGIN_MODULE`), so that `passes` never imports upward.
BUILTIN_PASS_MODULES = [
    "hlopt.passes.call_inliner",
    "hlopt.passes.dce",
    "hlopt.passes.cse",
    "hlopt.passes.tuple_simplifier",
    "hlopt.passes.algebraic_simplifier",
    "hlopt.passes.conditional_simplifier",
    "hlopt.passes.collectives.while_loop_all_reduce_code_motion",
    "hlopt.passes.collectives.collective_pipeliner",
    "hlopt.passes.while_loop_trip_count_annotator",
    "hlopt.passes.block_scaling_rewriter",
    "hlopt.passes.dot_strength_reduction",
    "hlopt.passes.select_and_scatter_expander",
    "hlopt.passes.scatter_simplifier",
    "hlopt.passes.tree_reduction_rewriter",
    "hlopt.passes.fusion.triton_softmax_priority_fusion",
    "hlopt.passes.fusion.priority_fusion",
    "hlopt.passes.fusion.multi_output_fusion",
    "hlopt.passes.fusion.copy_fusion",
    "hlopt.passes.fusion.horizontal_loop_fusion",
]

__all__ = [
    "Pass", "ModulePass", "ComputationPass", "ExpanderPass",
    "register", "get_pass", "create_pass", "registered_passes", "load_plugin_file", "BUILTIN_PASS_MODULES",
]
