"""The never-slower check of the fusion passes: a fusion is built on copies, away from the module, and timed
by the cost model (`cost_model`, what `hlopt cost` reports) against the kernels it replaces; one whose modeled
time after exceeds the parts before is not made (XLA's fusion passes ask GpuPerformanceModel the same).

    verdict = FusionTrial(run).producer_into_consumers(producer, consumers, plans)
    verdict.before_us, verdict.after_us, verdict.launches_saved, verdict.slower

The fusion passes decide with their own quick adapter (`fusion_cost.FusionCostModel`, which costs a pair
without building it); this check times the kernel that would be built, with the model the rest of hlopt uses
(launch dimensions per emitter, coalescing, re-reads, multi-output reductions), so that a fusion the adapter
misjudges is still caught. The copies live in a scratch module: the parts' operands become parameters
(small constants stay constants), fused computations are copied, and the same builders the passes use
(`fusion_building`) make the fusion there.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import TupleShape
from hlopt.hlo.structure import StructureKeys, shared_keys
from hlopt.passes.fusion.fusion_building import (
    fuse_into_multi_output,
    fuse_into_new_fusion,
    fuse_producer,
    fuse_user_as_output,
    merge_into_multi_output,
    wrap_in_fusion,
)
from hlopt.passes.fusion.fusion_run import FusionRun

__all__ = ["TrialVerdict", "FusionTrial", "TOLERANCE_US", "fusion_audit_lines"]

#: Numbers standing for verdict keys (`FusionTrial.built`), never reused: a number names one key of one trial.
_KEY_NUMBERS = itertools.count()

#: Modeled times closer than this count as equal (rounding in the model's sums).
TOLERANCE_US = 1e-6


@dataclass(frozen=True, slots=True)
class TrialVerdict:
    """What a fusion was judged on: the modeled time of the parts before and of the kernels after (us, launch
    overheads included) and the launches it saves."""

    before_us: float
    after_us: float
    launches_saved: int

    @property
    def slower(self) -> bool:
        """Would the fusion be slower than the kernels it replaces?"""
        return self.after_us > self.before_us + TOLERANCE_US

    def describe(self) -> str:
        """`before -> after us, N launch(es) saved`, for the explanation of a decision."""
        return (f"modeled {self.before_us:.3f} -> {self.after_us:.3f} us, {self.launches_saved} launch(es) saved")


class _Scratch:
    """A scratch module holding copies of some instructions of a computation."""

    def __init__(self) -> None:
        self.module = Module("fusion_trial")
        self.comp = Computation("trial")
        self.module.add_computation(self.comp, entry=True)
        self.copies: dict[Instruction, Instruction] = {}
        self.run = FusionRun(self.module)

    def value(self, op: Instruction) -> Instruction:
        """The scratch stand-in of `op`: its copy, a small constant's clone, or a parameter of its shape."""
        got = self.copies.get(op)
        if got is None:
            if _stays_constant(op):
                got = op.clone(name=self.module.unique_name(op.name), operands=())
            else:
                n = len(self.comp.parameters)
                got = Instruction("parameter", op.shape, (), name=self.module.unique_name("p"), parameter_number=n)
            self.comp.add(got)
            self.copies[op] = got
        return got

    def copy(self, inst: Instruction) -> Instruction:
        """A copy of `inst` (a fusion with a private copy of its fused computation) reading stand-ins."""
        ops = [self.value(o) for o in inst.operands]
        clone = inst.clone(name=self.module.unique_name(inst.name), operands=ops)
        if inst.opcode == "fusion":
            clone.attrs["calls"] = self._copy_computation(inst.attrs["calls"], keys_of(inst))
        self.comp.add(clone)
        self.copies[inst] = clone
        return clone

    def _copy_computation(self, comp: Computation, keys: StructureKeys) -> Computation:
        copy = Computation(self.module.unique_name(comp.name))
        mapping: dict[Instruction, Instruction] = {}
        for inst in comp.post_order():
            mapping[inst] = copy.add(inst.clone(name=inst.name, operands=[mapping[o] for o in inst.operands]))
        copy.set_root(mapping[comp.root])
        self.module.add_computation(copy, before=self.comp)
        # the same structure: the kernel model's memo answers for the copy as for the original
        shared_keys(self.module).copied(copy, keys.of_computation(comp))
        return copy

    def keep(self, *insts: Instruction) -> None:
        """Give the copies a user outside the parts (a tuple root), as their values are used; a multi-output copy
        is read through get-tuple-elements, as the fusion builders expect."""
        values = []
        for inst in insts:
            if not inst.shape.is_tuple:
                values.append(inst)
                continue
            for k, elem in enumerate(inst.shape.elements):
                gte = Instruction("get-tuple-element", elem, [inst], name=self.module.unique_name("gte"), index=k)
                values.append(self.comp.add(gte))
        root = Instruction("tuple", TupleShape(tuple(v.shape for v in values)), values,
                           name=self.module.unique_name("tuple"))
        self.comp.add(root)
        self.comp.set_root(root)


