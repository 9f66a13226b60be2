"""Replication analysis: which devices hold equal values, per instruction (XLA's HloReplicationAnalysis,
xla/hlo/analysis/hlo_replication_analysis.cc, with partial replication).

One analysis covers one axis: the replicas (`axis="replica"`, XLA's cross-replica analysis) or the SPMD
partitions (`axis="partition"`, `cross_partition_spmd=true`). Each value gets, per device of the axis, a
label; devices with equal labels hold equal values. The labels come from a fixed point over the whole module
(callers before callees, while loops iterated until the carried labels stop changing):

- entry parameters differ per device (a partition-axis parameter with sharding `{replicated}` is equal);
- constants and iota are equal everywhere; `replica-id` / `partition-id` differ along their own axis;
- all-reduce / all-gather make the members of each replica group equal (by group mode, as XLA);
- side-effecting ops, rng, reduce-scatter, all-to-all, collective-permute differ per device;
- every other op is as replicated as the meet of its operands; small integer functions of constants and
  the device id (e.g. an offset read from a table by partition-id) are evaluated per device, so that
  `dynamic-slice(table, partition-id)` is known to be equal on the devices that read the same entry.

    analysis = ReplicationAnalysis(module, "partition", device_config(module))
    analysis.is_replicated(inst)                          # equal on every partition
    analysis.replicated_within(inst, [[0, 1], [2, 3]])    # equal within each group

`CollectiveReplication(module).within_groups(value, collective)` answers XLA's
IsValueReplicatedWithinEachAllReduceGroup for a collective's replica groups and group mode.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import DTYPES

__all__ = [
    "DeviceConfig", "device_config", "ReplicationAnalysis", "CollectiveReplication", "replica_groups",
    "collective_group_mode", "MAX_ROUNDS",
]

MAX_ROUNDS = 1000  # fixed-point rounds; past them the analysis is not converged and answers "not replicated"


def replica_groups(inst: Instruction) -> list[list[int]] | None:
    """The replica groups of a collective as lists of ids; None for `{}` / absent (all devices, one group)."""
    rg = inst.get("replica_groups")
    if rg is None or getattr(rg, "is_empty", False):
        return None
    groups = rg.groups()
    return groups or None


def collective_group_mode(inst: Instruction) -> str:
    """XLA's CollectiveOpGroupMode of an all-reduce-like collective: "cross_replica" (no channel id),
    "cross_replica_and_partition" (a channel id), "flattened" (a channel id and use_global_device_ids)."""
    if not isinstance(inst.get("channel_id"), int):
        return "cross_replica"
    return "flattened" if inst.get("use_global_device_ids") is True else "cross_replica_and_partition"


@dataclass(frozen=True)
class DeviceConfig:
    """Replicas and partitions the module runs on, and whether partitions are SPMD."""

    replicas: int
    partitions: int
    spmd: bool


def _as_bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1")


def device_config(module: Module) -> DeviceConfig:
    """Device counts from the header; jax's unoptimised dumps print none, so the partition count then comes
    from the Shardy mesh or the GSPMD shardings (as runtime.execution_mode reads them)."""
    replicas = int(module.config.get("replica_count", 1))
    partitions = int(module.config.get("num_partitions", 1))
    if replicas * partitions == 1:
        fa = module.config.get("frontend_attributes") or {}
        text = str(fa.get("xla.sdy.meshes", "")) if isinstance(fa, dict) else ""
        for mesh in re.findall(r"#sdy\.mesh<\[([^\]]*)\]", text):
            partitions = max(partitions, math.prod(int(s) for s in re.findall(r"=\s*(\d+)", mesh)))
        for inst in module.instructions():
            sharding = str(inst.attrs.get("sharding", ""))
            for dims in re.findall(r"devices=\[([\d,]+)\]", sharding):
                partitions = max(partitions, math.prod(int(d) for d in dims.split(",")))
    spmd = _as_bool(module.config.get("use_spmd_partitioning"), True)
    return DeviceConfig(max(replicas, 1), max(partitions, 1), spmd)


Labels = tuple  # per device: equal labels <=> equal values


@dataclass(frozen=True)
class _TupleValue:
    elements: tuple


def _canonical(labels: Iterable[Any]) -> Labels:
    seen: dict[Any, int] = {}
    return tuple(seen.setdefault(x, len(seen)) for x in labels)


def _flat(value: Any) -> Labels | None:
    if isinstance(value, _TupleValue):
        out = None
        for e in value.elements:
            out = _meet(out, _flat(e))
        return out
    return value


def _meet(a: Any, b: Any) -> Any:
    """Greatest common refinement; None is "no information yet" (top)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, _TupleValue) and isinstance(b, _TupleValue) and len(a.elements) == len(b.elements):
        return _TupleValue(tuple(_meet(x, y) for x, y in zip(a.elements, b.elements, strict=True)))
    fa, fb = _flat(a), _flat(b)
    if fa is None or fb is None:
        return fa if fb is None else fb
    return fa if fa == fb else _canonical(zip(fa, fb, strict=True))


