"""while-loop-all-reduce-code-motion on chained and summed all-reduces, and on a reversed scan's index.

XLA matches each all-reduce once per run: of `all-reduce(all-reduce(x))` stored or accumulated in a loop it moves
the last one and keeps the first in the loop (`repeat=false` reproduces that). hlopt repeats by default, so the
whole chain leaves the loop. `add(all-reduce(a), all-reduce(b))` is reassociated first into
`all-reduce(add(a, b))` (XLA:GPU's all-reduce-reassociate runs right before the pass). Structure only, no jax:
tests/test_wlarcm_vs_xla.py runs these modules before and after on XLA:CPU.
"""

from __future__ import annotations

import pytest
from hlopt.hlo.ir import Computation, Module
from hlopt.passes.framework.registry import create_pass

from hlopt import hlo

PASS = "while-loop-all-reduce-code-motion"
G4 = "replica_groups={{0,1,2,3}}"


def module(state: list[str], body: str, ret: list[str], trip: int = 8) -> str:
    """A replica_count=4 module: one while over (s32[] i, *state); `%v{k}` reads slot k in the body, `%x{k}`
    is entry parameter k (slot k + 1)."""
    shapes = ["s32[]", *state]
    st = "(" + ", ".join(shapes) + ")"
    gtes = "\n".join(f"  %v{k} = {t} get-tuple-element(%p), index={k}" for k, t in enumerate(shapes))
    params = "\n".join(f"  %x{k} = {t} parameter({k})" for k, t in enumerate(state))
    init = ", ".join(f"%x{k}" for k in range(len(state)))
    return f"""HloModule m, replica_count=4

%sum (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}}

%cond (cp: {st}) -> pred[] {{
  %cp = {st} parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %n = s32[] constant({trip})
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}}

%body (p: {st}) -> {st} {{
  %p = {st} parameter(0)
{gtes}
  %one = s32[] constant(1)
  %next = s32[] add(%v0, %one)
{body}
  ROOT %t = {st} tuple(%next, {", ".join(ret)})
}}

ENTRY %main {{
{params}
  %zero = s32[] constant(0)
  %init = {st} tuple(%zero, {init})
  ROOT %w = {st} while(%init), condition=%cond, body=%body
}}
"""


#: a per-step value reduced twice and stored at the step's index (jax: `ys = psum(psum(loss))` in a scan)
CHAIN_DUS = module(["f32[4]", "f32[8]"], f"""  %sn = f32[4] sine(%v1)
  %loc = f32[] reduce(%sn, f32[] constant(0)), dimensions={{0}}, to_apply=%sum
  %ar1 = f32[] all-reduce(%loc), {G4}, to_apply=%sum
  %ar2 = f32[] all-reduce(%ar1), {G4}, to_apply=%sum
  %upd = f32[1] reshape(%ar2)
  %dus = f32[8] dynamic-update-slice(%v2, %upd, %v0)""", ["%sn", "%dus"])

#: a gradient reduced twice and accumulated (jax, check_vma=False: the gradient of a psum'ed loss, psum'ed again)
CHAIN_ACC = module(["f32[8]", "f32[8]"], f"""  %g = f32[8] sine(%v1)
  %ar1 = f32[8] all-reduce(%g), {G4}, to_apply=%sum
  %ar2 = f32[8] all-reduce(%ar1), {G4}, to_apply=%sum
  %acc = f32[8] add(%ar2, %v2)""", ["%g", "%acc"])

#: a gradient reduced, then reduce-scattered, and accumulated (a chain in front of the reduce-scatter form)
CHAIN_RS = module(["f32[8]", "f32[2]"], f"""  %g = f32[8] sine(%v1)
  %ar1 = f32[8] all-reduce(%g), {G4}, to_apply=%sum
  %rs = f32[2] reduce-scatter(%ar1), {G4}, dimensions={{0}}, to_apply=%sum
  %acc = f32[2] add(%rs, %v2)""", ["%v1", "%acc"])

#: two gradients psum'ed with jax's channel_id=1 each and accumulated (benchmarks' "pytree gradients")
TWO_GRADIENTS = module(["f32[8]", "f32[8]", "f32[8]"], f"""  %ga = f32[8] sine(%v1)
  %gb = f32[8] cosine(%v1)
  %ara = f32[8] all-reduce(%ga), channel_id=1, {G4}, use_global_device_ids=true, to_apply=%sum
  %arb = f32[8] all-reduce(%gb), channel_id=1, {G4}, use_global_device_ids=true, to_apply=%sum
  %acca = f32[8] add(%ara, %v2)
  %accb = f32[8] add(%arb, %v3)""", ["%v1", "%acca", "%accb"])


def summed(groups_b: str = G4, extra: str = "", ret_extra: str = "") -> str:
    """A gradient summed from two reduced contributions (a weight used twice, as in a layer norm's gain)."""
    state = ["f32[8]", "f32[8]"] + (["f32[8]"] if ret_extra else [])
    return module(state, f"""  %ga = f32[1,8] reshape(f32[8] sine(%v1))
  %gb = f32[8] cosine(%v1)
  %ara = f32[1,8] all-reduce(%ga), {G4}, to_apply=%sum
  %arb = f32[8] all-reduce(%gb), {groups_b}, to_apply=%sum
  %ra = f32[8] reshape(%ara)
  %s = f32[8] add(%ra, %arb){extra}
  %acc = f32[8] add(%s, %v2)""", ["%v1", "%acc"] + ([ret_extra] if ret_extra else []))


