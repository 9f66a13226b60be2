"""priority-fusion: producer-consumer fusion ordered by the time the cost model says it saves.

After XLA:GPU's PriorityFusion, simplified. Before:
    %a = f32[N] add(%x, %y)
    %t = f32[N] tanh(%a)
    %r = f32[M] reduce(%t, %zero), dimensions={1}, to_apply=%sum
After:
    %fused_computation { ... add ... tanh ... reduce ... }
    %r = f32[M] fusion(%x, %y, %zero), kind=kInput, calls=%fused_computation

Each candidate producer has a priority = (unfused time - fused time) from `cost_model`, kernel launches
included; a heap pops the best one, it is fused into all of its consumers (or none), and its
neighbours are re-costed. Rules, as XLA's: dot, convolution, custom-call, collectives,
while/conditional/call, parameters, tuples, side-effecting ops and the computation's root never fuse as
producers; reductions, scatters and sorts only as consumers; a producer with transcendentals is not
duplicated into several consumers; a fusion has at most 96 operands and outputs, one reduction and a
bounded number of instructions. Kinds: kInput for reductions, scatters, transposes and concatenates,
kLoop otherwise. `explanations` records why each candidate was taken or refused.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import ClassVar

from hlo.ir import Computation, Instruction, Module
from hlo.opcodes import ELEMENTWISE
from passes.base import ModulePass, non_fusion_computations
from passes.registry import register

__all__ = ["PriorityFusion", "fuse_into", "FUSIBLE"]

#: Instructions that may take part in a loop/input fusion.
FUSIBLE = ELEMENTWISE | {
    "broadcast", "reshape", "bitcast", "transpose", "slice", "concatenate", "pad", "iota", "constant",
    "reduce", "reduce-window", "dynamic-slice", "dynamic-update-slice", "gather", "scatter", "reverse",
    "fusion",
}
_CONSUMER_ONLY = frozenset({"reduce", "reduce-window", "scatter", "dynamic-update-slice"})
_INPUT_HEROES = frozenset({"reduce", "reduce-window", "scatter", "transpose", "concatenate"})
MAX_OPERANDS_AND_OUTPUTS = 96
MAX_FUSED_INSTRUCTIONS = 200


def _fused_comp(inst: Instruction) -> Computation | None:
    return inst.attrs.get("calls") if inst.opcode == "fusion" else None


def _fused_opcodes(inst: Instruction) -> list[str]:
    comp = _fused_comp(inst)
    return [i.opcode for i in comp.instructions] if comp is not None else [inst.opcode]


_EXPENSIVE = frozenset({"exponential", "log", "tanh", "power", "sine", "cosine", "rsqrt", "sqrt", "erf", "logistic",
                        "exponential-minus-one", "log-plus-one", "atan2", "tan", "cbrt"})


def _summary(inst: Instruction, cache: dict) -> tuple[int, int, bool, bool]:
    """(instructions, reductions, has transcendental, consumer-only) of an instruction or fusion, cached."""
    got = cache.get(inst)
    if got is None:
        ops = _fused_opcodes(inst)
        got = cache[inst] = (len(ops), sum(op in ("reduce", "reduce-window") for op in ops),
                             any(op in _EXPENSIVE for op in ops), any(op in _CONSUMER_ONLY for op in ops))
    return got


def _is_fusible(inst: Instruction) -> bool:
    if inst.opcode not in FUSIBLE or inst.shape.is_tuple or inst.has_side_effect:
        return False
    if inst.opcode == "fusion":
        return str(inst.get("kind")) in ("kLoop", "kInput") and not inst.shape.is_tuple
    if inst.opcode == "constant":
        return inst.shape.numel <= 1
    return not inst.control_predecessors and not inst.control_successors


def _kind(opcodes: list[str]) -> str:
    return "kInput" if any(op in _INPUT_HEROES for op in opcodes) else "kLoop"


# ----------------------------------------------------------------------------- building fusions


def _wrap_in_fusion(comp: Computation, inst: Instruction) -> Instruction:
    """Turn a lone instruction into a fusion of one instruction."""
    module = comp.module
    fused = Computation(module.unique_name("fused_computation"))
    params: dict[Instruction, Instruction] = {}
    new_ops = []
    for op in inst.operands:
        if op not in params:
            p = Instruction("parameter", op.shape, name=module.unique_name(f"param_{len(params)}"),
                            parameter_number=len(params))
            fused.add(p)
            params[op] = p
        new_ops.append(params[op])
    body = inst.clone(name=module.unique_name(inst.name), operands=new_ops)
    fused.add(body)
    fused.root = body
    module.add_computation(fused, before=comp)
    fusion = Instruction("fusion", inst.shape, list(params), name=module.unique_name("fusion"),
                         kind=_kind([inst.opcode]), calls=fused)
    if inst.metadata is not None:
        fusion.metadata = inst.metadata.copy()
    comp.add(fusion, before=inst)
    inst.replace_all_uses_with(fusion)
    if comp.root is inst:
        comp.root = fusion
    comp.remove(inst)
    return fusion


def _fused_parameter_for(fusion: Instruction, value: Instruction) -> Instruction:
    """The fused computation's parameter bound to `value`, added if missing."""
    fused = fusion.attrs["calls"]
    for i, op in enumerate(fusion.operands):
        if op is value:
            return fused.parameter(i)
    n = fusion.operand_count
    p = Instruction("parameter", value.shape, name=fusion.parent.module.unique_name(f"param_{n}"),
                    parameter_number=n)
    fused.add(p, before=fused.instructions[0] if len(fused) else None)
    fusion.add_operand(value)
    return p


