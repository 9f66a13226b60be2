"""passes: the pass framework (base classes, registry, pipelines) and hlopt's built-in passes."""

from hlopt.passes.base import ComputationPass, ExpanderPass, ModulePass, Pass
from hlopt.passes.registry import create_pass, get_pass, load_plugin_file, register, registered_passes

#: Modules whose import registers the built-in passes (a missing one is skipped).
BUILTIN_PASS_MODULES = [
    "hlopt.passes.call_inliner",
    "hlopt.passes.dce",
    "hlopt.passes.cse",
    "hlopt.passes.tuple_simplifier",
    "hlopt.passes.algebraic_simplifier",
    "hlopt.passes.conditional_simplifier",
    "hlopt.passes.while_loop_all_reduce_code_motion",
    "hlopt.passes.block_scaling_rewriter",
    "hlopt.passes.priority_fusion",
    "hlopt.passes.multi_output_fusion",
    "hlopt.scheduler.async_collective_creator",
    "hlopt.scheduler.latency_hiding_scheduler",
]

__all__ = [
    "Pass", "ModulePass", "ComputationPass", "ExpanderPass",
    "register", "get_pass", "create_pass", "registered_passes", "load_plugin_file", "BUILTIN_PASS_MODULES",
]
