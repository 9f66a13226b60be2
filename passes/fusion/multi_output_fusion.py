"""multi-output-fusion: one kernel for siblings reading the same operand, and for a producer fused
into a consumer while its value is still needed elsewhere (XLA:GPU's MultiOutputFusion).

Sibling fusion, before:
    %f1 = f32[1024] fusion(%big), kind=kLoop, calls=%fused_computation    # exp(%big)
    %f2 = f32[]     fusion(%big), kind=kInput, calls=%fused_computation.1 # reduce(%big)
after (%big read once):
    %f1 = (f32[1024], f32[]) fusion(%big), kind=kInput, calls=%fused_computation   # ROOT tuple(exp, reduce)
    %g0 = f32[1024] get-tuple-element(%f1), index=0
    %g1 = f32[] get-tuple-element(%f1), index=1

Producer-consumer multi-output fusion: a producer that priority-fusion could not fuse into all of its
consumers is fused into one of them anyway and output from there too (a tuple root), so that consumer
does not read it back from memory; its other users read it through a get-tuple-element.

Instructions are visited uses before defs, as XLA does. Legality is XLA's: siblings not connected
(reachability), compatible loop shapes and heroes (no reduction with a transpose, equal reductions),
non-overlapping slices refused, no dynamic-update-slice roots, budgets (operands+outputs, unnested
reductions, shared memory, code size); producers with in-place ops, physical transposes or several
outputs are not taken, nor would-be cycles. Every fusion must also pay under the cost model (one
kernel against two, launch overhead included). The run's `PassResult` (and a pipeline's `PipelineResult`)
carries the explanation of every decision.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape, is_row_major
from hlopt.hlo.structure import shared_keys
from hlopt.passes.framework.registry import register
from hlopt.passes.fusion.fusion_budgets import budget_refusal, merged_too_large
from hlopt.passes.fusion.fusion_building import (
    fuse_into_multi_output,
    merge_into_multi_output,
    remove_fusion,
    wrap_in_fusion,
)
from hlopt.passes.fusion.fusion_cost import Profile, profile_of
from hlopt.passes.fusion.fusion_rules import (
    EW,
    find_hero,
    fusible_computations,
    fusion_roots,
    is_fusible,
    is_multi_output,
    is_tiled_transpose,
    is_unnested_reduction,
)
from hlopt.passes.fusion.fusion_run import FusionPass, FusionRun
from hlopt.passes.fusion.fusion_trial import FusionTrial, TrialVerdict

__all__ = ["MultiOutputFusion"]

#: Operands smaller than this may be sliced by both siblings without an overlap check (XLA: 1024 B).
SMALL_OPERAND_BYTES = 1024


# ----------------------------------------------------------------------------- rules


def _is_kind(inst: Instruction, kind: str) -> bool:
    return inst.opcode == "fusion" and str(inst.attrs.get("kind")) == kind


def _input_fusible_reduction(inst: Instruction) -> bool:
    if inst.opcode == "fusion":
        return any(is_unnested_reduction(find_hero(r)) for r in fusion_roots(inst.attrs["calls"]))
    return is_unnested_reduction(inst)


def _input_fusible_transpose(inst: Instruction) -> bool:
    if inst.opcode == "fusion":
        return any(is_tiled_transpose(find_hero(r)) for r in fusion_roots(inst.attrs["calls"]))
    return is_tiled_transpose(inst)


def fusible_as_multi_output_root(inst: Instruction) -> bool:
    """XLA's IsFusibleAsMultiOutputFusionRoot: reductions, tiled transposes, loop fusions, elementwise."""
    return is_fusible(inst) and _root_kind(inst)


def _root_kind(inst: Instruction) -> bool:
    """The second half of `fusible_as_multi_output_root`: what it reads of the instruction (and its fused
    computation) alone."""
    return (_input_fusible_reduction(inst) or _input_fusible_transpose(inst) or _is_kind(inst, "kLoop")
            or inst.opcode in EW)


def _nestable_variadic_reduction(inst: Instruction) -> bool:
    if not inst.shape.is_tuple:
        return False
    if inst.opcode == "reduce":
        return not is_unnested_reduction(inst)
    return _is_kind(inst, "kLoop") and inst.attrs["calls"].root.opcode == "reduce"