def _remove_fused_parameter(fusion: Instruction, index: int) -> None:
    fused = fusion.attrs["calls"]
    param = fused.parameter(index)
    fused.remove(param)
    fusion.remove_operand(index)
    for p in fused.parameters:
        n = p.attrs["parameter_number"]
        if n > index:
            p.attrs["parameter_number"] = n - 1
    fused._reindex_parameters()


def fuse_into(producer: Instruction, consumer: Instruction) -> Instruction:
    """Fuse `producer` into `consumer` (wrapping the consumer in a fusion first); returns the fusion."""
    comp = consumer.parent
    fusion = consumer if consumer.opcode == "fusion" else _wrap_in_fusion(comp, consumer)
    fused = fusion.attrs["calls"]
    index = next(i for i, op in enumerate(fusion.operands) if op is producer)
    target = fused.parameter(index)
    if producer.opcode == "fusion":
        inner = producer.attrs["calls"]
        mapping: dict[Instruction, Instruction] = {}
        for inst in inner.instructions:
            if inst.opcode == "parameter":
                mapping[inst] = _fused_parameter_for(fusion, producer.operand(inst.attrs["parameter_number"]))
                continue
            clone = inst.clone(name=comp.module.unique_name(inst.name), operands=[mapping[o] for o in inst.operands])
            fused.add(clone, before=_first_non_parameter(fused))
            mapping[inst] = clone
        new_value = mapping[inner.root]
    else:
        ops = [_fused_parameter_for(fusion, op) for op in producer.operands]
        new_value = producer.clone(name=comp.module.unique_name(producer.name), operands=ops)
        fused.add(new_value, before=_first_non_parameter(fused))
    target.replace_all_uses_with(new_value)
    if fused.root is target:
        fused.root = new_value
    _remove_fused_parameter(fusion, index)
    fusion.attrs["kind"] = _kind(_fused_opcodes(fusion))
    fused.make_topological()
    return fusion


def _first_non_parameter(fused: Computation) -> Instruction | None:
    for inst in fused.instructions:
        if inst.opcode != "parameter":
            return inst
    return None


# ----------------------------------------------------------------------------- the pass


@dataclass
class _Candidate:
    priority: float
    version: int
    producer: Instruction = field(compare=False)


