"""When collective-pipeliner's move pays, by hlopt's cost model (the pass's `cost_model` option).

Per collective `c` of a loop with trip count N, on one compute stream and one collective stream:
- today each iteration exposes `max(0, t_c - independent)`, where `independent` is the compute of the body
  that neither feeds `c` nor reads it (all that can run while `c` is in flight);
- pipelined, each of N-1 iterations exposes `max(0, t_c - (body compute - what c still waits for or feeds))`:
  a backward-pipelined collective (the next iteration's) overlaps everything but its own operand chain, a
  forward-pipelined one (the previous iteration's) everything but its formatting and store; the one copy
  before or after the loop is exposed in full (`t_c`).
The move pays when the pipelined total is smaller. A collective already hidden in its iteration never moves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlopt.hlo.ir import Instruction

if TYPE_CHECKING:
    from hlopt.passes.collective_pipeliner import LoopInfo

__all__ = ["pipelining_pays", "exposure_us"]

_FREE = frozenset({"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "opt-barrier"})
_COLLECTIVE = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                         "collective-broadcast", "ragged-all-to-all"})


def _closure(start: Instruction, step) -> set[Instruction]:  # noqa: ANN001
    seen: set[Instruction] = set()
    work = [start]
    while work:
        for nxt in step(work.pop()):
            if nxt not in seen:
                seen.add(nxt)
                work.append(nxt)
    return seen


def exposure_us(info: LoopInfo, c: Instruction, device: str, forward: bool) -> tuple[float, float, float]:
    """(t_c, exposed per iteration today, exposed per iteration once pipelined), in microseconds."""
    from hlopt.cost_model import get_cost_model

    model = get_cost_model(device)
    t_c = model.node_time_us(c)
    before, after = _closure(c, lambda x: x.operands), _closure(c, lambda x: x.users)
    chain = before | after | {c}
    still_tied = after if forward else before
    compute = {x: model.node_time_us(x) for x in info.body.instructions
               if x.opcode not in _FREE and x.opcode not in _COLLECTIVE}
    total = sum(compute.values())
    independent = sum(t for x, t in compute.items() if x not in chain)
    own = sum(t for x, t in compute.items() if x in still_tied)
    return t_c, max(0.0, t_c - independent), max(0.0, t_c - (total - own))


def pipelining_pays(info: LoopInfo, c: Instruction, device: str, forward: bool) -> bool:
    """Whether pipelining `c` across the iterations of `info`'s loop lowers the modelled loop time."""
    t_c, now, pipelined = exposure_us(info, c, device, forward)
    if now <= 0.0:
        return False
    n = info.range.trip_count
    return t_c + (n - 1) * pipelined < n * now
