"""passes: the pass framework (base classes, registry, pipelines) and hlopt's built-in passes."""

from passes.base import ComputationPass, ExpanderPass, ModulePass, Pass
from passes.registry import create_pass, get_pass, load_plugin_file, register, registered_passes

#: Modules whose import registers the built-in passes (a missing one is skipped).
BUILTIN_PASS_MODULES = [
    "passes.call_inliner",
    "passes.dce",
    "passes.cse",
    "passes.tuple_simplifier",
    "passes.algebraic_simplifier",
    "passes.conditional_simplifier",
    "passes.while_loop_all_reduce_code_motion",
    "passes.block_scaling_rewriter",
    "passes.priority_fusion",
    "passes.multi_output_fusion",
    "scheduler.async_collective_creator",
    "scheduler.latency_hiding_scheduler",
]

__all__ = [
    "Pass", "ModulePass", "ComputationPass", "ExpanderPass",
    "register", "get_pass", "create_pass", "registered_passes", "load_plugin_file", "BUILTIN_PASS_MODULES",
]
