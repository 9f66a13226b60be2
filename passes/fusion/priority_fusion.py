"""priority-fusion: producer-consumer fusion, best modeled saving first (XLA:GPU's PriorityFusion).

Before:
    %a = f32[64,256] add(%x, %y)
    %t = f32[64,256] tanh(%a)
    %r = f32[64] reduce(%t, %zero), dimensions={1}, to_apply=%sum
After:
    %fused_computation { %param_0 = ... %param_1 = ... add ... tanh ... reduce(..., %zero') }
    %r = f32[64] fusion(%x, %y), kind=kInput, calls=%fused_computation

Each fusible producer gets a priority = modeled time unfused - time fused (the producer's kernel and its
consumers' kernels against one fused kernel per consumer, launch overheads included, from `cost_model`
through `FusionCostModel`). A heap pops the best producer; it is fused into all of its consumers or none
(bitcast consumers excepted, as XLA); then only its neighbours are re-costed: the new fusions and their
operands, with per-(producer, consumer) caches of legality and fused time. Small constants are fused
into every fusible user at the end. Legality follows XLA (passes/fusion/fusion_rules.py, fusion_budgets.py): fusible opcodes,
no reduce into reduce, no loop epilogue on a reduction, budgets (96 operands+outputs, 8 unnested
reductions, shared memory, code size), no duplication of expensive producers into consumers that reuse
elements, in-place and scatter rules, never the computation's root as producer; an add that XLA:GPU's
GemmRewriter folds into a cuBLAS call (a GEMM's bias) is left alone, and a sort does not keep an iota
from fusing into its other consumers (XLA's SortIotaFusion copies it). XLA:GPU's pre-fusion rewrites are
passes of their own that run before this one (the `fusion` and `default` pipelines): dot-strength-reduction
select-and-scatter-expander and scatter-simplifier (docs/notes/priority-fusion.md).

With `triton_softmax_priority_fusion=true` (XLA's xla_gpu_experimental_enable_triton_softmax_priority_fusion) the
queue also grows XLA's block-level Triton fusions (`__triton`, from its SoftmaxRewriterTriton): a pair where the
producer or the consumer is one is legal when the other side is fusible and Triton-supported and the fused
computation can be tiled (XLA's CanFuseTriton with SymbolicTileAnalysis: `triton_tiling.triton_fusion_plan`, the
one rule `triton-softmax-priority-fusion` grows by too), is timed by XLA's indexing cost model at its best tiling
(TryFindBestTilingForFusion), as is a Triton fusion alone at its own tile, and becomes a Triton fusion with that
tiling; XLA's other rules do not apply to such a pair. Afterwards CSE runs on the fused
computations, as in XLA's fusion pipeline (a row statistic that reached one fusion by two users is computed once).
With `triton_multi_output_fusion=true` as well (XLA's xla_gpu_unsupported_enable_triton_multi_output_fusion) a
producer that cannot fuse into all of its users fuses into the one user it can as a multi-output Triton fusion.

Triton multi-output fusion (XLA's PriorityFusionQueue::CalculateProducerPriority fallback,
FindPossibleConsumersForTritonMultiOutputFusion, CanFuseTritonMultiOutputWithSingleUser, Fuse with
use_multi_output_fusion): when some user refuses the producer, the users (fusible bitcasts left out) where the pair
fused with the producer kept as an extra output is a tileable Triton fusion (`triton_fusion_plan(...,
multi_output=True)`: one real root, every other output covered once by the programs' tiles) and where no other
operand of the user is reachable from the producer (no cycle) are the candidates; with exactly one, the producer's
priority is its time and that user's against the multi-output fusion's (launches included), and when it is popped
it is fused into that user alone: a kCustom `__triton` fusion with a tuple root (the user's outputs, then the
producer's), one output tile per output, the producer's other users reading it through a get-tuple-element.

The explanations of a run (`PriorityFusion(...).run_with_result(module).explanations`, or a pipeline's
`PipelineResult.explanations`; `explain_lines(result)` as text) say, for each candidate, why it was fused
(with the modeled gain) or refused (the rule, or the modeled loss).
"""

from __future__ import annotations

import heapq
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from hlopt.cost_model.devices import DeviceSpec, get_device
from hlopt.cost_model.kernel import transposes_minor_dimension
from hlopt.cost_model.launch import emitter_kind
from hlopt.cost_model.profile import user_cost_model
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.structure import shared_keys
from hlopt.passes.cse import CommonSubexpressionElimination
from hlopt.passes.dot_strength_reduction import DotStrengthReduction
from hlopt.passes.framework.base import PassResult
from hlopt.passes.framework.registry import register
from hlopt.passes.fusion.fusion_budgets import budget_refusal, creates_heavy_computation, merged_too_large
from hlopt.passes.fusion.fusion_building import (
    fuse_into_multi_output,
    fuse_into_new_fusion,
    fuse_producer,
    remove_fusion,
    wrap_in_fusion,
)
from hlopt.passes.fusion.fusion_cost import Profile, merge_profiles, profile_of
from hlopt.passes.fusion.fusion_rules import (
    fusible_computations,
    in_place_refusal,
    is_fusible,
    keeps_bit_width,
    keeps_reduction_hero,
    scatter_refusal,
)
from hlopt.passes.fusion.fusion_run import FusionPass, FusionRun
from hlopt.passes.fusion.fusion_trial import FusionTrial, TrialVerdict
from hlopt.passes.fusion.triton_tiling import (
    TilingChoice,
    block_level_tile,
    graph_of_fusion,
    is_generic_triton_fusion,
    tiling_cost,
    triton_fusion_plan,
)
from hlopt.passes.select_and_scatter_expander import SelectAndScatterExpander

__all__ = ["PriorityFusion", "explain_lines"]

_UNKNOWN: Any = object()
_LEFT_OUT: Any = object()
#: Numbers standing for classes of instructions (`_Queue.class_of`), never reused: a number names one class of
#: one queue.
_CLASSES = itertools.count()
#: Producers with more users than this are not remembered by structure: their key costs as much as their
#: priority, whose pairs stay cached between pushes (a value every layer reads is pushed again per layer)
_MEMO_USERS = 8
#: operands of a new fusion whose priority is not updated (they are never fused as producers here)
_NOT_PUSHED = frozenset({"constant", "get-tuple-element", "parameter"})
_SKIP_NOTES = frozenset({"parameter", "get-tuple-element", "tuple", "constant"})


def _left_out(producer: Instruction, user: Instruction) -> bool:
    """Users a producer is not fused into and that do not stop it fusing into the others: fusible bitcasts
    (XLA leaves them out of CanFuseWithAllNonBitcastUsers; one that changes the element bit width is not
    fusible and is a consumer like any other), and a sort reading an iota, which XLA:GPU's
    SortIotaFusion gives its own copy of the iota (a kCustom fusion) before priority fusion."""
    return (user.opcode == "bitcast" and keeps_bit_width(user)) or (producer.opcode == "iota" and user.opcode == "sort")


def _consumer(producer: Instruction, index: int) -> Instruction:
    """The `index`-th user of `producer` that is not left out (`_left_out`; asked only to name the user a
    remembered refusal was about, so not inlined as the hot loops have it)."""
    for user in producer.users:
        if _left_out(producer, user):
            continue
        if not index:
            return user
        index -= 1
    raise IndexError(index)