@register
@dataclass(frozen=True)
class PriorityFusion(ModulePass):
    """Fuse producers into consumers, best modeled saving first (see the module docstring)."""

    name: ClassVar[str] = "priority-fusion"
    device: str = "h100"
    max_operands: int = MAX_OPERANDS_AND_OUTPUTS
    max_fused_instructions: int = MAX_FUSED_INSTRUCTIONS
    max_consumers: int = 64
    explanations: list = field(default_factory=list, compare=False, hash=False, repr=False)

    def explain_lines(self) -> list[str]:
        """Why each candidate was taken or refused (for `hlopt opt --explain`)."""
        return list(self.explanations)

    def run(self, module: Module) -> bool:
        from cost_model import get_cost_model

        model = get_cost_model(self.device)
        changed = False
        embedded = _embedded_computations(module)
        for comp in non_fusion_computations(module):
            if comp in embedded:
                continue
            changed |= self._fuse_computation(comp, model)
        return changed

    def refusal(self, producer: Instruction, cache: dict | None = None) -> str | None:
        """Why `producer` cannot fuse into its consumers (None if it can)."""
        cache = {} if cache is None else cache
        comp = producer.parent
        if producer is comp.root:
            return "the computation's root"
        if not _is_fusible(producer):
            return f"{producer.opcode} is not fusible"
        p_size, p_reductions, p_expensive, p_consumer_only = _summary(producer, cache)
        if p_consumer_only:
            return "reductions, scatters and in-place updates fuse only as consumers"
        users = producer.users
        if not users:
            return "no consumers"
        if len(users) > self.max_consumers:
            return f"{len(users)} consumers (more than {self.max_consumers})"
        if len(users) > 1 and p_expensive:
            return "expensive producer would be duplicated into several consumers"
        n_producer_ops = len(set(producer.operands))
        for user in users:
            if not _is_fusible(user):
                return f"consumer %{user.name} ({user.opcode}) is not fusible"
            if user.control_predecessors or user.control_successors:
                return f"consumer %{user.name} has control dependencies"
            n_ops = user.operand_count + n_producer_ops
            if n_ops > self.max_operands:
                return f"fusing into %{user.name} would need {n_ops} operands and outputs"
            u_size, u_reductions, _, _ = _summary(user, cache)
            if u_size + p_size > self.max_fused_instructions:
                return f"fusing into %{user.name} would make a fusion of {u_size + p_size} instructions"
            if u_reductions + p_reductions > 1:
                return f"fusing into %{user.name} would put {u_reductions + p_reductions} reductions in one fusion"
        return None

    def priority(self, producer: Instruction, model) -> float:
        """Modeled time saved by fusing `producer` into all its consumers (us)."""
        launch = model.device.kernel_launch_us
        out_bytes = max(producer.shape.byte_size, 0)
        in_bytes = sum(max(op.shape.byte_size, 0) for op in set(producer.operands))
        bw = model.device.hbm_bandwidth
        n = producer.user_count
        t_producer = model.instruction_time(producer).time_us
        # Fused: no launch and no write of the producer; each consumer reads the producer's inputs
        # instead of its output, and recomputes its flops.
        extra_read = n * in_bytes - n * out_bytes
        recompute = (n - 1) * max(t_producer - launch, 0.0) * 0.25
        return t_producer + out_bytes / bw * 1e6 - max(extra_read, 0) / bw * 1e6 - recompute

    def _fuse_computation(self, comp: Computation, model) -> bool:
        version: dict[Instruction, int] = {}
        heap: list[tuple[float, int, int, Instruction]] = []
        noted: set[str] = set()
        cache: dict[Instruction, tuple] = {}
        counter = 0

        def push(inst: Instruction) -> None:
            nonlocal counter
            if inst.parent is not comp:
                return
            version[inst] = version.get(inst, 0) + 1
            why = self.refusal(inst, cache)
            if why is not None:
                note = f"refused %{inst.name}: {why}"
                if note not in noted and inst.opcode not in ("parameter", "get-tuple-element", "tuple"):
                    noted.add(note)
                    self.explanations.append(note)
                return
            counter += 1
            heapq.heappush(heap, (-self.priority(inst, model), counter, version[inst], inst))

        for inst in comp.instructions:
            push(inst)
        changed = False
        while heap:
            neg, _, ver, producer = heapq.heappop(heap)
            if producer.parent is not comp or version.get(producer) != ver:
                continue
            why = self.refusal(producer, cache)
            if why is not None:
                self.explanations.append(f"refused %{producer.name}: {why}")
                continue
            if -neg <= 0:
                self.explanations.append(f"refused %{producer.name}: modeled gain {-neg:.3f} us <= 0")
                continue
            consumers = list(producer.users)
            self.explanations.append(f"fused %{producer.name} ({producer.opcode}) into "
                                     f"{', '.join('%' + c.name for c in consumers)}: modeled gain {-neg:.3f} us")
            operands = list(producer.operands)
            fusions = [fuse_into(producer, c) for c in consumers]
            comp.remove(producer)
            for f in fusions:
                cache.pop(f, None)
            changed = True
            for x in operands + fusions + [u for f in fusions for u in f.users]:
                push(x)
            for f in fusions:
                for op in f.operands:
                    push(op)
        return changed


def _embedded_computations(module: Module) -> set[Computation]:
    """Computations applied per element (reduce/sort/scatter/map/all-reduce to_apply): never fused."""
    out: set[Computation] = set()
    for inst in module.instructions():
        if inst.opcode in ("reduce", "reduce-window", "sort", "scatter", "select-and-scatter", "map", "all-reduce",
                           "reduce-scatter", "all-reduce-start"):
            out.update(inst.called_computations)
    return out