def _ds(inst: Instruction, a: list[np.ndarray]) -> np.ndarray:
    sizes = inst.attrs["dynamic_slice_sizes"]
    x = a[0]
    starts = [min(max(int(i), 0), x.shape[k] - sizes[k]) for k, i in enumerate(a[1:])]
    return x[tuple(slice(s, s + n) for s, n in zip(starts, sizes, strict=True))]


def _bcast(inst: Instruction, a: list[np.ndarray]) -> np.ndarray:
    dims = inst.shape.dims
    shp = [1] * len(dims)
    for i, d in enumerate(inst.attrs.get("dimensions", ())):
        shp[d] = a[0].shape[i]
    return np.broadcast_to(a[0].reshape(shp), dims)


_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
            "GE": np.greater_equal}

#: Opcodes evaluated per device (on small values of constants and device ids).
_EVALUATED: dict[str, Any] = {
    "reshape": lambda i, a: a[0].reshape(i.shape.dims),
    "convert": lambda i, a: a[0],
    "broadcast": _bcast,
    "dynamic-slice": _ds,
    "slice": lambda i, a: a[0][tuple(slice(s, e, st) for s, e, st in i.attrs["slice"])],
    "add": lambda i, a: a[0] + a[1],
    "subtract": lambda i, a: a[0] - a[1],
    "multiply": lambda i, a: a[0] * a[1],
    "maximum": lambda i, a: np.maximum(a[0], a[1]),
    "minimum": lambda i, a: np.minimum(a[0], a[1]),
    "compare": lambda i, a: _COMPARE[str(i.attrs["direction"])](a[0], a[1]),
    "select": lambda i, a: np.where(a[0], a[1], a[2]),
    "and": lambda i, a: a[0] & a[1],
    "or": lambda i, a: a[0] | a[1],
    "not": lambda i, a: np.logical_not(a[0]) if a[0].dtype == np.bool_ else np.invert(a[0]),
}