def parts_key(keys: StructureKeys, parts: Sequence[Instruction]) -> tuple:
    """The key of a group of instructions for the verdict cache: each one's structural key (`hlo.structure`)
    and where its operands come from (another part, or the n-th distinct outside value, a small constant with
    its value)."""
    index = {inst: i for i, inst in enumerate(parts)}
    outside: dict[Instruction, int] = {}
    out = []
    for inst in parts:
        sources = tuple(("p", index[o]) if o in index else ("v", outside.setdefault(o, len(outside)),
                                                             _stays_constant(o) and o.attrs["literal"].text)
                        for o in inst.operands)
        out.append((keys.of(inst), sources))
    return tuple(out)


def keys_of(inst: Instruction) -> StructureKeys:
    """The structural keys of `inst`'s module (`hlo.structure.shared_keys`)."""
    parent = inst.parent
    return shared_keys(parent.module if parent is not None else None)


def _stays_constant(op: Instruction) -> bool:
    """Whether a trial copies `op` as a constant (a small one) rather than a parameter (`_Scratch.value`)."""
    return op.opcode == "constant" and not op.shape.is_tuple and op.shape.numel <= 1


def _fuse_copies(s: _Scratch, p: Instruction, c: Instruction,
                 plan: tuple[dict[str, Any], list[int]] | None) -> Instruction:
    """priority-fusion's move on scratch copies: `p` fused into `c` (a fusion, or wrapped in a new one), a
    block-level Triton fusion with `plan`'s backend config if given; the fusion."""
    if c.opcode == "fusion":
        fuse_producer(c, p, last_use=False, constants=True, run=s.run)
        fusion = c
    else:
        fusion = fuse_into_new_fusion(p, c, False, True, run=s.run)
    if plan is not None:
        fusion.attrs["kind"] = "kCustom"
        fusion.set_backend_config_json(plan[0])
    return fusion