def explain_lines(obj: Any) -> list[str]:
    """Why each fusion candidate was taken or refused, one line each.

    `obj` is what a run returned: a `PipelineResult` (every pass of the pipeline, in order) or a
    `PassResult`. Deprecated: a fusion pass instance (its last direct `run()` call). Modules and pipelines
    no longer keep the explanations of what ran on or in them: read them from the result.
    """
    from hlopt.passes.framework.pipeline import PassRecord, PipelineResult

    if isinstance(obj, PipelineResult | PassResult | PassRecord):
        return obj.explain_lines()
    if isinstance(obj, FusionPass):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            lines = obj.explain_lines()
        warnings.warn("explain_lines(pass) is deprecated: pass the PassResult or PipelineResult of the run",
                      DeprecationWarning, stacklevel=2)
        return lines
    raise TypeError(f"explain_lines takes the result of a run (PipelineResult or PassResult), not "
                    f"{type(obj).__name__}: explanations are no longer kept per module or per pipeline; "
                    "use `result = pipeline.run(module)` then `result.explain_lines()`")


class _Queue:
    """The priority queue of one computation (XLA's PriorityFusionQueue).

    The layers of a model repeat: the same producer, with the same users reading it the same way, comes up
    once per layer. A producer's priority is remembered by `priority_key`: the classes of the producer and
    of its users (`class_of`: everything the rules and the cost model read of one instruction) and which of
    their operands are the same value; a fusion made here takes a class from what it was made of, and
    its Profile is shared with the fusions made the same way (`fuse_producer`). Refusals are remembered by
    the refusing user and explained again with this producer's names. What one user adds to a priority is
    kept per pair (`pair_vals`, invalidated as `legal` is) and remembered by the pair's part of the key
    (`pair_memo`); the never-slower check by the parts' classes (`parts_key`). All of it is on for XLA's
    default fusion only (no Triton fusions grown), and changes no decision: the structural keys are exact
    (tests/test_priority_fusion.py runs with it on and off; benchmarks/same_output.py compares the corpus).
    """

    #: remember priorities, kernel times and merged profiles by structure (off: every one computed, for tests)
    memo_by_structure: ClassVar[bool] = True

    def __init__(self, comp: Computation, fusion_pass: PriorityFusion, run: FusionRun):
        self.comp = comp
        self.p = fusion_pass
        self.run_state = run
        self.cost = run.cost
        self.budgets = fusion_pass.budgets()
        self.profiles: dict[int, Profile] = {}  # caches keyed by instruction uid
        self.legal: dict[int, dict[int, str | None]] = {}
        self.fused_t: dict[int, dict[int, float]] = {}
        #: (producer uid, consumer uid) -> (backend config, output tile) of a fusion that is a Triton fusion
        self.triton_plans: dict[tuple[int, int], tuple[dict[str, Any], list[int]]] = {}
        #: (producer uid, consumer uid) -> XLA's indexing-model time of that Triton fusion at its tiling (us)
        self.triton_us: dict[tuple[int, int], float] = {}
        #: (producer uid, consumer uid) -> (backend config, time in us) of their multi-output Triton fusion, or why not
        self.mof_plans: dict[tuple[int, int], tuple[dict[str, Any], float] | str] = {}
        #: producer uid -> the one user it fuses into as a multi-output Triton fusion (XLA's preferred_consumer_)
        self.preferred: dict[int, Instruction] = {}
        #: (instruction id, its edit stamp, its fused computation's) -> whether it is a loop kernel reading
        #: coalesced (`plain_loop_kernel`)
        self.plain_loop: dict[tuple[int, int, int], bool] = {}
        self.analytical: bool | None = None  # `analytical_model()`, once known
        self.spec: DeviceSpec | None = None  # the run's GPU spec, where the analytical model times it
        self.heap: list[tuple[float, int, int, Instruction]] = []
        self.token: dict[int, int] = {}
        #: instruction uid -> the gain of its entry in the heap, while that entry stands for it (`push`)
        self.live: dict[int, float] = {}
        self.counter = 0
        self.last_note: dict[int, str] = {}
        self.changed = False
        self.trial: FusionTrial | None = None
        #: this run grows block-level Triton fusions (`is_triton`)
        self.triton = fusion_pass.triton_softmax_priority_fusion or fusion_pass.triton_heroless_priority_fusion
        #: the memo by structure (`class_of`): on for the queue of XLA's default fusion (no Triton fusions)
        self.memo = self.memo_by_structure and not self.triton
        self.keys = shared_keys(comp.module)
        #: instruction uid -> its class (`class_of`), until `invalidate`
        self.classes: dict[int, int] = {}
        #: what a class stands for -> its number
        self.class_numbers: dict[tuple, int] = {}
        #: producer uid -> user uid -> the number of the user's part of `priority_key` (kept as `legal` is)
        self.pair_keys: dict[int, dict[int, int]] = {}
        #: producer uid -> user uid -> (the user's time, the pair's fused time), or `_LEFT_OUT` (kept as `legal` is)
        self.pair_vals: dict[int, dict[int, Any]] = {}
        #: (producer class, its places, the user's part of `priority_key`) -> what a legal user adds (`_priority`)
        self.pair_memo: dict[tuple, tuple[float, float]] = {}
        #: instruction uid -> the places of `operand_places`, until `invalidate`
        self.same: dict[int, tuple[int, ...]] = {}
        #: instruction uid -> (its edit stamp, `operand_places`)
        self.places: dict[int, tuple[int, dict[int, int], tuple[int, ...]]] = {}
        #: producer uid -> `producer_key`, until `invalidate`
        self.heads: dict[int, tuple[int, int]] = {}
        #: a part of a key (a user's, the places of a producer's operands) -> its number (`part_number`)
        self.part_numbers: dict[tuple, int] = {}
        #: `priority_key` of a refused producer -> the reason, "\0" where the refusing user's name goes
        self.refusals: dict[tuple, str] = {}
        #: `priority_key` -> (priority, index of the refusing user, -1: no users, None: not refused)
        self.priorities: dict[tuple, tuple[tuple[float, float, float], int | None]] = {}
        #: (class, operand pattern) -> `kernel_time`
        self.kernel_times: dict[tuple, float] = {}
        #: `parts_key` -> (the never-slower check's verdict, the number of its key in the trial)
        self.verdicts: dict[tuple, tuple[TrialVerdict, int | None]] = {}
        #: class -> its Profile (`prof`)
        self.profile_by_class: dict[int, Profile] = {}
        #: class -> `is_fusible`
        self.fusible_by_class: dict[int, bool] = {}
        #: class -> `plain_loop_kernel`
        self.plain_loop_by_class: dict[int, bool] = {}
        #: a fusion's class (made by `fuse_producer`) -> its Profile (`merge_profiles`)
        self.merged: dict[int, Profile] = {}
        self.kinds: dict[int, str] = {}  # a fusion's class -> the kind its builder gave it (`fuse_producer`)

    # ------------------------------------------------------------------ notes
    def note(self, producer: Instruction, taken: bool, reason: str, gain: float | None = None,
             consumers: tuple[str, ...] = (), verdict: TrialVerdict | None = None, rule: str = "priority") -> None:
        if producer.opcode in _SKIP_NOTES:
            return
        key = f"{taken}{reason}"
        if not taken and self.last_note.get(producer.id) == key:
            return
        self.last_note[producer.id] = key
        self.run_state.explain(self.comp.name, producer.name, consumers, taken, reason, gain, verdict, rule)

    # ------------------------------------------------------------------ legality
    def prof(self, inst: Instruction) -> Profile:
        """`inst`'s Profile, kept until `invalidate`; with a class, the Profile of its class (a class holds the
        structural key the run's profiles are remembered by, and is not looked up again after an edit that
        changed nothing the key reads)."""
        uid = inst.id
        got = self.profiles.get(uid)
        if got is not None:
            return got
        number = self.classes.get(uid)
        if number is None:
            return profile_of(inst, self.profiles, self.run_state)
        got = self.profile_by_class.get(number)
        if got is None:
            got = self.profile_by_class[number] = profile_of(inst, None, self.run_state)
        self.profiles[uid] = got
        return got

    def can_fuse(self, producer: Instruction, consumer: Instruction) -> str | None:
        """Why `producer` cannot fuse into `consumer` (None: it can), cached per pair."""
        row = self.legal.setdefault(producer.id, {})
        key = consumer.id
        if key in row:
            return row[key]
        why = row[key] = self._can_fuse(producer, consumer)
        return why

    def is_triton(self, inst: Instruction) -> bool:
        """A block-level Triton fusion this run may grow (XLA: with triton softmax or heroless priority fusion
        on)."""
        return self.triton and is_generic_triton_fusion(inst)

    def _can_fuse_triton(self, producer: Instruction, consumer: Instruction) -> str | None:
        """XLA's CanFuseTriton: the pair makes a Triton fusion that can still be tiled."""
        try:
            plan = triton_fusion_plan(producer, consumer, self.run_state.device,
                                      heroless=self.p.triton_heroless_priority_fusion)
        except (KeyError, ValueError):  # a device without a GPU spec (a user's model): no indexing cost model
            plan = f"no GPU spec for {self.run_state.device!r} to tile Triton fusions with"
        if isinstance(plan, str):
            return f"into %{consumer.name}: {plan}"
        cfg, choice = plan
        self.triton_plans[producer.id, consumer.id] = (cfg, list(choice.tile))
        self.triton_us[producer.id, consumer.id] = choice.cost_us + self.cost.launch_us
        return None

    def kernel_time(self, inst: Instruction) -> float:
        """Modeled time of `inst` as it is now: a Triton fusion by XLA's indexing cost model at its tile,
        launch included, anything else by its profile (cached until the instruction changes)."""
        times = self.cost.times
        t = times.get(inst.id)
        if t is not None:
            return t
        if self.memo:  # no Triton fusions in this queue
            number = self.class_of(inst)
            if number is not None:
                same = self.same.get(inst.id)
                key = (number, same if same is not None else self.operand_places(inst)[1])
                t = self.kernel_times.get(key)
                if t is None:
                    t = self.kernel_times[key] = self.cost.time_us(inst, self.prof(inst))
                else:
                    times[inst.id] = t
                return t
        tile = block_level_tile(inst) if self.is_triton(inst) else None
        if tile is not None:
            choice = tiling_cost(graph_of_fusion(inst), tile, self.run_state.device)
            if isinstance(choice, TilingChoice):
                t = times[inst.id] = choice.cost_us + self.cost.launch_us
                return t
        return self.cost.time_us(inst, self.prof(inst))

    def fused_time(self, producer: Instruction, p: Profile, consumer: Instruction) -> float:
        """Modeled time of `consumer` with `producer` fused in (a Triton pair by the tiled model)."""
        t = self.triton_us.get((producer.id, consumer.id))
        if t is None:
            return self.cost.fused_time_us(producer, p, consumer, self.prof(consumer))
        return t

    def needs_triton_plan(self, producer: Instruction, consumer: Instruction) -> bool:
        """A Triton pair whose plan is not known for the instructions as they are now."""
        return (self.is_triton(producer) or self.is_triton(consumer)) \
            and (producer.id, consumer.id) not in self.triton_plans

    def recheck(self, producer: Instruction, consumer: Instruction) -> str | None:
        """`can_fuse` decided again, for the instructions as they are now."""
        why = self.legal.setdefault(producer.id, {})[consumer.id] = self._can_fuse(producer, consumer)
        return why

    def _can_fuse(self, producer: Instruction, consumer: Instruction) -> str | None:
        if self.is_triton(producer) or self.is_triton(consumer):
            return self._can_fuse_triton(producer, consumer)
        if not is_fusible(consumer):
            return f"consumer %{consumer.name} ({consumer.opcode}) is not fusible"
        if self.p.triton_heroless_priority_fusion and is_fusible(producer) and consumer.opcode != "bitcast" \
                and self._can_fuse_triton(producer, consumer) is None:
            return None  # XLA prefers a Triton fusion wherever one can be tiled (CanFuse, heroless)
        if consumer.opcode == "bitcast":
            return "not fusing into a single bitcast as consumer"
        why = scatter_refusal(producer, consumer)
        if why:
            return why
        profiles = self.profiles
        p = profiles.get(producer.id) or self.prof(producer)
        c = profiles.get(consumer.id) or self.prof(consumer)
        if p.significant_reduce and c.significant_reduce:
            return f"both the producer and the consumer %{consumer.name} contain a reduce"
        if p.reduction_hero and not keeps_reduction_hero(producer, consumer):
            return f"fusing into %{consumer.name} would turn the reduction fusion into a loop fusion"
        why = budget_refusal(consumer, c, producer, p, True, self.budgets)
        if why:
            return f"into %{consumer.name}: {why}"
        why = merged_too_large(producer, p, consumer, c, self.budgets)
        if why:
            return f"into %{consumer.name}: {why}"
        if creates_heavy_computation(producer, p, consumer, c):
            return f"expensive producer would be recomputed for each element %{consumer.name} reuses"
        why = in_place_refusal(producer, consumer)
        if why:
            return why
        return None

    def fusible(self, inst: Instruction) -> bool:
        """`is_fusible(inst)`, remembered by class (it reads the instruction's structure and control
        dependencies: an instruction without a class may be an add that becomes a GEMM's epilogue)."""
        number = self.classes.get(inst.id)
        if number is None:
            return is_fusible(inst)
        got = self.fusible_by_class.get(number)
        if got is None:
            got = self.fusible_by_class[number] = is_fusible(inst)
        return got

    def basic_refusal(self, producer: Instruction) -> str | None:
        """What rules a producer out whatever its consumers."""
        if producer is self.comp.root:
            return "the computation's root is never fused as a producer"
        number = self.classes.get(producer.id)  # `fusible`, inline: once per push
        fusible = self.fusible_by_class.get(number) if number is not None else None
        if fusible is None:
            fusible = self.fusible(producer)
        if not fusible and not self.is_triton(producer):
            return f"{producer.opcode} is not fusible"
        if producer.shape.is_tuple:
            return "multi-output producers are not fused"
        if not producer.user_count:
            return "no consumers"
        return None

    def refusal(self, producer: Instruction) -> str | None:
        """Why `producer` cannot be fused into all of its non-bitcast users (XLA's
        CanFuseWithAllNonBitcastUsers), or None."""
        why = self.basic_refusal(producer)
        if why is not None:
            return why
        users = [u for u in producer.users if not _left_out(producer, u)]
        if not users:
            return "only bitcast (or sort) consumers"
        for user in users:
            why = self.can_fuse(producer, user)
            if why:
                return why
        return None

    # ------------------------------------------------------------------ priorities
    def priority(self, producer: Instruction) -> tuple[float, float, float]:
        """(unfused - fused, unfused, fused) in us; -inf when a rule refuses (all consumers or none)."""
        if producer.opcode == "bitcast" and keeps_bit_width(producer):
            return math.inf, 0.0, 0.0
        number = self.classes.get(producer.id)  # `basic_refusal` lets through a fusible class: not asked
        n_users = producer.user_count
        if number is None or self.fusible_by_class.get(number) is not True or not n_users \
                or producer is self.comp.root or producer.shape.is_tuple:
            why = self.basic_refusal(producer)
            if why is not None:
                self.note(producer, False, why)
                return -math.inf, 0.0, 0.0
        if self.memo and n_users <= _MEMO_USERS:
            key = self.priority_key(producer)
            if key is not None:
                got = self.priorities.get(key)
                if got is None:
                    got = self.priorities[key] = self._priority(producer, key)
                    return got[0]
                result, refused = got
                if refused is not None:  # explained again, with this producer's names
                    if refused < 0:
                        self.note(producer, False, "only bitcast (or sort) consumers")
                    else:
                        user = _consumer(producer, refused)
                        why = self.refusals.get(key)
                        self.note(producer, False, self.can_fuse(producer, user) if why is None
                                  else why.replace("\0", "%" + user.name))
                return result
        return self._priority(producer)[0]

    def class_of(self, inst: Instruction) -> int | None:
        """A number standing for all that the rules and the cost model read of `inst` alone (its structure,
        its Profile, its control dependencies), so that the priority of a producer and its users can be
        remembered (`priority_key`); None where that is not known: a transpose the cost model has not read
        yet (its coalescing reads the chain that produces its operand, as it was when first read: the
        value read is in its class), an add that may be a GEMM's epilogue (which reads the dot's users). An
        instruction from the input has the class of its structural key; a fusion made here, the class of
        what it was made of (`fuse_producer`), until `invalidate`."""
        got = self.classes.get(inst.id)
        if got is not None:
            return got
        op = inst.opcode
        traits = None
        if op == "transpose":  # by the coalescing the cost model found when it first timed it
            traits = self.cost.known_read_traits(inst)
            if traits is None:
                return None
        elif op == "add" and any(o.opcode == "dot" for o in inst.operands):
            return None
        try:
            key = (self.keys.of(inst), inst.has_control_dependencies, traits)
            got = self.class_numbers.get(key)
        except TypeError:  # an attribute value that is not hashable even as its parts
            return None
        if got is None:
            got = self.class_numbers[key] = next(_CLASSES)
        self.classes[inst.id] = got
        return got

    def priority_key(self, producer: Instruction) -> tuple | None:
        """What `_priority` reads: the classes of the producer and of each of its users, in order, and which of
        their operands are the same value (each one's `operand_places`, and where in the user the producer
        and each of its operands first are); of a user that is not fusible (the root tuple, a dot), its
        opcode alone; None where a class is not known."""
        uid = producer.id
        head = self.heads.get(uid)
        if head is None:
            head = self.producer_key(producer)
            if head is None:
                return None
        row = self.pair_keys.get(uid)
        if row is None:
            row = self.pair_keys[uid] = {}
        get = row.get
        users = producer.users
        if len(users) == 1:  # most producers: no list to build
            user = users[0]
            part = get(user.id)
            if part is None:
                part = self.user_part(producer, user, row)
                if part is None:
                    return None
            return head[0], head[1], part
        key: list[Any] = list(head)  # never the root: `basic_refusal` refused it
        ids = None  # the producer's and its operands' uids, made at the first user not yet in `row`
        for user in users:
            part = get(user.id)
            if part is None:
                if ids is None:
                    ids = [uid]
                    for o in producer.operands:
                        ids.append(o.id)
                part = self.user_part(producer, user, row, ids)
                if part is None:
                    return None
            key.append(part)
        return tuple(key)

    def producer_key(self, producer: Instruction) -> tuple[int, int] | None:
        """The producer's part of `priority_key`: its class and which of its operands are the same value (kept
        until `invalidate`, as both are)."""
        uid = producer.id
        got = self.heads.get(uid)
        if got is not None:
            return got
        number = self.classes.get(uid)
        if number is None:
            number = self.class_of(producer)
            if number is None:
                return None
        same = self.same.get(uid)
        if same is None:
            same = self.operand_places(producer)[1]
        got = self.heads[uid] = (number, self.part_number(("places", same), True))
        return got

    def part_number(self, part: tuple, fusible: bool) -> int:
        """A number standing for a part of a key (hashed once, not again in every key that holds it):
        positive, negative for the part of a user that is not fusible."""
        got = self.part_numbers.get(part)
        if got is None:
            got = self.part_numbers[part] = (len(self.part_numbers) + 1) * (1 if fusible else -1)
        return got

    def user_part(self, producer: Instruction, user: Instruction, row: dict[int, int],
                  ids: list[int] | None = None) -> int | None:
        """The number of a user's part of `priority_key` (kept in `row`, the producer's row of `pair_keys`): its
        class, which of its operands are the same value, where the producer and each of its operands first are
        in it (a user that is not fusible: its opcode alone); None where its class is not known. `ids`: the
        producer's uid and its operands', where the caller has them."""
        k = user.id
        number = self.classes.get(k)
        if number is None:
            if user.opcode == "add" and any(o.opcode == "dot" for o in user.operands):
                return None  # it may become a GEMM's epilogue (`class_of`)
            fusible = is_fusible(user)
        else:
            fusible = self.fusible_by_class.get(number)
            if fusible is None:
                fusible = self.fusible_by_class[number] = is_fusible(user)
        if not fusible:  # refused by its opcode alone (a sort may be left out of an iota's)
            part = row[k] = self.part_number(("not fusible", user.opcode), False)
            return part
        head = self.heads.get(k)
        if head is None:
            head = self.producer_key(user)  # its class and which of its operands are the same value
            if head is None:
                return None
        got = self.places.get(k)  # `operand_places`, inline
        first = got[1] if got is not None and got[0] == user.edit_stamp else self.operand_places(user)[0]
        if ids is None:
            part = (*head, first.get(producer.id), *[first.get(o.id) for o in producer.operands])  # None: not read
        else:
            part = (*head, *map(first.get, ids))
        number = self.part_numbers.get(part)  # `part_number`, inline
        if number is None:
            number = self.part_numbers[part] = len(self.part_numbers) + 1
        row[k] = number
        return number

    def operand_places(self, inst: Instruction) -> tuple[dict[int, int], tuple[int, ...]]:
        """(operand uid -> where it first is, each operand's first place): which of `inst`'s operands are the same
        value. The map is remembered until the instruction's next edit (an operand replaced by a fusion has
        another uid), the places until `invalidate` (a replacement takes one operand's place: the same values
        stay the same)."""
        got = self.places.get(inst.id)
        if got is not None and got[0] == inst.edit_stamp:
            return got[1], got[2]
        first: dict[int, int] = {}
        places = []  # a loop, not a comprehension: most have one to three operands
        for i, o in enumerate(inst.operands):
            places.append(first.setdefault(o.id, i))
        same = tuple(places)
        self.places[inst.id] = (inst.edit_stamp, first, same)
        self.same[inst.id] = same
        return first, same

    def _priority(self, producer: Instruction, key: tuple | None = None
                  ) -> tuple[tuple[float, float, float], int | None]:
        """`priority` once the basic rules let `producer` through, and which of its non-bitcast users refused
        it (-1: it has none; None: none refused). With its `priority_key`, what a user adds is remembered by
        the pair's part of the key (`pair_memo`): a producer seen with other users, a user with another producer
        of the same class."""
        uid = producer.id
        if self.preferred:
            self.preferred.pop(uid, None)  # decided again below (XLA clears preferred_consumer_ first)
        legal = self.legal.setdefault(uid, {})
        row = self.fused_t.setdefault(uid, {})
        cost = self.cost
        times = cost.times
        p = self.profiles.get(uid) or self.prof(producer)
        unfused = times.get(uid)
        if unfused is None:
            unfused = self.kernel_time(producer)
        fused = 0.0
        n = 0
        iota = producer.opcode == "iota"
        vals = None
        if self.memo:  # what each user adds, kept as `legal` is (a producer every layer reads has hundreds)
            vals = self.pair_vals.get(uid)
            if vals is None:
                vals = self.pair_vals[uid] = {}
        memo = head = parts = None
        if key is not None:
            memo, head = self.pair_memo, key[:2]
        elif vals is not None:  # a producer with many users: the pairs' parts alone
            head = self.producer_key(producer)
            if head is not None:
                memo = self.pair_memo
                parts = self.pair_keys.get(uid)
                if parts is None:
                    parts = self.pair_keys[uid] = {}
        for i, user in enumerate(producer.users):
            k = user.id
            if vals is not None:
                v = vals.get(k)
                if v is not None:
                    if v is not _LEFT_OUT:
                        n += 1
                        unfused += v[0]
                        fused += v[1]
                    continue
            pair = None
            if memo is not None:
                if key is not None:
                    part = key[2 + i]
                else:
                    part = parts.get(k)
                    if part is None:
                        part = self.user_part(producer, user, parts)
                if part is not None and part > 0:  # a fusible user
                    pair = (*head, part)
            if pair is not None:
                v = memo.get(pair)
                if v is not None:  # legal, and what it adds
                    n += 1
                    unfused += v[0]
                    fused += v[1]
                    vals[k] = v
                    continue
            uop = user.opcode
            if (uop == "bitcast" and keeps_bit_width(user)) or (iota and uop == "sort"):  # _left_out, inline
                if vals is not None:
                    vals[k] = _LEFT_OUT
                continue
            n += 1
            why = legal.get(k, _UNKNOWN)
            if why is _UNKNOWN:
                why = legal[k] = self._can_fuse(producer, user)
            if why is not None:
                if self.multi_output_enabled():
                    got = self.multi_output_priority(producer)
                    if got is not None:
                        return got, None
                self.note(producer, False, why)
                if key is not None:  # the reason with a place for the user's name (its only name)
                    name = "%" + user.name
                    if why.count("%") == why.count(name):
                        self.refusals[key] = why.replace(name, "\0")
                return (-math.inf, 0.0, 0.0), n - 1
            t_user = times.get(k)
            if t_user is None:
                t_user = self.kernel_time(user)
            unfused += t_user
            t = row.get(k)
            if t is None:
                t = row[k] = self.fused_time(producer, p, user)
            fused += t
            if vals is not None:
                vals[k] = (t_user, t)
                if pair is not None:
                    memo[pair] = vals[k]
        if not n:
            self.note(producer, False, "only bitcast (or sort) consumers")
            return (-math.inf, 0.0, 0.0), -1
        return (unfused - fused, unfused, fused), None

    def push(self, inst: Instruction) -> None:
        if inst.parent is not self.comp:
            return
        gain, unfused, fused = self.priority(inst)
        uid = inst.id
        live = self.live
        if gain > 0 and live.get(uid) == gain:
            return  # its entry stands: the heap orders entries by (gain, uid) alone, one entry per uid
        self.counter += 1
        self.token[uid] = self.counter
        if gain == -math.inf:
            live.pop(uid, None)
            return
        if gain < 0:
            live.pop(uid, None)
            self.note(inst, False, f"slower if fused (unfused {unfused:.3f} us, fused {fused:.3f} us)", gain)
            return
        live[uid] = gain
        heapq.heappush(self.heap, (-gain, -uid, self.counter, inst))

    def invalidate(self, inst: Instruction) -> None:
        """Forget what was cached about an instruction that changes (as producer and as consumer)."""
        uid = inst.id
        self.profiles.pop(uid, None)
        self.classes.pop(uid, None)
        self.cost.forget(inst)
        self.legal.pop(uid, None)
        self.fused_t.pop(uid, None)
        self.pair_keys.pop(uid, None)
        self.pair_vals.pop(uid, None)
        self.same.pop(uid, None)
        self.heads.pop(uid, None)
        if self.triton_plans:
            for key in [k for k in self.triton_plans if uid in k]:
                del self.triton_plans[key]
                self.triton_us.pop(key, None)
        if self.mof_plans:
            for key in [k for k in self.mof_plans if uid in k]:
                del self.mof_plans[key]
        rows = (self.legal, self.fused_t, self.pair_keys, self.pair_vals)  # per producer, a row per user
        for op in inst.operands:
            oid = op.id
            for table in rows:
                row = table.get(oid)
                if row:
                    row.pop(uid, None)

    # ------------------------------------------------------------------ the loop
    def run(self) -> bool:
        for inst in self.comp.post_order():
            if inst.opcode in _SKIP_NOTES or not inst.user_count:
                continue
            self.push(inst)
        while self.heap:
            neg, _, token, producer = heapq.heappop(self.heap)
            if producer.parent is not self.comp or self.token.get(producer.id) != token:
                continue
            self.live.pop(producer.id, None)  # out of the heap: a push gives it an entry again
            self.fuse_producer(producer, -neg)
        if self.p.fuse_constants:
            self.fuse_small_constants()
        return self.changed

    def fuse_producer(self, producer: Instruction, gain: float) -> None:
        preferred = self.preferred.pop(producer.id, None) if self.preferred else None
        if preferred is not None:
            self.fuse_multi_output(producer, preferred, gain)
            return
        if producer.opcode == "bitcast":
            if producer is self.comp.root or not is_fusible(producer):
                return
            consumers = [u for u in producer.users if u.opcode != "bitcast" and self.can_fuse(producer, u) is None]
        else:
            consumers = []  # a loop, not a comprehension (a function call each in Python 3.11)
            iota = producer.opcode == "iota"
            for u in producer.users:
                op = u.opcode
                if not ((op == "bitcast" and keeps_bit_width(u)) or (iota and op == "sort")):  # `_left_out`, inline
                    consumers.append(u)
        rule = "priority"
        if self.triton:
            consumers = [u for u in consumers
                         if not self.needs_triton_plan(producer, u) or self.recheck(producer, u) is None]
            if any((producer.id, c.id) in self.triton_plans for c in consumers):
                rule = "triton"
        if not consumers:
            return
        verdict = self.check(producer, consumers)
        names = tuple([c.name for c in consumers]) if len(consumers) > 1 else (consumers[0].name,)
        if verdict is not None and verdict.slower:
            self.note(producer, False, f"slower as built ({verdict.describe()})", gain, names, verdict, rule)
            return
        self.note(producer, True, f"{producer.opcode} into all {len(consumers)} consumer(s)",
                  None if math.isinf(gain) else gain, names, verdict, rule)
        fusions = []
        unknown: set[Instruction] = set()  # fusions whose class is their own
        p = None  # the producer's Profile, read where a fusion's is merged (a class not made before)
        p_ops = producer.operands
        c = None
        n = len(consumers)
        for i, consumer in enumerate(consumers):
            c_ops = consumer.operands
            plan = self.triton_plans.get((producer.id, consumer.id)) if self.triton else None
            last = i == n - 1 and producer.user_count == 1
            made = self.made_of(producer, consumer, last) if self.memo else None
            known = self.class_numbers.get(made) if made is not None else None
            if known is None:  # its Profile is merged below: the parts' as they are before the move
                if p is None:
                    p = self.prof(producer)
                c = self.prof(consumer)
                kind = None
            else:
                kind = self.kinds.get(known)  # its fused computation's: by its class
            if consumer.opcode == "fusion":
                self.invalidate(consumer)  # another consumer goes with its uid: nothing reads its caches again
                fusion = consumer
                fuse_producer(fusion, producer, last_use=last, constants=self.p.fuse_constants, run=self.run_state,
                              kind=kind)
            else:
                fusion = fuse_into_new_fusion(producer, consumer, last, self.p.fuse_constants, run=self.run_state,
                                              kind=kind)
            kind_built = fusion.attrs["kind"]  # the builder's, before a Triton plan's
            if plan is not None:
                fusion.attrs["kind"] = "kCustom"
                fusion.set_backend_config_json(plan[0])
            self.cost.forget(fusion)  # its caches as a consumer went with `invalidate(consumer)`
            if made is None:
                self.profiles[fusion.id] = merge_profiles(fusion, producer, p_ops, p, c_ops, c)
                if self.memo:
                    self.classes[fusion.id] = next(_CLASSES)  # a class of its own: its Profile is its history's
                    unknown.add(fusion)
            else:
                number = self.class_numbers.get(made)
                if number is None:
                    number = self.class_numbers[made] = next(_CLASSES)
                    self.merged[number] = merge_profiles(fusion, producer, p_ops, p, c_ops, c)
                if kind is None:
                    self.kinds[number] = kind_built
                self.profiles[fusion.id] = self.merged[number]
                self.classes[fusion.id] = number
            fusions.append(fusion)
        if self.memo and not unknown:
            for fusion in fusions:  # what it was made of (its class) determines its fused computation: no walk
                self.keys.derive(fusion.attrs["calls"], ("priority-fusion", self.classes[fusion.id]))
        elif verdict is not None:
            self.trial.built(fusions, self.p.fuse_constants)  # numbered by what they were built from
        self.changed = True
        if producer.user_count == 0:  # it goes with its uid: nothing reads its caches again
            self.token.pop(producer.id, None)
            self.live.pop(producer.id, None)
            remove_fusion(producer, run=self.run_state)
        else:
            self.invalidate(producer)
        update: dict[Instruction, None] = {}
        classes, fusible_by_class = self.classes, self.fusible_by_class
        for fusion in fusions:
            update[fusion] = None
            for op in fusion.operands:
                if op.opcode in _NOT_PUSHED:
                    continue
                number = classes.get(op.id)  # `fusible`, inline where its class is known
                fusible = fusible_by_class.get(number) if number is not None else None
                if fusible is None:
                    fusible = self.fusible(op)
                if fusible or self.is_triton(op):
                    update[op] = None
        for inst in update:
            self.push(inst)

    def made_of(self, producer: Instruction, consumer: Instruction, last: bool) -> tuple | None:
        """What determines the fusion of `producer` into `consumer` (its fused computation, operands and
        Profile): their classes, which of their operands are the same value (a small constant, which may be
        fused in, with its value), whether the consumer's fused computation has its parameters first already,
        the builder's options; None where a class is not known."""
        number_p, number_c = self.class_of(producer), self.class_of(consumer)
        if number_p is None or number_c is None:
            return None
        index: dict[int, int] = {producer.id: 0}
        key: list[Any] = ["fused", number_p, number_c, last, self.p.fuse_constants,
                          consumer.opcode == "fusion" and consumer.attrs["calls"] in self.run_state.params_first]
        for o in (*producer.operands, *consumer.operands):
            key.append(index.setdefault(o.id, len(index)))
            if o.opcode == "constant" and not o.shape.is_tuple and o.shape.numel <= 1:
                key.append(o.attrs["literal"].text)
        return tuple(key)

    # ------------------------------------------------------------------ Triton multi-output fusion
    def multi_output_enabled(self) -> bool:
        """XLA's xla_gpu_unsupported_enable_triton_multi_output_fusion, where this run grows Triton fusions."""
        p = self.p
        return p.triton_multi_output_fusion and (p.triton_softmax_priority_fusion or p.triton_heroless_priority_fusion)

    def multi_output_plan(self, producer: Instruction, consumer: Instruction) -> tuple[dict[str, Any], float] | str:
        """XLA's CanFuseTriton with use_multi_output_fusion: the pair's multi-output Triton fusion (backend config,
        modeled time with launch) or why not; cached per pair until either changes."""
        key = (producer.id, consumer.id)
        got = self.mof_plans.get(key)
        if got is not None:
            return got
        try:
            plan = triton_fusion_plan(producer, consumer, self.run_state.device,
                                      heroless=self.p.triton_heroless_priority_fusion, multi_output=True)
        except (KeyError, ValueError):  # a device without a GPU spec: no indexing cost model
            plan = f"no GPU spec for {self.run_state.device!r} to tile Triton fusions with"
        got = self.mof_plans[key] = plan if isinstance(plan, str) else (plan[0], plan[1].cost_us + self.cost.launch_us)
        return got

    def reaches_other_operand(self, producer: Instruction, consumer: Instruction) -> bool:
        """Whether another operand of `consumer` is reachable from `producer` along users (XLA's
        OperandReachableFromProducer): fusing them would make a cycle."""
        others = {o for o in consumer.operands if o is not producer}
        if not others:
            return False
        seen: set[Instruction] = set()
        stack = list(producer.users)
        while stack:
            inst = stack.pop()
            if inst in others:
                return True
            if inst in seen or inst is consumer:
                continue
            seen.add(inst)
            stack.extend(inst.users)
        return False

    def multi_output_priority(self, producer: Instruction) -> tuple[float, float, float] | None:
        """XLA's fallback when `producer` cannot fuse into all of its users: with exactly one user it can fuse into
        as a multi-output Triton fusion (FindPossibleConsumersForTritonMultiOutputFusion,
        CanFuseTritonMultiOutputWithSingleUser), (unfused - fused, unfused, fused) for that fusion, the user
        remembered as the producer's preferred consumer; None otherwise."""
        if producer is self.comp.root:
            return None
        candidates = []
        for user in producer.users:
            if user.opcode == "bitcast" and keeps_bit_width(user):
                continue
            if not isinstance(self.multi_output_plan(producer, user), str) \
                    and not self.reaches_other_operand(producer, user):
                candidates.append(user)
        if len(candidates) != 1:
            if candidates:
                self.note(producer, False, "more than one consumer to fuse with as a multi-output Triton fusion")
            return None
        consumer = candidates[0]
        plan = self.multi_output_plan(producer, consumer)
        assert not isinstance(plan, str)
        unfused = self.kernel_time(producer) + self.kernel_time(consumer)
        fused = plan[1]
        self.preferred[producer.id] = consumer
        return unfused - fused, unfused, fused

    def fuse_multi_output(self, producer: Instruction, consumer: Instruction, gain: float) -> None:
        """Fuse `producer` into `consumer` alone, still output from there (XLA's Fuse with
        use_multi_output_fusion): a block-level Triton fusion with a tuple root."""
        if consumer.parent is not self.comp or consumer not in producer.users:
            return
        plan = self.multi_output_plan(producer, consumer)
        if isinstance(plan, str) or self.reaches_other_operand(producer, consumer):
            return
        cfg = plan[0]
        names = (consumer.name,)
        verdict = None
        if self.p.never_slower:
            if self.trial is None:
                self.trial = FusionTrial(self.run_state.device)
            verdict = self.trial.producer_as_output(producer, consumer, cfg)
            if verdict.slower:
                self.note(producer, False, f"slower as built ({verdict.describe()})", gain, names, verdict,
                          "triton multi-output")
                return
        self.note(producer, True, f"{producer.opcode} into %{consumer.name} as a multi-output Triton fusion",
                  None if math.isinf(gain) else gain, names, verdict, "triton multi-output")
        self.invalidate(consumer)
        self.invalidate(producer)
        fusion = consumer if consumer.opcode == "fusion" else wrap_in_fusion(consumer, run=self.run_state)
        fuse_into_multi_output(fusion, producer, run=self.run_state)
        fusion.attrs["kind"] = "kCustom"
        fusion.set_backend_config_json(cfg)
        self.cost.forget(fusion)
        self.profiles.pop(fusion.id, None)
        self.changed = True
        self.token.pop(producer.id, None)
        self.live.pop(producer.id, None)
        if producer.user_count == 0:
            remove_fusion(producer, run=self.run_state)
        update: dict[Instruction, None] = {fusion: None}
        for op in fusion.operands:
            if op.opcode not in _NOT_PUSHED and (is_fusible(op) or self.is_triton(op)):
                update[op] = None
        for inst in update:
            self.push(inst)

    def check(self, producer: Instruction, consumers: list[Instruction]) -> TrialVerdict | None:
        """The never-slower check of fusing `producer` into `consumers` (None: not run, a bitcast producer
        launches nothing and stays a free view)."""
        if not self.p.never_slower or producer.opcode == "bitcast":
            return None
        if self.trial is None:
            self.trial = FusionTrial(self.run_state.device)
        if self.triton:
            plans = [self.triton_plans.get((producer.id, c.id)) for c in consumers]
        else:  # no Triton fusion grows: none
            plans = [None] * len(consumers)
        stays = producer.user_count != len(consumers)  # left-out users (bitcasts)
        key = None
        if self.memo and not any(plans):
            key = self.check_key(producer, consumers[0]) if len(consumers) == 1 \
                and producer.user_count <= _MEMO_USERS else self.parts_key(producer, consumers, stays)
        if key is not None and key[0] is not None:  # no transpose among the parts: all of the check remembered
            got = self.verdicts.get(key)
            if got is None:
                verdict = None if not stays and self.cannot_be_slower(producer, consumers) else \
                    self.trial.producer_into_consumers(producer, consumers, plans, producer_stays=stays)
                got = self.verdicts[key] = (verdict, self.trial.last_number if verdict is not None else None)
            elif got[0] is not None:
                self.trial.answered(got[1])  # what `built` numbers the fusions by
            return got[0]
        if not stays and not any(plans) and self.cannot_be_slower(producer, consumers):
            return None
        if key is None:
            return self.trial.producer_into_consumers(producer, consumers, plans, producer_stays=stays)
        got = self.verdicts.get(key)  # the trial's verdict alone
        if got is None:
            verdict = self.trial.producer_into_consumers(producer, consumers, plans, producer_stays=stays)
            got = self.verdicts[key] = (verdict, self.trial.last_number)
        else:
            self.trial.answered(got[1])
        return got[0]

    def check_key(self, producer: Instruction, consumer: Instruction) -> tuple | None:
        """`parts_key` of `producer` fused into its one consumer, from the producer's `priority_key` (which
        holds the classes of both, which of their operands are the same value and where the producer and its
        operands are in the consumer, so the wiring; and its other users, so whether it stays) and the values of
        the small constants among their operands; it starts with None where a part is a transpose (as
        `parts_key`). None where a class is not known."""
        head = self.priority_key(producer)
        if head is None:
            return None
        key = [None if producer.opcode == "transpose" or consumer.opcode == "transpose" else "check", "one", head]
        for o in (*producer.operands, *consumer.operands):
            key.append(o.attrs["literal"].text if o.opcode == "constant" and not o.shape.is_tuple
                       and o.shape.numel <= 1 else None)
        return tuple(key)

    def parts_key(self, producer: Instruction, consumers: list[Instruction], stays: bool) -> tuple | None:
        """What the never-slower check of `producer` into `consumers` reads (`fusion_trial.parts_key` and the
        move): the parts' classes and where each operand comes from (a part, or the n-th other value, a small
        constant with its value); None where a class is not known. It starts with None where a part is an
        unfused transpose (`cannot_be_slower` reads its operand's producers, the trial reads copies), then
        the key of the trial alone follows."""
        parts = [producer, *consumers]
        key: list[Any] = [None if any(part.opcode == "transpose" for part in parts) else "check", stays]
        for part in parts:
            number = self.class_of(part)
            if number is None:
                return None
            key.append(number)
        index = {part.id: i for i, part in enumerate(parts)}
        for part in parts:
            for o in part.operands:
                key.append(index.setdefault(o.id, len(index)))
                if o.opcode == "constant" and not o.shape.is_tuple and o.shape.numel <= 1:
                    key.append(o.attrs["literal"].text)
            key.append(-1)
        return tuple(key)

    def cannot_be_slower(self, producer: Instruction, consumers: list[Instruction]) -> bool:
        """Whether fusing `producer` into each of `consumers` (all its users) cannot be slower by the analytical
        model, so that the never-slower check need not build it. Each consumer and the producer are loop
        kernels (`cost_model.launch.emitter_kind`) of one output shape (so the same launch dimensions) reading
        coalesced, and each consumer reads each element of the producer once (utilization and emission 1).
        Then a fused kernel's flops are the two's summed on the same lanes, its reads the consumer's less the
        producer's output plus the producer's reads, its write the consumer's; the kernel time
        (`cost_model.kernel.combine` of compute and memory time) is monotone and subadditive in both, so
        each fused kernel takes at most the consumer's time plus the producer's execution, and one launch is
        saved: with k consumers the fusions are not slower when (k - 1) producer executions (the duplicated
        work) take at most half a launch. A chain of elementwise ops growing one fusion (a random number
        generator's rounds) is then judged without rebuilding the fusion at each step."""
        if not self.analytical_model():
            return False  # a user's cost model (`cost_model.register_cost_model`) promises none of this
        shape = producer.shape
        if shape.is_tuple or not self.plain_loop_kernel(producer):
            return False
        for consumer in consumers:
            if consumer.shape != shape or consumer.parent is not producer.parent:
                return False
            uses = [i for i, op in enumerate(consumer.operands) if op is producer]
            if len(uses) != 1:
                return False
            c = self.prof(consumer)
            if c.util[uses[0]] != 1 or c.emitted[uses[0]] != 1 or not self.plain_loop_kernel(consumer):
                return False
        if len(consumers) == 1:
            return True
        launch = float(self.spec.kernel_launch_us)
        return (len(consumers) - 1) * (self.trial.time_us([producer]) - launch) <= 0.5 * launch

    def analytical_model(self) -> bool:
        """Whether the run's device is timed by hlopt's analytical model (a GPU spec, no user model); its spec
        is then `self.spec`."""
        if self.analytical is None:
            device = self.run_state.device
            try:
                self.spec = get_device(device)
                self.analytical = not (isinstance(device, str) and user_cost_model(device) is not None)
            except (KeyError, ValueError, TypeError, OSError):  # no GPU spec: a user's model
                self.analytical = False
        return self.analytical

    def plain_loop_kernel(self, inst: Instruction) -> bool:
        """A loop-emitter kernel whose reads are coalesced (remembered until it or its fused computation is edited)."""
        number = self.classes.get(inst.id) if self.memo and inst.opcode != "transpose" else None
        if number is not None:  # it reads the instruction's structure alone (but a transpose's operand chain)
            got = self.plain_loop_by_class.get(number)
            if got is None:
                got = self.plain_loop_by_class[number] = self._reads_as_plain_loop(inst)
            return got
        comp = inst.attrs.get("calls") if inst.opcode == "fusion" else None
        key = (inst.id, inst.edit_stamp, comp.edit_stamp if comp is not None else 0)
        got = self.plain_loop.get(key)
        if got is None:
            got = self.plain_loop[key] = self._reads_as_plain_loop(inst)
        return got

    def _reads_as_plain_loop(self, inst: Instruction) -> bool:
        """`plain_loop_kernel`, worked out: a kLoop kind, the loop emitter, no minor-dimension transpose."""
        return (str(inst.attrs.get("kind", "kLoop")) == "kLoop" and emitter_kind(inst, self.spec) == "loop"
                and not transposes_minor_dimension(inst))

    def fuse_small_constants(self) -> None:
        """XLA fuses every small (one-element) constant into each fusible user, at the end."""
        for const in list(self.comp.instructions):
            if const.opcode != "constant" or const.shape.is_tuple or const.shape.numel > 1:
                continue
            if const is self.comp.root:
                continue
            for user in list(const.users):
                triton = self.is_triton(user)  # XLA fuses small constants into Triton fusions too (CanFuseTriton)
                if not (is_fusible(user) or triton) or scatter_refusal(const, user) or user.opcode == "bitcast":
                    continue
                fusion = user if user.opcode == "fusion" else wrap_in_fusion(user, run=self.run_state)
                fuse_producer(fusion, const, last_use=const.user_count == 1, run=self.run_state)
                if triton:
                    fusion.attrs["kind"] = "kCustom"
                self.changed = True
            if const.user_count == 0 and const is not self.comp.root:
                self.comp.remove(const)


