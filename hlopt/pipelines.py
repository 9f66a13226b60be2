"""Every named pipeline of hlopt (`default`, `simplify`, ... usable anywhere in a pipeline spec), in one place.

This module sits above the scheduler (it imports `passes` and `scheduler`, nothing higher): it registers the
scheduler's passes, which `passes/` cannot import, and names the pipelines built from the registered passes.
The pass registry imports it on first use (`passes.framework.registry.OWN_PLUGIN_MODULE`), as it would an installed
plugin's entry point but without reading any distribution's metadata; plugins of other packages still come
through the `hlopt.passes` entry points, and may name pipelines of their own with
`passes.framework.pipeline.register_pipeline`. A named pipeline skips passes this installation lacks.
"""

from __future__ import annotations

from hlopt.passes.framework.pipeline import register_pipeline
from hlopt.scheduler.async_collective_creator import AsyncCollectiveCreator
from hlopt.scheduler.latency_hiding_scheduler import LatencyHidingScheduler

__all__ = ["PIPELINES", "SCHEDULER_PASSES"]

#: The passes of the layers above `passes`: importing them registers them (`@register`); `passes/` never
#: imports upward.
SCHEDULER_PASSES = (AsyncCollectiveCreator, LatencyHidingScheduler)

#: name -> spec of every named pipeline.
PIPELINES: dict[str, str] = {
    "simplify": "fix(algebraic-simplifier,conditional-simplifier,tuple-simplifier,cse,dce)",
    "cleanup": "fix(tuple-simplifier,dce)",
    #: XLA:GPU's fusion: its pre-fusion rewrites, then priority and multi-output fusion
    "fusion": "dot-strength-reduction,select-and-scatter-expander,scatter-simplifier,priority-fusion,"
              "multi-output-fusion",
    #: collective-pipeliner in XLA:GPU's order (all-reduce forward, all-gather backward, reduce-scatter
    #: forward), each move only where hlopt's cost model says it pays (`cost_model=h100`)
    "collective-pipelining": (
        "collective-pipeliner{direction=forward,op=all-reduce,cost_model=h100},"
        "collective-pipeliner{direction=backward,op=all-gather,cost_model=h100},"
        "collective-pipeliner{direction=forward,op=reduce-scatter,cost_model=h100}"
    ),
    "default": (
        "call-inliner,simplify,block-scaling-rewriter,while-loop-all-reduce-code-motion,simplify,"
        "collective-pipelining,simplify,while-loop-trip-count-annotator,fusion,dce,latency-hiding-scheduler"
    ),
    #: `hlopt compile` and the GPU hook: step 1, before XLA:GPU's passes (runtime.xla_gpu_path.reemit.BEFORE_XLA)
    "xla-gpu-before": ("call-inliner,block-scaling-rewriter,while-loop-all-reduce-code-motion,simplify,"
                       "collective-pipelining,simplify"),
    #: step 3, on XLA:GPU's module with its generic fusion and scheduler off (runtime.xla_gpu_path.reemit.AFTER_XLA;
    #: priority-fusion grows XLA's Triton fusions in its queue, as XLA's PriorityFusion does;
    #: async-collective-creator converts what XLA left synchronous;
    #: tree-reduction-rewriter splits the column reductions XLA's model rates slow; copy-fusion and
    #: horizontal-loop-fusion take the copies step 2's copy insertion made and the small independent kernels)
    "xla-gpu-after": ("tree-reduction-rewriter,priority-fusion{triton_softmax_priority_fusion=true},"
                      "multi-output-fusion,copy-fusion,horizontal-loop-fusion,async-collective-creator,"
                      "latency-hiding-scheduler"),
}

for _name, _spec in PIPELINES.items():
    register_pipeline(_name, _spec)