class FusionTrial:
    """Builds fusions on copies and times them with the run's device model (see the module docstring).
    Verdicts are remembered by the structure of the parts (`parts_key`): a candidate that repeats one
    already tried (the next layer's) is answered without building it again."""

    def __init__(self, device: str = "h100"):
        from hlopt.cost_model import get_cost_model

        self.device = device
        self._get = get_cost_model
        #: the parts' key -> (the verdict, a number standing for the key, unique in the process)
        self._verdicts: dict[tuple, tuple[TrialVerdict, int]] = {}
        self._last: int | None = None  # the number of the last verdict's key (None: it had none)
        #: a producer-consumer pair's key -> its times and launches (`_pair`)
        self._pairs: dict[tuple, tuple[float, float, float, int, int]] = {}

    @property
    def cached_verdicts(self) -> int:
        """How many distinct candidates this trial has built (the rest were answered from its cache)."""
        return len(self._verdicts)

    def _cached(self, move: str, parts: Sequence[Instruction], extra: Any, build) -> TrialVerdict:
        """The verdict of `move` on `parts` from the cache, else `build()` (and remember it)."""
        self._last = None
        try:
            key = (move, parts_key(keys_of(parts[0]), parts), extra)
            hit = self._verdicts.get(key)
        except TypeError:  # an attribute value that is not hashable even as its parts
            return build()
        if hit is None:
            hit = self._verdicts[key] = (build(), next(_KEY_NUMBERS))
        self._last = hit[1]
        return hit[0]

    @property
    def last_number(self) -> int | None:
        """The number standing for the key of the last verdict given (None: it had none)."""
        return self._last

    def answered(self, number: int | None) -> None:
        """A caller gave again, from its own memo, the verdict whose key `last_number` was: the next `built`
        numbers by that key."""
        self._last = number

    def built(self, fusions: Sequence[Instruction], how: Any) -> None:
        """The move of the last verdict was made, giving `fusions` (one per consumer, in order; `how`: what
        else the builders were told, e.g. whether small constants are fused): number their fused computations
        by the parts' key and the move (`StructureKeys.derive`), which determine what was built, so that the
        next trial, multi-output fusion's profiles and the scheduler's kernel estimates do not walk them."""
        if self._last is None:
            return
        for i, fusion in enumerate(fusions):
            keys_of(fusion).derive(fusion.attrs["calls"], (self._last, i, how))
        self._last = None

    def time_us(self, insts: Sequence[Instruction]) -> float:
        """Summed modeled time of `insts` (a fresh model: the copies are thrown away); a block-level Triton
        fusion by XLA's indexing cost model at its tile (`triton_tiling.tiling_cost`, what XLA's PriorityFusion
        asks for Triton fusions), launch included."""
        model = self._get(self.device)
        return sum(self._triton_us(i) or float(model.node_time_us(i)) for i in insts)

    def _triton_us(self, inst: Instruction) -> float | None:
        from hlopt.cost_model.devices import get_device
        from hlopt.passes.fusion.triton_tiling import (
            TilingChoice,
            block_level_tile,
            graph_of_fusion,
            tiling_cost,
        )

        tile = block_level_tile(inst)  # a tuple root: its real root's tile
        if tile is None:
            return None
        try:
            choice = tiling_cost(graph_of_fusion(inst), tuple(tile), self.device)
            launch = float(get_device(self.device).kernel_launch_us)
        except (KeyError, ValueError):
            return None  # a device without a spec (a user model): its own times
        return choice.cost_us + launch if isinstance(choice, TilingChoice) else None

    def _launches(self, insts: Sequence[Instruction]) -> int:
        from hlopt.cost_model.kernel import NO_KERNEL

        return sum(1 for i in insts if i.opcode not in NO_KERNEL)

    def producer_into_consumers(self, producer: Instruction, consumers: Sequence[Instruction],
                                plans: Sequence[tuple[dict[str, Any], list[int]] | None] = (),
                                producer_stays: bool = False) -> TrialVerdict:
        """priority-fusion's move: `producer` fused into each of `consumers` (one fusion per consumer; a
        `plans` entry makes it a block-level Triton fusion with that backend config); with
        `producer_stays` the producer still runs for users left out (bitcasts)."""
        extra = (repr(list(plans)), producer_stays)
        return self._cached("into", [producer, *consumers], extra,
                            lambda: self._producer_into_consumers(producer, consumers, plans, producer_stays))

    def _producer_into_consumers(self, producer: Instruction, consumers: Sequence[Instruction],
                                 plans: Sequence[tuple[dict[str, Any], list[int]] | None],
                                 producer_stays: bool) -> TrialVerdict:
        if len(consumers) > 1:
            try:
                return self._by_consumer(producer, consumers, plans, producer_stays)
            except TypeError:  # an attribute value that is not hashable even as its parts
                pass
        s = _Scratch()
        p = s.copy(producer)
        cs = [s.copy(c) for c in consumers]
        s.keep(*(cs + ([p] if producer_stays else [])))
        before = self.time_us([p, *cs])
        fusions = []
        plans = list(plans) + [None] * (len(cs) - len(plans))
        for c, plan in zip(cs, plans, strict=False):
            fusions.append(_fuse_copies(s, p, c, plan))
        after_parts = fusions + ([p] if producer_stays else [])
        after = self.time_us(after_parts)
        saved = self._launches([p, *cs]) - self._launches(after_parts)
        return TrialVerdict(before, after, saved)

    def _by_consumer(self, producer: Instruction, consumers: Sequence[Instruction],
                     plans: Sequence[tuple[dict[str, Any], list[int]] | None], producer_stays: bool) -> TrialVerdict:
        """`_producer_into_consumers` with several consumers, from one trial per consumer: each fusion is built
        from the producer and its consumer alone, and a kernel's modeled time reads nothing outside it, so the
        times are those of one scratch with every consumer, summed in the same order. Each consumer's trial
        is remembered by the structure of its pair (the users of a value every layer shares are a few kinds,
        repeated once per layer)."""
        plans = list(plans) + [None] * (len(consumers) - len(plans))
        pairs = [self._pair(producer, c, plan) for c, plan in zip(consumers, plans, strict=False)]
        t_p, p_launches = pairs[0][0], pairs[0][3]
        before = sum([t_p, *(pair[1] for pair in pairs)])
        after = sum([pair[2] for pair in pairs] + ([t_p] if producer_stays else []))
        launched = p_launches + sum(pair[4] for pair in pairs)
        saved = launched - (len(pairs) + (p_launches if producer_stays else 0))
        return TrialVerdict(before, after, saved)

    def _pair(self, producer: Instruction, consumer: Instruction,
              plan: tuple[dict[str, Any], list[int]] | None) -> tuple[float, float, float, int, int]:
        """(time of the producer, of the consumer, of the fusion of the two; launches of the producer and of the
        consumer) from copies, remembered by the pair's structure."""
        key = (parts_key(keys_of(producer), [producer, consumer]), repr(plan))
        got = self._pairs.get(key)
        if got is not None:
            return got
        s = _Scratch()
        p = s.copy(producer)
        c = s.copy(consumer)
        s.keep(c)
        t_p, t_c = self.time_us([p]), self.time_us([c])
        fusion = _fuse_copies(s, p, c, plan)
        got = self._pairs[key] = (t_p, t_c, self.time_us([fusion]), self._launches([p]), self._launches([c]))
        return got

    def siblings(self, a: Instruction, b: Instruction) -> TrialVerdict:
        """multi-output-fusion's sibling move: `b` merged into `a` (a fusion, or wrapped in one) as extra outputs."""
        return self._cached("siblings", [a, b], None, lambda: self._siblings(a, b))

    def _siblings(self, a: Instruction, b: Instruction) -> TrialVerdict:
        s = _Scratch()
        ca, cb = s.copy(a), s.copy(b)
        s.keep(ca, cb)
        before = self.time_us([ca, cb])
        if ca.opcode != "fusion":
            ca = wrap_in_fusion(ca, run=s.run)
        merge_into_multi_output(ca, cb, reorder=False, run=s.run)
        after = self.time_us([ca])
        return TrialVerdict(before, after, self._launches([a, b]) - 1)

    def producer_as_output(self, producer: Instruction, consumer: Instruction,
                           plan: dict[str, Any] | None = None) -> TrialVerdict:
        """multi-output-fusion's producer-consumer move: `producer` fused into `consumer`, still output; with
        `plan` (a backend config) the result is a block-level Triton fusion (priority-fusion's Triton
        multi-output fusion)."""
        return self._cached("output", [producer, consumer], None if plan is None else repr(plan),
                            lambda: self._producer_as_output(producer, consumer, plan))

    def _producer_as_output(self, producer: Instruction, consumer: Instruction,
                            plan: dict[str, Any] | None = None) -> TrialVerdict:
        s = _Scratch()
        p, c = s.copy(producer), s.copy(consumer)
        s.keep(p, c)
        before = self.time_us([p, c])
        fusion = c if c.opcode == "fusion" else wrap_in_fusion(c, run=s.run)
        fuse_into_multi_output(fusion, p, reorder=False, run=s.run)
        if plan is not None:
            fusion.attrs["kind"] = "kCustom"
            fusion.set_backend_config_json(plan)
        after = self.time_us([fusion])
        return TrialVerdict(before, after, self._launches([producer, consumer]) - 1)

    def users_as_outputs(self, fusion: Instruction, chains: Sequence[Sequence[Instruction]]) -> TrialVerdict:
        """copy-fusion's move: the last instruction of each chain (a copy reading `fusion`, through a
        get-tuple-element or a bitcast) computed inside `fusion` and output from there."""
        parts = [fusion, *(inst for chain in chains for inst in chain)]
        return self._cached("outputs", parts, tuple(len(c) for c in chains),
                            lambda: self._users_as_outputs(fusion, chains))

    def _users_as_outputs(self, fusion: Instruction, chains: Sequence[Sequence[Instruction]]) -> TrialVerdict:
        s = _Scratch()
        f = s.copy(fusion)
        copied = [[s.copies.get(i) or s.copy(i) for i in chain] for chain in chains]
        s.keep(f, *(c[-1] for c in copied))
        kernels = [f, *(c[-1] for c in copied)]
        before = self.time_us(kernels)
        if f.opcode != "fusion":  # a lone instruction, wrapped to take the copies
            f = wrap_in_fusion(f, run=s.run)
        for chain in copied:
            fuse_user_as_output(f, chain, run=s.run)
        after = self.time_us([f])
        return TrialVerdict(before, after, self._launches(kernels) - 1)

    def horizontal(self, parts: Sequence[Instruction]) -> TrialVerdict:
        """horizontal-loop-fusion's move: independent `parts` (fusions or lone instructions) merged into one
        fusion with all their outputs."""
        return self._cached("horizontal", parts, None, lambda: self._horizontal(parts))

    def _horizontal(self, parts: Sequence[Instruction]) -> TrialVerdict:
        s = _Scratch()
        copies = [s.copy(p) for p in parts]
        s.keep(*copies)
        before = self.time_us(copies)
        first = copies[0] if copies[0].opcode == "fusion" else wrap_in_fusion(copies[0], run=s.run)
        for other in copies[1:]:
            merge_into_multi_output(first, other, reorder=False, run=s.run)
        after = self.time_us([first])
        return TrialVerdict(before, after, self._launches(parts) - 1)