@register
@dataclass(frozen=True)
class PriorityFusion(FusionPass):
    """Fuse producers into all their consumers, best modeled saving first (see the module docstring)."""

    name: ClassVar[str] = "priority-fusion"
    fuse_constants: bool = True
    #: grow block-level Triton fusions (`__triton`, XLA's SoftmaxRewriterTriton) in the same queue, as XLA's
    #: PriorityFusion does with xla_gpu_experimental_enable_triton_softmax_priority_fusion: a producer fuses
    #: into a Triton consumer, and a Triton producer into its consumers, where the result stays row-tileable
    triton_softmax_priority_fusion: bool = False
    #: XLA's xla_gpu_experimental_enable_triton_heroless_priority_fusion: any producer-consumer pair that is
    #: Triton-supported and can be tiled becomes a block-level Triton fusion (XLA's preferred choice), the other
    #: pairs follow the usual rules; Triton fusions grow as with `triton_softmax_priority_fusion`
    triton_heroless_priority_fusion: bool = False
    #: XLA's xla_gpu_unsupported_enable_triton_multi_output_fusion (with one of the two above): a producer that
    #: cannot fuse into all of its users fuses into the one user it can as a multi-output Triton fusion
    triton_multi_output_fusion: bool = False
    #: deprecated: run the `dot-strength-reduction` pass before this one instead
    reduce_vector_dots: bool = False
    #: deprecated: run the `select-and-scatter-expander` pass before this one instead
    expand_select_and_scatter: bool = False

    def fuse(self, module: Module, run: FusionRun) -> bool:
        """Fuse every fusible computation, callees first."""
        changed = self._deprecated_pre_fusion_rewrites(module, run)
        for comp in fusible_computations(module):
            changed |= _Queue(comp, self, run).run()
        if changed and (self.triton_softmax_priority_fusion or self.triton_heroless_priority_fusion):
            # XLA's fusion pipeline runs CSE on fused computations after its fusion passes: the copies of a value
            # that reached one Triton fusion by several of its users (a row's mean) become one
            run.finish()
            CommonSubexpressionElimination(only_fusion_computations=True).run(module)
        return changed

    def _deprecated_pre_fusion_rewrites(self, module: Module, run: FusionRun) -> bool:
        """The pre-fusion rewrites asked for through the deprecated options, run as their own passes."""
        rewrites = (("reduce_vector_dots", self.reduce_vector_dots, DotStrengthReduction()),
                    ("expand_select_and_scatter", self.expand_select_and_scatter, SelectAndScatterExpander()))
        changed = False
        for option, on, rewrite in rewrites:
            if not on:
                continue
            warnings.warn(f"priority-fusion's {option} option is deprecated: run the {rewrite.name} pass before "
                          "priority-fusion (the `fusion` pipeline does)", DeprecationWarning, stacklevel=2)
            result = rewrite.run_with_result(module)
            run.explanations.extend(result.explanations)
            changed |= result.changed
        return changed
