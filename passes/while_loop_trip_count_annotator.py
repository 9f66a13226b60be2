"""while-loop-trip-count-annotator: record each loop's known trip count (XLA's WhileLoopTripCountAnnotator).

    %w = (s32[], f32[8]) while(%init), condition=%cond, body=%body        # i from 0 while i < 4
->
    %w = (s32[], f32[8]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}

Cost models and the scheduler's roll-up read `known_trip_count`; without it they read the condition, which
fusion may have fused beyond recognition (a loop then counts once). Other backend_config keys are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.analysis.while_loop_analysis import trip_count
from hlopt.hlo.ir import Module
from hlopt.passes.framework.base import ModulePass
from hlopt.passes.framework.registry import register

__all__ = ["WhileLoopTripCountAnnotator"]


@register
@dataclass(frozen=True)
class WhileLoopTripCountAnnotator(ModulePass):
    """Set `known_trip_count` on every while loop whose trip count the while-loop analysis knows."""

    name: ClassVar[str] = "while-loop-trip-count-annotator"

    def run(self, module: Module) -> bool:
        changed = False
        for inst in list(module.instructions()):
            if inst.opcode != "while":
                continue
            n = trip_count(inst)
            if n is None:
                continue
            try:
                config = inst.backend_config_json()
            except ValueError:
                continue  # a backend_config that is not JSON: not ours to rewrite
            config = dict(config) if isinstance(config, dict) else {}
            if config.get("known_trip_count") == {"n": str(n)}:
                continue
            config["known_trip_count"] = {"n": str(n)}
            inst.set_backend_config_json(config)
            changed = True
        return changed