def fusion_audit_lines(explanations: Sequence[Any]) -> list[str]:
    """The decision audit (`hlopt opt --explain-fusion`): every fusion made, and every one refused because it
    would be slower as built, with the cost model's time of the parts before and of the kernels after, the
    launches saved and the rule; then the totals. `explanations`: a run's (`PipelineResult.explanations`)."""
    rows = [e for e in explanations if e.before_us is not None and (e.taken or "slower as built" in e.reason)]
    lines = [f"{'pass':22} {'rule':18} {'decision':8} {'before us':>10} {'after us':>10} {'launches':>8}  fusion"]
    for e in rows:
        into = ", ".join("%" + c for c in e.consumers)
        lines.append(f"{e.pass_name:22} {e.rule or '-':18} {'fused' if e.taken else 'refused':8} "
                     f"{e.before_us:10.3f} {e.after_us:10.3f} {e.launches_saved:8d}  %{e.producer} -> {into}")
    made = [e for e in rows if e.taken]
    saved = sum(e.before_us - e.after_us for e in made)
    lines.append(f"{len(made)} fusion(s) made: {sum(e.launches_saved for e in made)} launch(es) and {saved:.3f} us "
                 f"saved by the cost model, none slower; {len(rows) - len(made)} refused as slower as built")
    return lines
