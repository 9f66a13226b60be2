"""Scheduling heuristics: named, registered objects that rank ready candidates.

The scheduler works bottom-up (from the root towards the parameters, as XLA's does). At each step it
asks the heuristic for `priority(node, state)` of every schedulable ready node and takes the largest
(tuples compare lexicographically, so a heuristic is a prioritized list of rules like XLA's ReadySetLt).

Add your own in a file loaded with `--load`:

    @register_heuristic
    class PreferBigKernels(Heuristic):
        name = "big-first"
        def priority(self, node, state):
            return (node.is_done, node.cost, node.index)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from hlopt.scheduler.graph import Node

__all__ = ["Heuristic", "SchedState", "register_heuristic", "get_heuristic", "HEURISTICS"]


@dataclass
class SchedState:
    """What a heuristic may look at: time, resources in flight, memory, the ready set."""

    current_time: float = 0.0
    in_flight: dict[str, int] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    ready_dones: dict[str, int] = field(default_factory=dict)  # ready dones waiting, per kind
    memory: int = 0
    memory_limit: int = 0  # 0 = none
    live: set[Node] = field(default_factory=set)

    def limit(self, kind: str) -> int:
        """Overlap limit of a resource kind."""
        return self.limits.get(kind, self.limits.get("default", 1))

    def stall(self, node: Node) -> float:
        """How long the compute stream would idle before `node` can run."""
        return max(node.ready_time - self.current_time, 0.0)

    def resource_constrained(self, node: Node) -> bool:
        """A start whose resource is full while dones of its kind wait: scheduling it frees a slot."""
        kind = node.kind
        return (node.is_start and kind is not None and self.in_flight.get(kind, 0) >= self.limit(kind)
                and self.ready_dones.get(kind, 0) > 0)

    def memory_delta(self, node: Node) -> int:
        """Change of live bytes if `node` is scheduled now (bottom-up: its result dies, operands become live)."""
        delta = -node.bytes if node in self.live else 0
        seen = set()
        for pred, _ in node.preds:
            if pred not in self.live and pred not in seen:
                seen.add(pred)
                delta += pred.bytes
        return delta

    def under_pressure(self) -> bool:
        """XLA's rule: memory counts once usage is over half the limit."""
        return bool(self.memory_limit) and self.memory > self.memory_limit // 2

    @staticmethod
    def unlocks(node: Node) -> int:
        """How many operands become ready if `node` is scheduled (kept up to date by the scheduler)."""
        return node.unlocks


class Heuristic:
    """Ranks ready nodes: larger `priority` is scheduled first (bottom-up)."""

    name: ClassVar[str] = ""

    def priority(self, node: Node, state: SchedState) -> tuple:
        """The node's rank; compared lexicographically."""
        raise NotImplementedError


HEURISTICS: dict[str, type[Heuristic]] = {}


def register_heuristic(cls: type[Heuristic]) -> type[Heuristic]:
    """Class decorator: make a heuristic available by name."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    HEURISTICS[cls.name] = cls
    return cls


def get_heuristic(name: str) -> Heuristic:
    """An instance of the heuristic of this name."""
    if name not in HEURISTICS:
        raise ValueError(f"unknown scheduling heuristic {name!r} (known: {', '.join(sorted(HEURISTICS))})")
    return HEURISTICS[name]()


def _memory_rule(node: Node, state: SchedState) -> int:
    return -state.memory_delta(node) if state.under_pressure() else 0


def _start_at_zero_depth(node: Node, state: SchedState) -> bool:
    """XLA's kStartAtZeroDepth (its GPU scheduler's aggressive policies): an async start with no async op
    above it (`Node.async_depth_from_top` 0) and a free slot is delayed as long as possible, bottom-up: it
    moves to the top of its computation (to the start of a loop body), whatever the latency estimate."""
    return node.is_start and node.async_depth_from_top == 0.0 and not state.resource_constrained(node)


@register_heuristic
class XlaDefault(Heuristic):
    """XLA's ReadySetLt order as XLA:GPU configures it (aggressive policies): memory pressure, schedule done
    early, less stall, start at zero depth (`_start_at_zero_depth`), free backed-up resources, async depth,
    unlock done, creates more ready nodes, decrease memory, original order."""

    name: ClassVar[str] = "xla-default"

    def priority(self, node: Node, state: SchedState) -> tuple:
        stall = node.ready_time - state.current_time
        if not state.memory_limit:
            return (0, node.is_done, -stall if stall > 0 else 0.0, not _start_at_zero_depth(node, state),
                    node.is_start and state.resource_constrained(node),
                    node.async_depth, node.has_done_operand, node.unlocks, False, node.index)
        return (
            _memory_rule(node, state),
            node.is_done,
            -state.stall(node),
            not _start_at_zero_depth(node, state),
            state.resource_constrained(node),
            node.async_depth,
            node.has_done_operand,
            node.unlocks,
            state.memory_delta(node) < 0,
            node.index,
        )


@register_heuristic
class StartDelay(Heuristic):
    """XLA's rule for overlap limits > 1: prefer compute over an unconstrained async start, so each
    start moves as early as possible in program order and overlap windows grow."""

    name: ClassVar[str] = "start-delay"

    def priority(self, node: Node, state: SchedState) -> tuple:
        delay_start = node.is_start and not state.resource_constrained(node)
        return (
            _memory_rule(node, state),
            node.is_done,
            not delay_start,
            -state.stall(node),
            state.resource_constrained(node),
            node.async_depth,
            node.has_done_operand,
            state.unlocks(node),
            node.index,
        )


@register_heuristic
class MemoryFirst(Heuristic):
    """Minimize live memory first, then XLA's order."""

    name: ClassVar[str] = "memory-first"

    def priority(self, node: Node, state: SchedState) -> tuple:
        return (-state.memory_delta(node),) + XlaDefault().priority(node, state)


@register_heuristic
class CriticalPath(Heuristic):
    """Classic list scheduling: the node furthest from the sources (longest path to it) goes last."""

    name: ClassVar[str] = "critical-path"

    def priority(self, node: Node, state: SchedState) -> tuple:
        return (node.is_done, -state.stall(node), node.depth + node.cost, node.index)


@register_heuristic
class OriginalOrder(Heuristic):
    """Keep the input order (the baseline)."""

    name: ClassVar[str] = "original-order"
    respects_limits: ClassVar[bool] = False

    def priority(self, node: Node, state: SchedState) -> tuple:
        return (node.index,)


Factory = Callable[[], Heuristic]
