"""The scheduling graph of one computation: nodes with costs, edges with latencies, async pairs."""

from __future__ import annotations

from dataclasses import dataclass, field

from hlopt.hlo.ir import Computation, Instruction
from hlopt.scheduler.async_ops import (
    async_kind,
    done_of,
    is_async_done,
    is_async_start,
    is_sync_collective,
    sync_start_holds_slot,
)
from hlopt.scheduler.costs import LatencyEstimator, is_overlapped_done, is_overlapped_start

__all__ = ["Node", "ScheduleGraph", "buffer_bytes", "loop_carried_edges"]

_NO_BUFFER = frozenset({"get-tuple-element", "tuple", "bitcast", "parameter", "constant", "after-all",
                        "opt-barrier", "add-dependency"})


def buffer_bytes(inst: Instruction) -> int:
    """Bytes the instruction's result allocates (0 for aliases such as tuple/get-tuple-element/bitcast)."""
    if inst.opcode in _NO_BUFFER or inst.shape is None:
        return 0
    return max(inst.shape.byte_size, 0)


@dataclass(eq=False, slots=True)
class Node:
    """One instruction in the graph."""

    inst: Instruction
    index: int  # original position
    cost: float
    preds: list[tuple[Node, float]] = field(default_factory=list)  # (operand node, edge latency)
    succs: list[tuple[Node, float]] = field(default_factory=list)
    kind: str | None = None  # resource kind for async start/done (and a sync-marked start)
    is_start: bool = False
    is_done: bool = False
    async_depth: float = 0.0  # longest latency-weighted path to a sink through async edges (bottom-up)
    #: XLA's async depth (HloScheduleGraph::InitializeGraphAnalysis): the longest path from a source to the
    #: node counting only start -> done latencies; 0 for a start with no async op above it.
    async_depth_from_top: float = 0.0
    depth: float = 0.0  # longest cost path from any source (for critical-path priority)
    height: float = 0.0  # longest cost path to any sink
    bytes: int = 0
    unscheduled_succs: int = 0
    ready_time: float = 0.0
    has_done_operand: bool = False
    unlocks: int = 0  # operands that become ready if this node is scheduled (maintained by the scheduler)
    scheduled: bool = False


def _strip_bitcasts(inst: Instruction) -> Instruction:
    while inst.opcode in ("bitcast", "copy") and inst.operand_count == 1:
        inst = inst.operand(0)
    return inst


def _readers_of(values: list[Instruction]) -> list[Instruction]:
    """Instructions reading any of `values` or their aliases (bitcast/get-tuple-element chains)."""
    readers: list[Instruction] = []
    work = list(values)
    seen = set(work)
    while work:
        v = work.pop()
        for user in v.users:
            if user in seen:
                continue
            seen.add(user)
            if user.opcode in ("bitcast", "get-tuple-element"):
                work.append(user)
            readers.append(user)
    return readers


def loop_carried_edges(comp: Computation) -> list[tuple[Instruction, Instruction]]:
    """(reader, async start) pairs a schedule must keep in that order beyond operands and control
    dependencies: in a while body, an async op whose result becomes loop-carried slot i writes the buffer
    that slot i's parameter value lives in, so its start must follow every reader of that value."""
    module = comp.module
    root = comp.root
    if module is None or root is None or root.opcode != "tuple" or len(comp.parameters) != 1:
        return []
    if not any(i.opcode == "while" and i.get("body") is comp for i in module.instructions()):
        return []
    slot_values: dict[int, list[Instruction]] = {}
    for user in comp.parameters[0].users:
        if user.opcode == "get-tuple-element":
            slot_values.setdefault(user.attrs["index"], []).append(user)
    edges: list[tuple[Instruction, Instruction]] = []
    for i, value in enumerate(root.operands):
        done = _strip_bitcasts(value)
        if not is_overlapped_done(done):
            continue
        start = next((op for op in done.operands if is_overlapped_start(op)), None)
        if start is None:
            continue
        edges.extend((reader, start) for reader in _readers_of(slot_values.get(i, []))
                     if reader is not start and reader is not done)
    return edges


def _node(index: int, inst: Instruction, estimator: LatencyEstimator) -> Node:
    """The node of `inst`, classified with as few async tests as possible: what `stream_cost`,
    `is_overlapped_start` / `is_overlapped_done` and `async_kind` give."""
    start = is_async_start(inst)
    done = not start and is_async_done(inst)
    sync = (start or done) and is_sync_collective(inst)
    if start:
        if sync:  # blocks the compute stream for its collective (`stream_cost`)
            end = done_of(inst)
            cost = float(estimator.latency(inst, end)) if end is not None else 0.0
        else:
            cost = 0.0
    elif done:
        cost = 0.0
    else:
        cost = float(estimator.node_cost(inst))
    node = Node(inst, index, cost, bytes=buffer_bytes(inst))
    node.is_start = start and not sync  # a sync-marked pair is two ordinary nodes, as in XLA
    node.is_done = done and not sync
    if node.is_start or node.is_done or (start and sync_start_holds_slot()):
        node.kind = async_kind(inst)  # per type, a sync-marked start still holds a slot of its kind
    return node