def sibling_candidate(inst: Instruction) -> bool:
    """XLA's IsSiblingFusionCandidate."""
    if not inst.users or not is_fusible(inst):
        return False
    return _candidate_with(inst, sibling_traits(inst))


def _candidate_with(inst: Instruction, traits: SiblingTraits) -> bool:
    """`sibling_candidate` of a used, fusible instruction whose `sibling_traits` are `traits`: a multi-output
    fusion only where every user reads one of its outputs."""
    ok, multi = traits
    return ok and (not multi or all(u.opcode == "get-tuple-element" for u in inst.users))


#: What `sibling_candidate` reads of one instruction (and its fused computation) alone: (it may be a sibling
#: as far as that goes, it is a multi-output fusion); the fusion passes remember it until the instruction changes.
SiblingTraits = tuple[bool, bool]


def sibling_traits(inst: Instruction) -> SiblingTraits:
    """`inst`'s `SiblingTraits`."""
    multi = is_multi_output(inst)
    if not _root_kind(inst) or _nestable_variadic_reduction(inst):
        return False, multi
    if inst.shape.is_tuple and not multi:
        return False, multi  # a variadic op (reduce, sort, ...) at the root: no tuple to extend
    return True, multi


def _real_hero(inst: Instruction) -> Instruction:
    """XLA's GetRealHeroForMultiOutputFusion: the reduction or tiled transpose that shapes the kernel."""
    if inst.opcode != "fusion":
        return inst
    comp: Computation = inst.attrs["calls"]
    roots = fusion_roots(comp)
    for r in roots:
        hero = find_hero(r)
        if is_unnested_reduction(hero) or is_tiled_transpose(hero):
            return hero
    return roots[0]


def _physical_dims(shape: Shape) -> list[int]:
    """The non-degenerate dimensions of an array shape, major to minor in memory (default layout without one)."""
    layout = shape.layout
    order = reversed(layout.minor_to_major) if layout is not None and len(layout.minor_to_major) == shape.rank \
        else range(shape.rank)
    return [shape.dims[d] for d in order if shape.dims[d] != 1]


def loop_shapes_compatible(a: Shape, b: Shape) -> bool:
    """XLA's loop-shape check of ShapesCompatibleForMultiOutputFusion: equal shapes, or shapes one is a
    bitcast of the other (ShapeUtil::IsReshapeOrTransposeBitcast): the same dimensions in memory order
    (a transpose bitcast), or the same element count with both layouts row-major (a reshape bitcast)."""
    if tuple(a.dims) == tuple(b.dims):
        return True
    if _physical_dims(a) == _physical_dims(b):
        return True
    return a.numel == b.numel and is_row_major(a) and is_row_major(b)


def _out_dims(inst: Instruction) -> tuple[int, ...]:
    return tuple(inst.shape.leaves()[0].dims if inst.shape.is_tuple else inst.shape.dims)


def _same_reduction(a: Instruction, b: Instruction) -> bool:
    return (tuple(a.operand(0).shape.dims) == tuple(b.operand(0).shape.dims) and _out_dims(a) == _out_dims(b)
            and tuple(a.attrs.get("dimensions", ())) == tuple(b.attrs.get("dimensions", ())))


#: What `shapes_refusal` reads of one instruction: its real hero, whether that is an unnested reduction, a
#: tiled transpose, and its loop shape (`hero_traits`; the fusion passes remember it until the instruction changes).
HeroTraits = tuple[Instruction, bool, bool, Shape]


def hero_traits(inst: Instruction) -> HeroTraits:
    """`inst`'s real hero, whether it is an unnested reduction and a tiled transpose, and its loop shape."""
    hero = _real_hero(inst)
    reduction, transpose = is_unnested_reduction(hero), is_tiled_transpose(hero)
    if reduction or transpose:
        loop = hero.operand(0).shape
    else:
        loop = hero.shape.leaves()[0] if hero.shape.is_tuple else hero.shape
    return hero, reduction, transpose, loop