#: the backward scan of a 3-layer model: layer gradients stored at index (3 - i) - 1, as jax writes it
REVERSED_DUS = module(["f32[4]", "f32[3,4]"], f"""  %sn = f32[4] sine(%v1)
  %ar = f32[4] all-reduce(%sn), {G4}, to_apply=%sum
  %upd = f32[1,4] reshape(%ar)
  %three = s32[] constant(3)
  %rev = s32[] subtract(%three, %v0)
  %idx = s32[] subtract(%rev, %one)
  %c0 = s32[] constant(0)
  %dus = f32[3,4] dynamic-update-slice(%v2, %upd, %idx, %c0)""", ["%sn", "%dus"], trip=3)


def run(text: str, **options: object) -> tuple[Module, bool]:
    """The module after the pass (verified), and the pass's `changed`."""
    m = hlo.parse(text)
    changed = create_pass(PASS, **options).run(m)
    hlo.verify(m)
    return m, changed


def all_reduces(comp: Computation) -> list:
    return [i for i in comp.instructions if i.opcode == "all-reduce"]


def body_of(m: Module) -> Computation:
    return next(i for i in m.instructions() if i.opcode == "while").attrs["body"]


@pytest.mark.parametrize("text", [CHAIN_DUS, CHAIN_ACC], ids=["dus", "accumulation"])
def test_chain_leaves_the_loop_whole(text):
    m, changed = run(text)
    assert changed and not all_reduces(body_of(m)) and len(all_reduces(m.entry)) == 2


@pytest.mark.parametrize("text", [CHAIN_DUS, CHAIN_ACC], ids=["dus", "accumulation"])
def test_one_round_moves_the_last_all_reduce_as_xla(text):
    m, changed = run(text, repeat=False)
    (kept,) = all_reduces(body_of(m))
    assert changed and kept.name == "ar1" and len(all_reduces(m.entry)) == 1


def test_dus_chain_composes_in_order_after_the_loop():
    m, _ = run(CHAIN_DUS)
    first, second = sorted(all_reduces(m.entry), key=lambda i: m.entry.instructions.index(i))
    assert second.operand(0) is first or second.operand(0).operand(0) is first  # ar2(ar1(buffer)) after the loop


def test_summed_all_reduces_are_reassociated_then_moved():
    m, changed = run(summed())
    assert changed and not all_reduces(body_of(m))
    (ar,) = all_reduces(m.entry)
    assert ar.shape.dims == (8,)
    add = next(i for i in body_of(m).instructions if i.name == "s")
    assert {o.opcode for o in add.operands} == {"reshape", "cosine"}  # add(reshape(ga), gb): unreduced


def test_without_reassociation_neither_summed_all_reduce_moves():
    m, changed = run(summed(), reassociate=False)
    assert not changed and len(all_reduces(body_of(m))) == 2


@pytest.mark.parametrize("variant", ["other_groups", "other_user"])
def test_reassociation_refusals(variant):
    text = summed(groups_b="replica_groups={{0,1},{2,3}}") if variant == "other_groups" else \
        summed(extra="\n  %keep = f32[8] negate(%arb)", ret_extra="%keep")
    m, _ = run(text)
    assert len(all_reduces(body_of(m))) == 2


def test_reversed_scan_index_is_the_induction_variable():
    m, changed = run(REVERSED_DUS)
    assert changed and not all_reduces(body_of(m))
    (ar,) = all_reduces(m.entry)
    assert ar.shape.dims == (3, 4)


def test_chain_in_front_of_a_reduce_scatter_leaves_the_loop_whole():
    m, changed = run(CHAIN_RS, enable_reduce_scatter=True)
    assert changed and not all_reduces(body_of(m))
    assert not [i for i in body_of(m).instructions if i.opcode == "reduce-scatter"]
    (ar,) = all_reduces(m.entry)
    (rs,) = [i for i in m.entry.instructions if i.opcode == "reduce-scatter"]
    assert ar.shape.dims == (8,) and rs.shape.dims == (2,)


def test_chain_in_front_of_a_reduce_scatter_one_round_moves_the_reduce_scatter():
    m, changed = run(CHAIN_RS, enable_reduce_scatter=True, repeat=False)
    (kept,) = all_reduces(body_of(m))
    assert changed and kept.name == "ar1" and [i.opcode for i in m.entry.instructions].count("reduce-scatter") == 1


def test_each_moved_all_reduce_takes_its_own_channel_id():
    # jaxlib 0.10.2's XLA:GPU, after its while-loop-all-reduce-code-motion on two psum'ed gradients (channel_id=1
    # both): channel_id=2 and channel_id=3 after the loop
    m, _ = run(TWO_GRADIENTS)
    assert sorted(i.attrs["channel_id"] for i in all_reduces(m.entry)) == [2, 3]
    kept, _ = run(TWO_GRADIENTS, unique_channel_ids=False)  # XLA's source and unit tests: the loop's id
    assert sorted(i.attrs["channel_id"] for i in all_reduces(kept.entry)) == [1, 1]


def test_chain_copies_take_distinct_channel_ids():
    m, _ = run(CHAIN_ACC.replace(f"{G4},", f"channel_id=1, {G4}, use_global_device_ids=true,"))
    ids = [i.attrs["channel_id"] for i in all_reduces(m.entry)]
    assert len(ids) == 2 and len(set(ids)) == 2 and 1 not in ids