class ReplicationAnalysis:
    """Which devices of one axis (replicas or partitions) hold equal values, per instruction
    (XLA's HloReplicationAnalysis with partial replication, as a fixed point over the whole module).

    `axis` is "replica" or "partition"; `devices` defaults to `device_config(module)`. The analysis runs in
    the constructor; `converged` is False when it did not reach a fixed point in MAX_ROUNDS rounds (then
    every query answers "not replicated").
    """

    def __init__(self, module: Module, axis: str, devices: DeviceConfig | None = None):
        if axis not in ("replica", "partition"):
            raise ValueError(f"replication axis must be 'replica' or 'partition', not {axis!r}")
        devices = devices if devices is not None else device_config(module)
        self.module = module
        self.axis = axis
        self.cfg = devices
        self.n = devices.replicas if axis == "replica" else devices.partitions
        self.values: dict[Instruction, Any] = {}
        self._consts: dict[Instruction, list[np.ndarray] | None] = {}
        self._param_in: dict[Instruction, Any] = {}
        self._run()

    # ---------------------------------------------------------------- lattice
    def _top(self) -> Labels:
        return (0,) * self.n

    def _bottom(self) -> Labels:
        return tuple(range(self.n))

    def _of_shape(self, shape: Any, labels: Labels) -> Any:
        if shape.is_tuple:
            return _TupleValue(tuple(self._of_shape(s, labels) for s in shape.elements))
        return labels

    def _group_labels(self, groups: list[list[int]] | None, size: int) -> dict[int, Any]:
        if groups is None:
            return dict.fromkeys(range(size), 0)
        return {d: gi for gi, g in enumerate(groups) for d in g}

    # ---------------------------------------------------------------- transfer
    def _collective(self, inst: Instruction) -> Any:
        mode = collective_group_mode(inst)
        groups = replica_groups(inst)
        reps, parts = self.cfg.replicas, self.cfg.partitions
        operand = None
        for op in inst.operands:
            operand = _meet(operand, _flat(self.values.get(op)))
        if self.axis == "replica":
            if mode in ("cross_replica", "cross_replica_and_partition"):
                g = self._group_labels(groups, reps)
                labels = _canonical(g.get(r, ("x", r)) for r in range(reps))
            else:
                g = self._group_labels(groups, reps * parts)
                labels = _canonical(tuple(g.get(r * parts + p, ("x", r, p)) for p in range(parts))
                                    for r in range(reps))
        elif mode == "cross_replica":
            labels = operand if operand is not None else self._top()
        elif mode == "cross_replica_and_partition":
            labels = self._top()
        else:
            g = self._group_labels(groups, reps * parts)
            labels = _canonical(tuple(g.get(r * parts + p, ("x", r, p)) for r in range(reps))
                                for p in range(parts))
        return self._of_shape(inst.shape, labels)

    def _entry_parameter(self, inst: Instruction) -> Any:
        replicated = self.axis == "partition" and str(inst.attrs.get("sharding", "")).strip() == "{replicated}"
        return self._of_shape(inst.shape, self._top() if replicated else self._bottom())

    # ---------------------------------------------------------------- per-device values
    def _device_values(self, inst: Instruction) -> list[np.ndarray] | None:
        """The value of `inst` on each device of the axis when it is a small function of constants and this
        axis' id (e.g. an offset read from a table by partition-id), else None."""
        if inst in self._consts:
            return self._consts[inst]
        self._consts[inst] = None
        try:
            out = self._evaluate(inst)
        except Exception:  # noqa: BLE001  (anything unusual is simply not evaluated)
            out = None
        self._consts[inst] = out
        return out

    def _evaluate(self, inst: Instruction) -> list[np.ndarray] | None:  # noqa: C901
        shape = inst.shape
        if shape.is_tuple or shape.numel > 1024 or DTYPES[shape.dtype].numpy is None:
            return None
        op = inst.opcode
        own_id = "replica-id" if self.axis == "replica" else "partition-id"
        if op == own_id:
            return [np.asarray(d, np.uint32) for d in range(self.n)]
        if op == "constant":
            return [np.asarray(inst.attrs["literal"].to_numpy())] * self.n
        if op not in _EVALUATED:
            return None
        args = [self._device_values(o) for o in inst.operands]
        if any(a is None for a in args):
            return None
        return [np.asarray(_EVALUATED[op](inst, [a[d] for a in args])).astype(DTYPES[shape.dtype].numpy)
                .reshape(shape.dims) for d in range(self.n)]

    def _transfer(self, inst: Instruction) -> Any:  # noqa: C901  (one case per opcode family)
        op = inst.opcode
        v = self.values.get
        if op in _EVALUATED:
            values = self._device_values(inst)
            if values is not None:
                return _canonical(x.tobytes() for x in values)
        if op == "parameter":
            if inst.parent is self.module.entry:
                return self._entry_parameter(inst)
            return self._param_in.get(inst)
        if op in ("constant", "iota"):
            return self._of_shape(inst.shape, self._top())
        if op == "replica-id":
            return self._bottom() if self.axis == "replica" else self._top()
        if op == "partition-id":
            return self._bottom() if self.axis == "partition" else self._top()
        if op == "get-tuple-element":
            src = v(inst.operand(0))
            if isinstance(src, _TupleValue):
                return src.elements[inst.attrs["index"]]
            return src
        if op == "tuple":
            return _TupleValue(tuple(v(o) for o in inst.operands))
        if op == "while":
            return self._while(inst)
        if op == "call":
            return self._call(inst)
        if op == "conditional":
            return self._conditional(inst)
        if op in ("all-reduce", "all-gather"):
            return self._collective(inst)
        if inst.has_side_effect_no_recurse or op in ("rng", "infeed", "recv", "recv-done", "reduce-scatter", "all-to-all",
                                          "collective-permute", "ragged-all-to-all", "collective-broadcast"):
            return self._of_shape(inst.shape, self._bottom())
        out = None
        for o in inst.operands:
            out = _meet(out, _flat(v(o)))
        if out is None and inst.operands:
            return None
        return self._of_shape(inst.shape, out if out is not None else self._top())

    def _feed(self, comp: Computation, values: list[Any]) -> None:
        for i, p in enumerate(comp.parameters):
            if i < len(values) and values[i] is not None:
                self._param_in[p] = _meet(self._param_in.get(p), values[i])

    def _while(self, inst: Instruction) -> Any:
        body, cond = inst.attrs["body"], inst.attrs["condition"]
        state = _meet(self.values.get(inst.operand(0)), self.values.get(body.root))
        self._feed(body, [state])
        self._feed(cond, [state])
        return state

    def _call(self, inst: Instruction) -> Any:
        callee = inst.attrs["to_apply"]
        self._feed(callee, [self.values.get(o) for o in inst.operands])
        return self.values.get(callee.root)

    def _conditional(self, inst: Instruction) -> Any:
        branches = inst.attrs.get("branch_computations") or [inst.attrs.get("true_computation"),
                                                              inst.attrs.get("false_computation")]
        out = None
        for i, br in enumerate(branches):
            if br is None:
                continue
            self._feed(br, [self.values.get(inst.operand(i + 1))] if i + 1 < inst.operand_count else [])
            out = _meet(out, self.values.get(br.root))
        pred = _flat(self.values.get(inst.operand(0)))
        if out is None:
            return None
        return _meet(out, self._of_shape(inst.shape, pred)) if pred is not None else out

    def _run(self) -> None:
        order = list(reversed(self.module.computations_post_order()))  # callers first
        instructions = [(c, c.post_order()) for c in order]
        self.converged = False
        for _ in range(MAX_ROUNDS):
            changed = False
            for _comp, insts in instructions:
                for inst in insts:
                    new = self._transfer(inst)
                    if new != self.values.get(inst):
                        self.values[inst] = new
                        changed = True
            if not changed:
                self.converged = True
                return

    # ---------------------------------------------------------------- queries
    def replicated_within(self, inst: Instruction, groups: list[list[int]] | None) -> bool:
        """Whether `inst` has one value on the devices of each group (all devices when groups is None)."""
        if not self.converged or inst not in self.values:
            return False
        labels = _flat(self.values[inst])
        if labels is None:  # not reached through a caller the analysis follows: unknown
            return False
        if groups is None:
            return len(set(labels)) <= 1
        for g in groups:
            if any(d < 0 or d >= self.n for d in g):
                return False
            if len({labels[d] for d in g}) > 1:
                return False
        return True

    def is_replicated(self, inst: Instruction) -> bool:
        """Whether `inst` has one value on every device of the axis (XLA's HloInstructionIsReplicatedAt)."""
        return self.replicated_within(inst, None)