def shapes_refusal(a: Instruction, b: Instruction, traits_a: HeroTraits | None = None,
                   traits_b: HeroTraits | None = None) -> str | None:
    """XLA's ShapesCompatibleForMultiOutputFusion (with FusionHeroesAreCompatible); `traits_*`: the
    instructions' `hero_traits` where the caller has them."""
    ha, ra, ta, la = traits_a or hero_traits(a)
    hb, rb, tb, lb = traits_b or hero_traits(b)
    if ra and rb and not _same_reduction(ha, hb):
        return "tiled reductions with different shapes"
    if ta and tb and (tuple(ha.shape.dims) != tuple(hb.shape.dims) or ha.attrs.get("dimensions") != hb.attrs.get(
            "dimensions")):
        return "tiled transposes with different shapes"
    if (ta and rb) or (ra and tb):
        return "a transpose and a reduction"
    if not loop_shapes_compatible(la, lb):
        return f"different loop shapes {list(la.dims)} and {list(lb.dims)}"
    return None


def _unique_slice(parent: Instruction, inst: Instruction) -> Instruction | None:
    """The one slice through which `inst` reads `parent` (XLA's FindUniqueSlice)."""
    if inst.opcode == "slice":
        return inst
    if inst.opcode != "fusion":
        return None
    found = None
    for i, op in enumerate(inst.operands):
        if op is parent:
            if found is not None:
                return None
            param = inst.attrs["calls"].parameter(i)
            if param.user_count != 1 or param.users[0].opcode != "slice":
                return None
            found = param.users[0]
    return found


def slices_refusal(a: Instruction, b: Instruction, parent: Instruction) -> str | None:
    """XLA's ParameterSlicesAreNonOverlapping: siblings reading disjoint slices share nothing."""
    if not _slices_matter(parent):
        return None
    return _disjoint_slices_refusal(a, b, parent)


def _slices_matter(parent: Instruction) -> bool:
    """Whether `slices_refusal` looks at the siblings' slices of `parent` at all (an array of 1 KiB or more)."""
    return not parent.shape.is_tuple and parent.shape.byte_size >= SMALL_OPERAND_BYTES


def _disjoint_slices_refusal(a: Instruction, b: Instruction, parent: Instruction) -> str | None:
    """`slices_refusal` of a `parent` whose slices matter (`_slices_matter`)."""
    sa, sb = _unique_slice(parent, a), _unique_slice(parent, b)
    if sa is None or sb is None:
        return None
    for (s1, l1, _), (s2, l2, _) in zip(sa.attrs["slice"], sb.attrs["slice"], strict=False):
        if not (s1 < l2 and s2 < l1):
            return "they read non-overlapping slices of the operand"
    return None


_IN_PLACE = frozenset({"dynamic-update-slice", "scatter"})


def _has_inplace_op(inst: Instruction) -> bool:
    if inst.opcode != "fusion":
        return inst.opcode in _IN_PLACE
    return any(i.opcode in _IN_PLACE for i in inst.attrs["calls"].instructions)


def _physically_transposing(inst: Instruction) -> bool:
    insts = inst.attrs["calls"].instructions if inst.opcode == "fusion" else [inst]
    for i in insts:
        if i.opcode == "copy" and i.shape.layout != i.operand(0).shape.layout:
            return True
        if i.opcode == "transpose":
            dims = [d for d in i.attrs.get("dimensions", ()) if i.operand(0).shape.dims[d] != 1]
            if dims != sorted(dims):
                return True
    return False


def producer_refusal(producer: Instruction) -> str | None:
    """XLA's IsProducerMultiOutputFusible."""
    if is_multi_output(producer) or producer.shape.is_tuple:
        return "the producer has several outputs"
    if not is_fusible(producer):
        return f"{producer.opcode} is not fusible"
    if _has_inplace_op(producer):
        return "the producer updates a buffer in place"
    loop_fusible = producer.opcode in EW or producer.opcode in (
        "broadcast", "concatenate", "dynamic-slice", "gather", "pad", "reduce-window", "reshape", "reverse",
        "slice", "transpose", "bitcast", "iota", "constant", "copy", "reduce") or _is_kind(producer, "kLoop")
    if not loop_fusible:
        return "the producer is not loop-fusible"
    if _physically_transposing(producer):
        return "the producer transposes physically"
    return None


def _dus_root(inst: Instruction) -> bool:
    return inst.opcode == "dynamic-update-slice" or (
        inst.opcode == "fusion" and inst.attrs["calls"].root.opcode == "dynamic-update-slice")


# ----------------------------------------------------------------------------- the pass