def _deps(inst: Instruction) -> tuple[Instruction, ...] | list[Instruction]:
    """Operands then control predecessors, each once."""
    deps = inst.operands
    controls = inst.control_predecessors
    if controls:
        deps += controls
    elif len(deps) < 2 or (len(deps) == 2 and deps[0] is not deps[1]):
        return deps
    return list(dict.fromkeys(deps))


def _async_depth_from_top(node: Node) -> float:
    """XLA's async depth of `node` from its operands' (theirs already set): the largest over them, plus
    the start -> done latency into an async done."""
    depth = 0.0
    for p, lat in node.preds:
        v = p.async_depth_from_top + (lat if node.is_done else 0.0)
        if v > depth:
            depth = v
    return depth


class ScheduleGraph:
    """Nodes for every instruction of a computation, edges for operands and control dependencies."""

    def __init__(self, comp: Computation, estimator: LatencyEstimator):
        self.comp = comp
        self.estimator = estimator  # whose costs and latencies the nodes and edges carry
        self.nodes: list[Node] = [_node(i, inst, estimator) for i, inst in enumerate(comp.instructions)]
        by_inst: dict[Instruction, Node] = {node.inst: node for node in self.nodes}
        self.by_inst = by_inst
        for node in self.nodes:
            for dep in _deps(node.inst):
                pred = by_inst.get(dep)
                if pred is None:
                    continue
                latency = estimator.latency(dep, node.inst) if (pred.is_start and node.is_done) else 0.0
                node.preds.append((pred, latency))
                pred.succs.append((node, latency))
                if pred.is_done:
                    node.has_done_operand = True
        self._add_loop_carried_edges()
        self._compute_depths()

    def _add_edge(self, pred: Node, succ: Node) -> None:
        if pred is succ or any(p is pred for p, _ in succ.preds):
            return
        succ.preds.append((pred, 0.0))
        pred.succs.append((succ, 0.0))

    def _add_loop_carried_edges(self) -> None:
        """The `loop_carried_edges` of the computation, as graph edges."""
        for reader, start in loop_carried_edges(self.comp):
            pred, succ = self.by_inst.get(reader), self.by_inst.get(start)
            if pred is not None and succ is not None:
                self._add_edge(pred, succ)

    def _topological(self) -> list[Node]:
        indeg = {n: len(n.preds) for n in self.nodes}
        order = [n for n in self.nodes if indeg[n] == 0]
        i = 0
        while i < len(order):
            for s, _ in order[i].succs:
                indeg[s] -= 1
                if indeg[s] == 0:
                    order.append(s)
            i += 1
        if len(order) != len(self.nodes):
            raise ValueError(f"computation {self.comp.name} has a dependency cycle")
        return order

    def _index_order_is_topological(self) -> bool:
        """True if every edge goes from a lower to a higher index (the computation's order is a
        topological order, as it is without control or loop-carried edges against it)."""
        return all(p.index < n.index for n in self.nodes for p, _ in n.preds)

    def _compute_depths(self) -> None:
        """`depth`, `height` and `async_depth` of every node (each a `max` over its edges, written out as
        loops: the same values, without a generator per node), along `topological`: a topological order
        of the nodes (theirs if it is one, else Kahn's)."""
        order = list(self.nodes) if self._index_order_is_topological() else self._topological()
        self.topological = order
        for n in order:
            depth = 0.0
            first = True
            for p, lat in n.preds:
                v = p.depth + p.cost + lat
                if first or v > depth:  # max(...): the first of the largest
                    depth, first = v, False
            n.depth = depth
            n.async_depth_from_top = _async_depth_from_top(n)
        for n in reversed(order):
            height = async_depth = 0.0
            first = True
            for s, lat in n.succs:
                h, a = s.height + lat, s.async_depth + lat
                if first or h > height:
                    height = h
                if first or a > async_depth:
                    async_depth = a
                first = False
            n.height = n.cost + height
            n.async_depth = async_depth

    def critical_path(self) -> float:
        """Longest cost+latency path through the graph."""
        return max((n.height for n in self.nodes), default=0.0)

    def total_compute(self) -> float:
        """Sum of node costs (the compute stream's busy time)."""
        return sum(n.cost for n in self.nodes)