class CollectiveReplication:
    """XLA's IsValueReplicatedWithinEachAllReduceGroup: the replica and partition analyses of a module (each run
    on first use, only where the module has more than one device on that axis)."""

    def __init__(self, module: Module, devices: DeviceConfig | None = None):
        self.module = module
        self.devices = devices if devices is not None else device_config(module)
        self._replica: ReplicationAnalysis | None = None
        self._partition: ReplicationAnalysis | None = None
        self._ran = False

    def analyses(self) -> tuple[ReplicationAnalysis | None, ReplicationAnalysis | None]:
        """(replica analysis, partition analysis), run on first use; None where an axis has one device or,
        for partitions, the module is not SPMD (then every value counts as replicated on that axis)."""
        if not self._ran:
            self._ran = True
            d = self.devices
            if d.replicas > 1:
                self._replica = ReplicationAnalysis(self.module, "replica", d)
            if d.spmd and d.partitions > 1:
                self._partition = ReplicationAnalysis(self.module, "partition", d)
        return self._replica, self._partition

    def within_groups(self, inst: Instruction, ar: Instruction) -> bool:
        """Whether `inst` is equal on the members of each replica group of collective `ar`."""
        ra, pa = self.analyses()
        groups = replica_groups(ar)
        mode = collective_group_mode(ar)

        def rep(g: list[list[int]] | None) -> bool:
            return ra is None or ra.replicated_within(inst, g)

        def par(g: list[list[int]] | None) -> bool:
            return pa is None or pa.replicated_within(inst, g)

        if mode == "cross_replica":
            return rep(groups)
        if mode == "cross_replica_and_partition":
            return rep(groups) and par(None)
        if self.devices.replicas == 1:
            return par(groups)
        if self.devices.partitions == 1:
            return rep(groups)
        return rep(None) and par(None)