def _between(lo: float, hi: float) -> float | None:
    """A number strictly between lo and hi (either may be infinite), or None if there is none."""
    if lo == -math.inf:
        return None if hi == -math.inf else (0.0 if hi == math.inf else hi - 1.0)
    if hi == math.inf:
        return lo + 1.0
    mid = (lo + hi) / 2
    return mid if lo < mid < hi else None


_UNKNOWN = "?"  # a `_PairFacts.budget` not checked yet


@dataclass(slots=True)
class _PairFacts:
    """What one sibling pair's decision reads of the two instructions alone, whichever operand they meet on:
    `shapes_refusal`, `sibling_gain`'s figures (None until asked for), the budget checks' refusal (None:
    within budget; `_UNKNOWN` until checked) and whether either has a dynamic-update-slice root (None until
    checked). Every one of them is a function of the pair's `_pair_structure`, so two pairs of fusions built
    the same way (the same siblings in the next layer) share one."""

    shapes: str | None
    gain: tuple[float, float, float] | None = None
    budget: str | None = _UNKNOWN
    dus: bool | None = None

    def pair_gain(self, comp: _Computation, a: Instruction, b: Instruction) -> tuple[float, float, float]:
        """`comp.sibling_gain(a, b)`, made on first use."""
        if self.gain is None:
            self.gain = comp.sibling_gain(a, b)
        return self.gain


#: A pair's `_PairFacts` as the pair last had them: (epoch of a, epoch of b, a's operands, b's operands, facts),
#: valid while both are as they were.
_KnownPair = tuple[int, int, tuple[Instruction, ...], tuple[Instruction, ...], _PairFacts]


def _operand_pattern(a: Instruction, b: Instruction, ops_a: tuple[Instruction, ...],
                     ops_b: tuple[Instruction, ...]) -> tuple[int, ...]:
    """Which operands of the pair are the same value: per operand of `a` then of `b`, the position of its
    first occurrence among them, -1 where it is `a` itself and -2 where it is `b`."""
    first = {a.id: -1, b.id: -2}
    return tuple([first.setdefault(o.id, i) for i, o in enumerate(ops_a + ops_b)])


class _Computation:
    """Multi-output fusion within one computation."""

    def __init__(self, comp: Computation, fusion_pass: MultiOutputFusion, run: FusionRun,
                 by_structure: dict[tuple, _PairFacts] | None = None):
        self.comp = comp
        self.p = fusion_pass
        self.run_state = run
        self.cost = run.cost
        self.budgets = fusion_pass.budgets()
        self.profiles: dict[int, Profile] = {}
        self.heroes: dict[int, HeroTraits] = {}  # by instruction id, until the instruction changes
        self.root_kinds: dict[int, bool] = {}  # `_root_kind` by instruction id, likewise
        self.sibling_traits: dict[int, SiblingTraits] = {}  # likewise
        #: how often each instruction changed (`changed_inst`): what a pair's remembered facts were made at
        self.epochs: dict[int, int] = {}
        #: per ordered sibling pair (ids): what `sibling_gain` and the budget checks read of the two, kept
        #: while neither changed and both read the same operands (a pair meets again on every operand they share)
        self.pairs: dict[tuple[int, int], _KnownPair] = {}
        #: `_PairFacts` of pairs of fusions by their structure (`_pair_structure`), for the whole run
        self.by_structure = by_structure
        self.keys = shared_keys(comp.module)
        #: `structure_of` by instruction id: (epoch, operands, structural key)
        self.inst_keys: dict[int, tuple[int, tuple[Instruction, ...], tuple]] = {}
        #: sibling pairs (lower id first) known to be connected: fusion only merges nodes, so a path between
        #: two instructions that are still there stays a path
        self.connected: set[tuple[int, int]] = set()
        self.pos: dict[Instruction, float] = {}
        self.reach_cache: dict[int, tuple[float, set[int]]] = {}
        self.order_stale = False  # fusions were placed by number only; `instructions` needs reordering
        self.changed = False
        self._trial: FusionTrial | None = None

    def note(self, producer: Instruction, consumers: tuple[str, ...], taken: bool, reason: str,
             gain: float | None = None, verdict: TrialVerdict | None = None, rule: str = "") -> None:
        self.run_state.explain(self.comp.name, producer.name, consumers, taken, reason, gain, verdict, rule)

    def trial(self) -> FusionTrial | None:
        """The never-slower check (None when the pass runs without it)."""
        if not self.p.never_slower:
            return None
        if self._trial is None:
            self._trial = FusionTrial(self.run_state.device)
        return self._trial

    def prof(self, inst: Instruction) -> Profile:
        return profile_of(inst, self.profiles, self.run_state)

    def time(self, inst: Instruction) -> float:
        return self.cost.time_us(inst, self.prof(inst))

    def shapes_refusal(self, a: Instruction, b: Instruction) -> str | None:
        """`shapes_refusal` with the instructions' hero traits remembered."""
        heroes = self.heroes
        ta = heroes.get(a.id)
        if ta is None:
            ta = heroes[a.id] = hero_traits(a)
        tb = heroes.get(b.id)
        if tb is None:
            tb = heroes[b.id] = hero_traits(b)
        return shapes_refusal(a, b, ta, tb)

    def root_kind(self, inst: Instruction) -> bool:
        """`_root_kind`, remembered until the instruction changes."""
        got = self.root_kinds.get(inst.id)
        if got is None:
            got = self.root_kinds[inst.id] = _root_kind(inst)
        return got

    def sibling_candidates(self, parent: Instruction) -> list[tuple[Instruction, bool]]:
        """`parent`'s users that are `sibling_candidate`s, each with whether it is a multi-output fusion
        (`sibling_traits` remembered until an instruction changes)."""
        out = []
        known = self.sibling_traits
        for u in parent.users:
            if not u.user_count or not is_fusible(u):
                continue
            traits = known.get(u.id)
            if traits is None:
                traits = known[u.id] = sibling_traits(u)
            if _candidate_with(u, traits):
                out.append((u, traits[1]))
        return out

    def root_fusible(self, inst: Instruction) -> bool:
        """`fusible_as_multi_output_root` with `root_kind` remembered."""
        return is_fusible(inst) and self.root_kind(inst)

    def changed_inst(self, inst: Instruction) -> None:
        self.epochs[inst.id] = self.epochs.get(inst.id, 0) + 1
        self.profiles.pop(inst.id, None)
        self.heroes.pop(inst.id, None)
        self.root_kinds.pop(inst.id, None)
        self.sibling_traits.pop(inst.id, None)
        self.cost.forget(inst)

    # ------------------------------------------------------------------ reachability
    def reindex(self) -> None:
        """Make the instruction order topological again and number it (a fresh numbering)."""
        if self.order_stale:
            self.comp.make_topological()
            self.order_stale = False
        self.pos = {inst: float(i) for i, inst in enumerate(self.comp.instructions)}
        self.reach_cache = {}

    def reaches(self, src: Instruction, dst: Instruction) -> bool:
        """Is there a path src -> ... -> dst.

        `pos` numbers the instructions topologically, so only instructions numbered below dst can lie
        on such a path. The search goes best first, highest number (closest to dst) first, and stops
        at dst: in the programs measured nearly every search that gets this far finds a path, and this
        order finds it after a few dozen instructions where a plain walk visits thousands. A search
        that finds none has collected everything src reaches below dst's number; that set is cached
        (the bound only grows) until a fusion changes what src reaches (`after_fusion`).
        """
        pos = self.pos
        limit = pos[dst]
        if pos[src] >= limit:
            return src is dst
        cached = self.reach_cache.get(src.id)
        if cached is not None and cached[0] >= limit:
            return dst.id in cached[1]
        target = dst.id
        seen = {src.id}
        work = [(-pos[src], src.id, src)]
        while work:
            for user in heapq.heappop(work)[2].users:
                uid = user.id
                if uid == target:
                    return True
                if uid not in seen:
                    seen.add(uid)
                    at = pos.get(user, limit)
                    if at < limit:
                        heapq.heappush(work, (-at, uid, user))
        self.reach_cache[src.id] = (limit, seen)
        return False

    def after_fusion(self, fusion: Instruction, merged: tuple[Instruction, ...]) -> None:
        """Keep reachability right after `merged` (instructions now inside `fusion`, or replaced by it)
        became `fusion`: number the fusion and its new get-tuple-elements between their operands and
        users (renumbering everything only when no such place is left), and forget the cached reach
        sets that may have changed.

        A fusion adds paths only through the merged instructions, so a cached set of src stays right
        when it shows that src reaches none of them: each is numbered below the set's bound (so it
        would have been found) and is not in it. XLA rebuilds its reachability map after every fusion
        instead; in Python that is quadratic in the size of the computation.
        """
        self.changed = True
        self.order_stale = True
        pos = self.pos
        old = [(pos.get(x, math.inf), x.id) for x in merged]
        self.reach_cache = {src: (bound, seen) for src, (bound, seen) in self.reach_cache.items()
                            if all(p < bound and uid not in seen for p, uid in old)}
        if not self.number_in_place(fusion):
            self.reindex()

    def number_in_place(self, fusion: Instruction) -> bool:
        """Number `fusion` and its new get-tuple-element users (those without a number) strictly
        between their operands' and users' numbers; False when there is no room."""
        pos = self.pos
        if fusion.has_control_dependencies:
            return False
        lo = max((pos[o] for o in fusion.operands), default=-math.inf)
        new_users = [u for u in fusion.users if u not in pos]
        hi = min((pos[u] for u in fusion.users if u in pos), default=math.inf)
        for g in new_users:
            if g.control_successors:
                return False
            hi = min(hi, min((pos[w] for w in g.users), default=math.inf))
        at = _between(lo, hi)
        if at is None:
            return False
        pos[fusion] = at
        for g in new_users:
            at_g = _between(at, min((pos[w] for w in g.users), default=math.inf))
            if at_g is None:
                return False
            pos[g] = at_g
        return True

    # ------------------------------------------------------------------ siblings
    def sibling_refusal(self, a: Instruction, b: Instruction, parent: Instruction) -> str | None:
        """XLA's CanFuseSiblings, cheap checks first (the reachability walk last)."""
        facts = self.pair_facts(a, b)
        return facts.shapes or self._refusal_after_shapes(a, b, parent, facts, _slices_matter(parent))

    def _refusal_after_shapes(self, a: Instruction, b: Instruction, parent: Instruction,
                              facts: _PairFacts, slices_matter: bool) -> str | None:
        """`sibling_refusal` of a pair whose shapes are compatible (`slices_matter`: `_slices_matter(parent)`)."""
        if slices_matter:
            why = _disjoint_slices_refusal(a, b, parent)
            if why:
                return why
        dus = facts.dus
        if dus is None:
            dus = facts.dus = _dus_root(a) or _dus_root(b)
        if dus:
            return "dynamic-update-slice roots are not multi-output fused"
        why = facts.budget
        if why is _UNKNOWN:
            pa, pb = self.prof(a), self.prof(b)
            why = facts.budget = (budget_refusal(a, pa, b, pb, False, self.budgets)
                                  or merged_too_large(b, pb, a, pa, self.budgets))
        if why:
            return why
        if self.connected_pair(a, b):
            return "they are connected (one reads the other)"
        return None

    def connected_pair(self, a: Instruction, b: Instruction) -> bool:
        """Does either reach the other (remembered once they do)."""
        key = (a.id, b.id) if a.id < b.id else (b.id, a.id)
        if key in self.connected:
            return True
        if self.reaches(a, b) or self.reaches(b, a):
            self.connected.add(key)
            return True
        return False

    def pair_facts(self, a: Instruction, b: Instruction) -> _PairFacts:
        """The pair's `_PairFacts`, found again when either changed or reads other operands since."""
        key = (a.id, b.id)
        known = self.pairs.get(key)
        epochs = self.epochs
        ea, eb = epochs.get(a.id, 0), epochs.get(b.id, 0)
        ops_a, ops_b = a.operands, b.operands
        if (known is not None and known[0] == ea and known[1] == eb and known[2] == ops_a
                and known[3] == ops_b):
            return known[4]
        facts = self.structural_facts(a, b, ops_a, ops_b)
        self.pairs[key] = (ea, eb, ops_a, ops_b, facts)
        return facts

    def structural_facts(self, a: Instruction, b: Instruction, ops_a: tuple[Instruction, ...],
                         ops_b: tuple[Instruction, ...]) -> _PairFacts:
        """Fresh `_PairFacts` of a pair; for two fusions, those of an earlier pair of the same structure
        (`_pair_structure`) where there is one."""
        structure = self._pair_structure(a, b, ops_a, ops_b)
        if structure is None:
            return _PairFacts(self.shapes_refusal(a, b))
        facts = self.by_structure.get(structure)
        if facts is None:
            facts = self.by_structure[structure] = _PairFacts(self.shapes_refusal(a, b))
        return facts

    def _pair_structure(self, a: Instruction, b: Instruction, ops_a: tuple[Instruction, ...],
                        ops_b: tuple[Instruction, ...]) -> tuple | None:
        """What every `_PairFacts` entry reads of a pair of fusions: their structural keys (`hlo.structure`:
        fused computations, shapes, operand shapes, attributes) and which of their operands are the same value
        (or one of them); None for a pair that is not two fusions (an unfused instruction's read traits look at
        its operands' producers) or has an attribute that cannot be keyed."""
        if a.opcode != "fusion" or b.opcode != "fusion" or self.by_structure is None:
            return None
        try:
            return self.structure_of(a, ops_a), self.structure_of(b, ops_b), _operand_pattern(a, b, ops_a, ops_b)
        except TypeError:  # an attribute value that is not hashable even as its parts
            return None

    def structure_of(self, inst: Instruction, ops: tuple[Instruction, ...]) -> tuple:
        """`inst`'s structural key (`hlo.structure`), remembered while it is as it was (its epoch and operands:
        what a pair's remembered facts are checked against; a sibling meets many others)."""
        epoch = self.epochs.get(inst.id, 0)
        known = self.inst_keys.get(inst.id)
        if known is not None and known[0] == epoch and known[1] == ops:
            return known[2]
        key = self.keys.of(inst)
        self.inst_keys[inst.id] = (epoch, ops, key)
        return key

    def sibling_gain(self, a: Instruction, b: Instruction) -> tuple[float, float, float]:
        """(unfused - fused, unfused, fused): two kernels against one reading shared operands once (their
        re-reads, utilization above 1, weighed on the fused kernel's grid, as XLA's read-time heuristic does).
        A shared operand's utilization in the merged kernel is the sum of the siblings' (each reduction reads
        it for itself), or for two loop fusions the larger one (their outputs share one loop: XLA's
        utilization propagation meets at the tuple root)."""
        pa, pb = self.prof(a), self.prof(b)
        per: dict[int, list[float]] = {}
        loops = not (pa.reduction_hero or pb.reduction_hero)
        for inst, prof in ((a, pa), (b, pb)):
            for op, u, nbytes in zip(inst.operands, prof.util, prof.op_bytes, strict=False):
                entry = per.setdefault(op.id, [0.0, nbytes])
                entry[0] = max(entry[0], u) if loops and inst is b else entry[0] + u
        grid = pa if pa.reduction_hero or (not pb.reduction_hero and pa.blocks <= pb.blocks) else pb
        nbytes = pa.out_bytes + pb.out_bytes + sum(self.cost.operand_read_bytes(b_, u, grid.blocks)
                                                   for u, b_ in per.values())
        fused = self.cost.emitter_time_us(pa.compute + pb.compute, nbytes, grid.blocks, grid.threads)
        unfused = self.time(a) + self.time(b)
        return unfused - fused, unfused, fused

    def fuse_siblings(self, parent: Instruction) -> None:
        if parent.user_count < 2:  # no pair of siblings: nothing to look at
            return
        if not parent.shape.is_tuple and parent.shape.numel <= 1:
            return
        found = self.sibling_candidates(parent)
        slices_matter = _slices_matter(parent)
        rank = {u: 2 if multi else 1 if u.opcode == "fusion" else 0 for u, multi in found}
        siblings = [u for u, _ in found]
        siblings.sort(key=lambda u: -rank[u])
        i = 0
        while i < len(siblings):
            a = siblings[i]
            i += 1
            if a.opcode != "fusion":
                continue
            j = i
            while j < len(siblings):
                b = siblings[j]
                facts = self.pair_facts(a, b)
                why = facts.shapes
                gain = None
                if why is None:
                    gain, unfused, fused = facts.pair_gain(self, a, b)
                    if gain < 0:
                        why = f"slower if fused (unfused {unfused:.3f} us, fused {fused:.3f} us)"
                    else:
                        why = self._refusal_after_shapes(a, b, parent, facts, slices_matter)
                verdict = None
                if why is None and (trial := self.trial()) is not None:
                    verdict = trial.siblings(a, b)
                    if verdict.slower:
                        why = f"slower as built ({verdict.describe()})"
                if why is not None:
                    self.note(b, (a.name,), False, f"sibling of %{a.name} on %{parent.name}: {why}", gain, verdict,
                              "sibling")
                    j += 1
                    continue
                self.note(b, (a.name,), True, f"sibling of %{a.name} (both read %{parent.name})", gain, verdict,
                          "sibling")
                self.changed_inst(a)
                self.changed_inst(b)
                merge_into_multi_output(a, b, reorder=False, run=self.run_state)
                if verdict is not None:
                    self.trial().built([a], "siblings")  # numbered by what it was built from: no walk
                self.changed_inst(a)
                siblings.pop(j)
                self.after_fusion(a, (a, b))

    # ------------------------------------------------------------------ producer into consumer
    def consumer_refusal(self, producer: Instruction, consumer: Instruction) -> tuple[str | None, float | None]:
        if not self.root_fusible(consumer):
            return f"%{consumer.name} cannot be a multi-output fusion root", None
        why = self.shapes_refusal(consumer, producer)
        if why:
            return why, None
        for op in consumer.operands:
            if op is not producer and self.reaches(producer, op):
                return f"%{producer.name} reaches %{op.name}: fusing would create a cycle", None
        p, c = self.prof(producer), self.prof(consumer)
        why = budget_refusal(producer, p, consumer, c, False, self.budgets) or merged_too_large(
            producer, p, consumer, c, self.budgets)
        if why:
            return why, None
        unfused = self.time(producer) + self.time(consumer)
        fused = self.cost.fused_time_us(producer, p, consumer, c, multi_output=True)
        if fused > unfused:
            return f"slower if fused (unfused {unfused:.3f} us, fused {fused:.3f} us)", unfused - fused
        return None, unfused - fused

    def fuse_producer_consumer(self, producer: Instruction) -> None:
        if producer.user_count == 1 and not is_multi_output(producer.users[0]):
            return  # the single-consumer case belongs to priority-fusion
        if producer_refusal(producer) is not None:
            return
        candidates = []
        for consumer in producer.users:
            why, gain = self.consumer_refusal(producer, consumer)
            if why is not None:
                self.note(producer, (consumer.name,), False, f"multi-output into %{consumer.name}: {why}", gain)
            else:
                candidates.append((consumer, gain))
        if not candidates:
            return
        consumer, gain = max(candidates, key=lambda cg: 2 if is_multi_output(cg[0]) else int(cg[0].opcode == "fusion"))
        verdict = None
        if (trial := self.trial()) is not None:
            verdict = trial.producer_as_output(producer, consumer)
            if verdict.slower:
                self.note(producer, (consumer.name,), False, f"multi-output into %{consumer.name}: slower as built "
                          f"({verdict.describe()})", gain, verdict, "producer-consumer")
                return
        others = tuple(u.name for u in producer.users if u is not consumer)
        self.note(producer, (consumer.name,), True,
                  f"into %{consumer.name} as an extra output (still read by {', '.join('%' + o for o in others)})",
                  gain, verdict, "producer-consumer")
        self.changed_inst(consumer)
        fusion = consumer if consumer.opcode == "fusion" else wrap_in_fusion(consumer, run=self.run_state)
        fuse_into_multi_output(fusion, producer, reorder=False, run=self.run_state)
        if verdict is not None:
            self.trial().built([fusion], "output")  # numbered by what it was built from: no walk
        self.changed_inst(fusion)
        remove_fusion(producer, run=self.run_state)
        self.after_fusion(fusion, (producer, consumer))

    def run(self) -> bool:
        self.reindex()
        for producer in reversed(list(self.comp.instructions)):
            if producer.parent is not self.comp or producer.opcode == "constant":
                continue
            if producer.opcode == "fusion" and str(producer.attrs.get("kind")) == "kCustom":
                continue
            self.fuse_siblings(producer)
            if producer.parent is self.comp:
                self.fuse_producer_consumer(producer)
        if self.order_stale:
            self.comp.make_topological()
        return self.changed


@register
@dataclass(frozen=True)
class MultiOutputFusion(FusionPass):
    """Sibling and producer-consumer multi-output fusion (see the module docstring)."""

    name: ClassVar[str] = "multi-output-fusion"

    def fuse(self, module: Module, run: FusionRun) -> bool:
        """Sibling and producer-consumer fusion in every fusible computation, callees first."""
        changed = False
        by_structure: dict[tuple, _PairFacts] = {}
        for comp in fusible_computations(module):
            changed |= _Computation(comp, self, run, by_structure).run()
        return changed
