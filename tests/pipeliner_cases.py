"""Small loop modules for collective-pipeliner (one per form, plus ones it must leave alone), shared by the
structure tests and the numerics tests. Four replicas, one group."""

from __future__ import annotations

G = "replica_groups={{0,1,2,3}}"

REDUCER = """
%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}
"""


def loop(name: str, state: list[str], body: str, ret: list[str], *, trip: int | str = 4, start: int = 0,
         step: int = 1, direction: str = "LT", cond_bound: str | None = None) -> str:
    """A module whose entry runs one while over (s32[] i, *state) from entry parameters `%x1..`: `%v{k}` reads
    slot k in the body, `ret` are the body's new values of slots 1.. (slot 0 steps by `step`)."""
    shapes = ["s32[]", *state]
    st = "(" + ", ".join(shapes) + ")"
    gtes = "\n".join(f"  %v{k} = {t} get-tuple-element(%p), index={k}" for k, t in enumerate(shapes))
    params = "\n".join(f"  %x{k} = {t} parameter({k - 1})" for k, t in enumerate(shapes) if k)
    bound = cond_bound or f"  %n = s32[] constant({trip})"
    init = ", ".join(f"%x{k}" for k in range(1, len(shapes)))
    return f"""HloModule {name}, replica_count=4
{REDUCER}
%cond (cp: {st}) -> pred[] {{
  %cp = {st} parameter(0)
  %c0 = s32[] get-tuple-element(%cp), index=0
{bound}
  ROOT %lt = pred[] compare(%c0, %n), direction={direction}
}}

%body (p: {st}) -> {st} {{
  %p = {st} parameter(0)
{gtes}
  %zero = s32[] constant(0)
  %inc = s32[] constant({step})
  %next = s32[] add(%v0, %inc)
{body}
  ROOT %t = {st} tuple(%next, {", ".join(ret)})
}}

ENTRY %main ({", ".join(f"x{k}: {t}" for k, t in enumerate(shapes) if k)}) -> {st} {{
{params}
  %start = s32[] constant({start})
  %init = {st} tuple(%start, {init})
  ROOT %w = {st} while(%init), condition=%cond, body=%body
}}
"""


#: forward: a reduce-scatter of each layer's gradient stored into the stacked gradient
FORWARD_RS = loop("forward_rs", ["f32[4,8]", "f32[4,2]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %g = f32[8] multiply(%r, %r)
  %rs = f32[2] reduce-scatter(%g), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"])

#: forward: an all-reduce stored at N-1-i (a backward scan's order), through a transpose and a reshape
FORWARD_AR = loop("forward_ar", ["f32[4,2,4]", "f32[4,4,2]"], f"""  %three = s32[] constant(3)
  %rev = s32[] subtract(%three, %v0)
  %ds = f32[1,2,4] dynamic-slice(%v1, %rev, %zero, %zero), dynamic_slice_sizes={{1,2,4}}
  %r = f32[2,4] reshape(%ds)
  %g = f32[2,4] tanh(%r)
  %ar = f32[2,4] all-reduce(%g), {G}, to_apply=%sum
  %tr = f32[4,2] transpose(%ar), dimensions={{1,0}}
  %rr = f32[1,4,2] reshape(%tr)
  %dus = f32[4,4,2] dynamic-update-slice(%v2, %rr, %rev, %zero, %zero)""", ["%v1", "%dus"])

#: backward: each layer's weight shard all-gathered before its first use
BACKWARD_AG = loop("backward_ag", ["f32[4,2]", "f32[8]"], """  %ds = f32[1,2] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={1,2}
  %r = f32[2] reshape(%ds)
  %ag = f32[8] all-gather(%r), replica_groups={{0,1,2,3}}, dimensions={0}
  %y = f32[8] multiply(%v2, %ag)
  %h = f32[8] tanh(%y)""", ["%v1", "%h"])

#: backward through an optimization barrier (what remat emits): the shard and the activation pass a barrier
BACKWARD_BARRIER = loop("backward_barrier", ["f32[4,2]", "f32[8]"], """  %ds = f32[1,2] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={1,2}
  %r = f32[2] reshape(%ds)
  %tb = (f32[8], f32[2]) tuple(%v2, %r)
  %ob = (f32[8], f32[2]) opt-barrier(%tb)
  %xb = f32[8] get-tuple-element(%ob), index=0
  %rb = f32[2] get-tuple-element(%ob), index=1
  %ag = f32[8] all-gather(%rb), replica_groups={{0,1,2,3}}, dimensions={0}
  %y = f32[8] multiply(%xb, %ag)
  %h = f32[8] tanh(%y)""", ["%v1", "%h"])

#: forward-sink: every iteration's all-reduce fills slice i of a buffer of trip-count slices
SINK_AR = loop("sink_ar", ["f32[4,8]", "f32[4,8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %g = f32[8] exponential(%r)
  %ar = f32[8] all-reduce(%g), {G}, to_apply=%sum
  %rr = f32[1,8] reshape(%ar)
  %dus = f32[4,8] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"])

#: the same loops with a trip count of 1 (never pipelined) and 2 (the smallest XLA pipelines)
FORWARD_RS_TRIP1 = FORWARD_RS.replace("constant(4)", "constant(1)")
FORWARD_RS_TRIP2 = FORWARD_RS.replace("constant(4)", "constant(2)")
BACKWARD_AG_TRIP1 = BACKWARD_AG.replace("constant(4)", "constant(1)")

#: a trip count that is not known (the bound is a loop slot)
UNKNOWN_TRIP = loop("unknown_trip", ["f32[4,8]", "f32[4,2]", "s32[]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %rs = f32[2] reduce-scatter(%r), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus", "%v3"],
                    cond_bound="  %n = s32[] get-tuple-element(%cp), index=3")

#: not pipelinable: the buffer is also read in the body (the store cannot wait an iteration)
BUFFER_READ = loop("buffer_read", ["f32[4,8]", "f32[4,2]", "f32[4,2]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %rs = f32[2] reduce-scatter(%r), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %v0, %zero)
  %seen = f32[4,2] add(%v2, %v3)""", ["%v1", "%dus", "%seen"])

#: not pipelinable: the reduced value is used by the iteration itself (not only stored)
RESULT_USED = loop("result_used", ["f32[4,8]", "f32[4,8]", "f32[8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %ar = f32[8] all-reduce(%r), {G}, to_apply=%sum
  %rr = f32[1,8] reshape(%ar)
  %dus = f32[4,8] dynamic-update-slice(%v2, %rr, %v0, %zero)
  %acc = f32[8] add(%v3, %ar)""", ["%v1", "%dus", "%acc"])

#: not pipelinable backward: the all-gather reads a value the loop changes (the next one is not known yet)
VARIANT_AG = loop("variant_ag", ["f32[2]", "f32[8]"], """  %th = f32[2] tanh(%v1)
  %ag = f32[8] all-gather(%th), replica_groups={{0,1,2,3}}, dimensions={0}
  %y = f32[8] multiply(%v2, %ag)""", ["%th", "%y"])

#: (name, text, pass options) of every module the pass rewrites
PIPELINED = [
    ("forward_rs", FORWARD_RS, {"direction": "forward", "op": ("reduce-scatter",)}),
    ("forward_rs_trip2", FORWARD_RS_TRIP2, {"direction": "forward", "op": ("reduce-scatter",)}),
    ("forward_ar", FORWARD_AR, {"direction": "forward", "op": ("all-reduce",)}),
    ("backward_ag", BACKWARD_AG, {"direction": "backward", "op": ("all-gather",)}),
    ("backward_barrier", BACKWARD_BARRIER, {"direction": "backward", "op": ("all-gather",)}),
    ("sink_ar", SINK_AR, {"direction": "forward-sink", "op": ("all-reduce",)}),
]

#: (name, text, pass options) of modules the pass must leave alone
LEFT_ALONE = [
    ("trip1_forward", FORWARD_RS_TRIP1, {"direction": "forward", "op": ("reduce-scatter",)}),
    ("trip1_backward", BACKWARD_AG_TRIP1, {"direction": "backward", "op": ("all-gather",)}),
    ("unknown_trip", UNKNOWN_TRIP, {"direction": "forward", "op": ("reduce-scatter",)}),
    ("buffer_read", BUFFER_READ, {"direction": "forward", "op": ("reduce-scatter",)}),
    ("result_used", RESULT_USED, {"direction": "forward", "op": ("all-reduce",)}),
    ("result_used_sink", RESULT_USED, {"direction": "forward-sink", "op": ("all-reduce",)}),
    ("variant_ag", VARIANT_AG, {"direction": "backward", "op": ("all-gather",)}),
    ("wrong_kind", FORWARD_RS, {"direction": "forward", "op": ("all-reduce",)}),
    ("sink_wrong_kind", FORWARD_RS, {"direction": "forward-sink", "op": ("all-reduce",)}),
]

#: forward, with a loop slot whose entry value the body never reads (an entry parameter left without users)
FORWARD_UNREAD_SLOT = loop("forward_unread_slot", ["f32[4,8]", "f32[4,2]", "f32[8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %rs = f32[2] reduce-scatter(%r), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %v0, %zero)
  %fresh = f32[8] negate(%r)""", ["%v1", "%dus", "%fresh"])

PIPELINED.append(("forward_unread_slot", FORWARD_UNREAD_SLOT, {"direction": "forward", "op": ("reduce-scatter",)}))


def _rs_stored(name: str, start: int, trip: int, step: int, direction: str, index: str, rows: int = 4,
               sliced_second: bool = False) -> str:
    """A reduce-scatter of an iteration-dependent value stored at `%idx` (defined by `index`)."""
    body = f"""  %ds = f32[1,8] dynamic-slice(%v1, %zero, %zero), dynamic_slice_sizes={{1,8}}
  %r0 = f32[8] reshape(%ds)
  %fi = f32[] convert(%v0)
  %bi = f32[8] broadcast(%fi), dimensions={{}}
  %r = f32[8] add(%r0, %bi)
{index}
  %g = f32[8] multiply(%r, %r)
  %rs = f32[2] reduce-scatter(%g), {G}, dimensions={{0}}, to_apply=%sum"""
    if sliced_second:
        body += f"""
  %rr = f32[2,1] reshape(%rs)
  %dus = f32[2,{rows}] dynamic-update-slice(%v2, %rr, %zero, %idx)"""
        buffer = f"f32[2,{rows}]"
    else:
        body += f"""
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[{rows},2] dynamic-update-slice(%v2, %rr, %idx, %zero)"""
        buffer = f"f32[{rows},2]"
    return loop(name, ["f32[4,8]", buffer], body, ["%v1", "%dus"], trip=trip, start=start, step=step,
                direction=direction)


def _ag_prefetched(name: str, start: int, trip: int, step: int, direction: str, index: str) -> str:
    """An all-gather of the weight shard at `%idx` (defined by `index`)."""
    body = f"""{index}
  %ds = f32[1,2] dynamic-slice(%v1, %idx, %zero), dynamic_slice_sizes={{1,2}}
  %r = f32[2] reshape(%ds)
  %ag = f32[8] all-gather(%r), {G}, dimensions={{0}}
  %y = f32[8] multiply(%v2, %ag)
  %h = f32[8] tanh(%y)"""
    return loop(name, ["f32[4,2]", "f32[8]"], body, ["%v1", "%h"], trip=trip, start=start, step=step,
                direction=direction)


_SAME = "  %idx = s32[] add(%v0, %zero)"
_PLUS2 = "  %two = s32[] constant(2)\n  %idx = s32[] add(%v0, %two)"
_FWD = {"direction": "forward", "op": ("reduce-scatter",)}
_BWD = {"direction": "backward", "op": ("all-gather",)}
#: loops of other shapes: step 2, a negative start, counting down, the store indexing its second dimension
PIPELINED += [
    ("forward_step2", _rs_stored("forward_step2", 0, 8, 2, "LT", _SAME, rows=8), _FWD),
    ("forward_negative_start", _rs_stored("forward_negative_start", -2, 2, 1, "LT", _PLUS2), _FWD),
    ("forward_countdown", _rs_stored("forward_countdown", 3, -1, -1, "GT", _SAME), _FWD),
    ("forward_second_dimension", _rs_stored("forward_second_dimension", 0, 4, 1, "LT", _SAME, sliced_second=True),
     _FWD),
    ("backward_step2", _ag_prefetched("backward_step2", 0, 8, 2, "LT",
                                      "  %two = s32[] constant(2)\n  %idx = s32[] divide(%v0, %two)"), _BWD),
    ("backward_countdown", _ag_prefetched("backward_countdown", 3, -1, -1, "GT", _SAME), _BWD),
    ("backward_negative_start", _ag_prefetched("backward_negative_start", -2, 2, 1, "LT", _PLUS2), _BWD),
]

#: forward with `pipeline_use_tree`: the reduced value feeds an elementwise tree before its store
FORWARD_TREE = loop("forward_tree", ["f32[4,8]", "f32[4,8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %ar = f32[8] all-reduce(%r), {G}, to_apply=%sum
  %sq = f32[8] multiply(%ar, %ar)
  %both = f32[8] add(%sq, %ar)
  %rr = f32[1,8] reshape(%both)
  %dus = f32[4,8] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"])

PIPELINED.append(("forward_tree", FORWARD_TREE, {"direction": "forward", "op": ("all-reduce",),
                                                  "pipeline_use_tree": True}))
LEFT_ALONE.append(("forward_tree_without_option", FORWARD_TREE, {"direction": "forward", "op": ("all-reduce",)}))

#: forward, the stacked buffer carried through an optimization barrier (param -> gte -> opt-barrier -> store)
FORWARD_BARRIER = loop("forward_barrier", ["f32[4,8]", "f32[4,2]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %tb = (f32[8], f32[4,2]) tuple(%r, %v2)
  %ob = (f32[8], f32[4,2]) opt-barrier(%tb)
  %rb = f32[8] get-tuple-element(%ob), index=0
  %bb = f32[4,2] get-tuple-element(%ob), index=1
  %g = f32[8] multiply(%rb, %rb)
  %rs = f32[2] reduce-scatter(%g), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%bb, %rr, %v0, %zero)""", ["%v1", "%dus"])

#: the same, but the buffer is also read after the barrier: the store cannot wait an iteration
BARRIER_BUFFER_READ = FORWARD_BARRIER.replace(
    "  %dus = f32[4,2] dynamic-update-slice(%bb, %rr, %v0, %zero)",
    "  %dus = f32[4,2] dynamic-update-slice(%bb, %rr, %v0, %zero)\n  %peek = f32[4,2] negate(%bb)")

PIPELINED.append(("forward_barrier", FORWARD_BARRIER, {"direction": "forward", "op": ("reduce-scatter",)}))
LEFT_ALONE.append(("barrier_buffer_read", BARRIER_BUFFER_READ, {"direction": "forward", "op": ("reduce-scatter",)}))

#: a pipelinable loop nested in another loop's body (the inner loop is rewritten first, then left as it is)
NESTED = """HloModule nested, replica_count=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

%icond (cp: (s32[], f32[4,8], f32[4,2])) -> pred[] {
  %cp = (s32[], f32[4,8], f32[4,2]) parameter(0)
  %c0 = s32[] get-tuple-element(%cp), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%c0, %n), direction=LT
}

%ibody (p: (s32[], f32[4,8], f32[4,2])) -> (s32[], f32[4,8], f32[4,2]) {
  %p = (s32[], f32[4,8], f32[4,2]) parameter(0)
  %v0 = s32[] get-tuple-element(%p), index=0
  %v1 = f32[4,8] get-tuple-element(%p), index=1
  %v2 = f32[4,2] get-tuple-element(%p), index=2
  %zero = s32[] constant(0)
  %one = s32[] constant(1)
  %next = s32[] add(%v0, %one)
  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={1,8}
  %r = f32[8] reshape(%ds)
  %g = f32[8] sine(%r)
  %rs = f32[2] reduce-scatter(%g), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %v0, %zero)
  ROOT %t = (s32[], f32[4,8], f32[4,2]) tuple(%next, %v1, %dus)
}

%ocond (cp: (s32[], f32[4,8], f32[4,2])) -> pred[] {
  %cp = (s32[], f32[4,8], f32[4,2]) parameter(0)
  %c0 = s32[] get-tuple-element(%cp), index=0
  %n = s32[] constant(2)
  ROOT %lt = pred[] compare(%c0, %n), direction=LT
}

%obody (p: (s32[], f32[4,8], f32[4,2])) -> (s32[], f32[4,8], f32[4,2]) {
  %p = (s32[], f32[4,8], f32[4,2]) parameter(0)
  %v0 = s32[] get-tuple-element(%p), index=0
  %v1 = f32[4,8] get-tuple-element(%p), index=1
  %v2 = f32[4,2] get-tuple-element(%p), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%v0, %one)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,8], f32[4,2]) tuple(%zero, %v1, %v2)
  %w = (s32[], f32[4,8], f32[4,2]) while(%init), condition=%icond, body=%ibody
  %x = f32[4,8] get-tuple-element(%w), index=1
  %y = f32[4,2] get-tuple-element(%w), index=2
  %x2 = f32[4,8] multiply(%x, %x)
  ROOT %t = (s32[], f32[4,8], f32[4,2]) tuple(%next, %x2, %y)
}

ENTRY %main (x1: f32[4,8], x2: f32[4,2]) -> (s32[], f32[4,8], f32[4,2]) {
  %x1 = f32[4,8] parameter(0)
  %x2 = f32[4,2] parameter(1)
  %start = s32[] constant(0)
  %init = (s32[], f32[4,8], f32[4,2]) tuple(%start, %x1, %x2)
  ROOT %w = (s32[], f32[4,8], f32[4,2]) while(%init), condition=%ocond, body=%obody
}
"""

PIPELINED.append(("nested", NESTED, {"direction": "forward", "op": ("reduce-scatter",)}))


def _reduced_store(name: str, rows: int, cols: int) -> str:
    """An all-reduce of [rows, cols], summed over its columns, stored per iteration."""
    return loop(name, [f"f32[4,{rows},{cols}]", f"f32[4,{rows}]"], f"""  %ds = f32[1,{rows},{cols}] dynamic-slice(%v1, %v0, %zero, %zero), dynamic_slice_sizes={{1,{rows},{cols}}}
  %r = f32[{rows},{cols}] reshape(%ds)
  %ar = f32[{rows},{cols}] all-reduce(%r), {G}, to_apply=%sum
  %fz = f32[] constant(0)
  %red = f32[{rows}] reduce(%ar, %fz), dimensions={{1}}, to_apply=%sum
  %rr = f32[1,{rows}] reshape(%red)
  %dus = f32[4,{rows}] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"])


#: XLA accepts a shrinking reduce after the collective only for a small collective (under 1024 elements)
PIPELINED.append(("forward_small_reduce", _reduced_store("forward_small_reduce", 8, 8),
                  {"direction": "forward", "op": ("all-reduce",)}))
LEFT_ALONE.append(("forward_large_reduce", _reduced_store("forward_large_reduce", 32, 64),
                   {"direction": "forward", "op": ("all-reduce",)}))

#: forward, the stored value has the collective operand's shape: with reuse_pipelined_op_buffer the buffer
#: holds the unreduced value until the next iteration reduces it in place
FORWARD_REUSE = loop("forward_reuse", ["f32[4,8]", "f32[4,8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %g = f32[1,8] exponential(%ds)
  %ar = f32[1,8] all-reduce(%g), {G}, to_apply=%sum
  %neg = f32[1,8] negate(%ar)
  %dus = f32[4,8] dynamic-update-slice(%v2, %neg, %v0, %zero)""", ["%v1", "%dus"])

PIPELINED.append(("forward_reuse", FORWARD_REUSE, {"direction": "forward", "op": ("all-reduce",),
                                                    "reuse_pipelined_op_buffer": True, "pipeline_use_tree": True}))
PIPELINED.append(("forward_reuse_off", FORWARD_REUSE, {"direction": "forward", "op": ("all-reduce",),
                                                        "pipeline_use_tree": True}))

#: forward-sink of a reduce-scatter (and of an all-gather): one collective over the stack after the loop
SINK_RS = loop("sink_rs", ["f32[4,8]", "f32[4,2]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %g = f32[8] cosine(%r)
  %rs = f32[2] reduce-scatter(%g), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"])
SINK_AG = loop("sink_ag", ["f32[4,2]", "f32[4,8]"], f"""  %three = s32[] constant(3)
  %rev = s32[] subtract(%three, %v0)
  %ds = f32[1,2] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,2}}
  %r = f32[2] reshape(%ds)
  %ag = f32[8] all-gather(%r), {G}, dimensions={{0}}
  %rr = f32[1,8] reshape(%ag)
  %dus = f32[4,8] dynamic-update-slice(%v2, %rr, %rev, %zero)""", ["%v1", "%dus"])

PIPELINED.append(("sink_rs", SINK_RS, {"direction": "forward-sink", "op": ("reduce-scatter",)}))
PIPELINED.append(("sink_ag_reversed", SINK_AG, {"direction": "forward-sink", "op": ("all-gather",)}))
#: not sinkable: the buffer has more slices than the loop has iterations (some are never written)
SINK_NOT_FILLED = SINK_RS.replace("f32[4,2]", "f32[6,2]")
LEFT_ALONE.append(("sink_not_filled", SINK_NOT_FILLED, {"direction": "forward-sink", "op": ("reduce-scatter",)}))


# --------------------------------------------------------------------------- options (level, last run, kinds)
#: a gradient reduce-scattered then all-gathered back before its store: two collectives that multi-level
#: pipelining spreads over two iterations (the reduce-scatter one later, the all-gather two later)
TWO_STAGE = loop("two_stage", ["f32[4,8]", "f32[4,8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %g = f32[8] multiply(%r, %r)
  %rs = f32[2] reduce-scatter(%g), {G}, dimensions={{0}}, to_apply=%sum
  %ag = f32[8] all-gather(%rs), {G}, dimensions={{0}}
  %rr = f32[1,8] reshape(%ag)
  %dus = f32[4,8] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"])

#: forward-sink: a collective-permute of an all-reduced value, stored at i (both sinkable, one at a time)
SINK_CP = loop("sink_cp", ["f32[4,8]", "f32[4,8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %g = f32[8] tanh(%r)
  %ar = f32[8] all-reduce(%g), {G}, to_apply=%sum
  %cp = f32[8] collective-permute(%ar), source_target_pairs={{{{0,1}},{{1,2}},{{2,3}},{{3,0}}}}
  %rr = f32[1,8] reshape(%cp)
  %dus = f32[4,8] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"])

#: forward-sink: an all-to-all (split and concatenated along dimension 0) stored at N-1-i
SINK_A2A = loop("sink_a2a", ["f32[4,4,2]", "f32[4,4,2]"], f"""  %three = s32[] constant(3)
  %rev = s32[] subtract(%three, %v0)
  %ds = f32[1,4,2] dynamic-slice(%v1, %v0, %zero, %zero), dynamic_slice_sizes={{1,4,2}}
  %r = f32[4,2] reshape(%ds)
  %g = f32[4,2] exponential(%r)
  %a2a = f32[4,2] all-to-all(%g), {G}, dimensions={{0}}
  %rr = f32[1,4,2] reshape(%a2a)
  %dus = f32[4,4,2] dynamic-update-slice(%v2, %rr, %rev, %zero, %zero)""", ["%v1", "%dus"])

_PAIRS = "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"


def validated_permute(name: str, validation: str, direction: str) -> str:
    """A loop of 8 iterations with a collective-permute whose pairs carry `_xla_send_recv_validation`, and a
    collective that `direction` pipelines (a reduce-scatter stored at i, or an all-gather prefetched at i)."""
    permute = (f'  %cp = f32[8] collective-permute(%g), {_PAIRS}, '
               f'frontend_attributes={{_xla_send_recv_validation="{validation}"}}')
    if direction == "forward":
        return loop(name, ["f32[8,8]", "f32[8,2]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %g = f32[8] reshape(%ds)
{permute}
  %m = f32[8] multiply(%cp, %g)
  %rs = f32[2] reduce-scatter(%m), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[8,2] dynamic-update-slice(%v2, %rr, %v0, %zero)""", ["%v1", "%dus"], trip=8)
    return loop(name, ["f32[8,2]", "f32[8]"], f"""  %ds = f32[1,2] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,2}}
  %r = f32[2] reshape(%ds)
  %ag = f32[8] all-gather(%r), {G}, dimensions={{0}}
  %g = f32[8] multiply(%v2, %ag)
{permute}
  %h = f32[8] tanh(%cp)""", ["%v1", "%h"], trip=8)

#: TWO_STAGE on 8 devices: each reduce-scatter keeps one element of eight
TWO_STAGE_8 = TWO_STAGE.replace("replica_count=4", "replica_count=8").replace(
    "{{0,1,2,3}}", "{{0,1,2,3,4,5,6,7}}").replace("f32[2] reduce-scatter", "f32[1] reduce-scatter")


# --------------------------------------------------------------------------- jax's indices, sink chains
#: jax's normalization of a dynamic index, `select(i < 0, i + N, i)` (every scan and `x[i]`), converted to s64
_JAX_INDEX = """  %four = s32[] constant(4)
  %neg = pred[] compare(%v0, %zero), direction=LT
  %wrapped = s32[] add(%v0, %four)
  %sel = s32[] select(%neg, %wrapped, %v0)
  %idx = s64[] convert(%sel)
  %zero64 = s64[] constant(0)"""

#: forward: a reduce-scatter stored at jax's wrapped index
FORWARD_JAX_INDEX = loop("forward_jax_index", ["f32[4,8]", "f32[4,2]"], f"""{_JAX_INDEX}
  %ds = f32[1,8] dynamic-slice(%v1, %idx, %zero64), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %g = f32[8] multiply(%r, %r)
  %rs = f32[2] reduce-scatter(%g), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %idx, %zero64)""", ["%v1", "%dus"])

#: the same index in a loop that starts at -1: `i < 0` is true in the first iteration only, so the index is not
#: affine in i (it wraps) and the store is left alone
FORWARD_JAX_INDEX_WRAPS = loop("forward_jax_index_wraps", ["f32[4,8]", "f32[4,2]"], f"""{_JAX_INDEX}
  %ds = f32[1,8] dynamic-slice(%v1, %idx, %zero64), dynamic_slice_sizes={{1,8}}
  %r = f32[8] reshape(%ds)
  %rs = f32[2] reduce-scatter(%r), {G}, dimensions={{0}}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %idx, %zero64)""", ["%v1", "%dus"], start=-1, trip=3)

#: forward-sink through a formatting chain: the all-reduced row is scaled by a loop-variant scalar (broadcast),
#: shifted by a loop-invariant row, summed over its columns (reduce) and stored at jax's index
SINK_CHAIN = loop("sink_chain", ["f32[4,8,4]", "f32[4,8]", "f32[8,4]"], f"""{_JAX_INDEX}
  %ds = f32[1,8,4] dynamic-slice(%v1, %idx, %zero64, %zero64), dynamic_slice_sizes={{1,8,4}}
  %r = f32[8,4] reshape(%ds)
  %ar = f32[8,4] all-reduce(%r), {G}, to_apply=%sum
  %fi = f32[] convert(%v0)
  %bi = f32[8,4] broadcast(%fi), dimensions={{}}
  %scaled = f32[8,4] multiply(%ar, %bi)
  %shifted = f32[8,4] add(%scaled, %v3)
  %fz = f32[] constant(0)
  %red = f32[8] reduce(%shifted, %fz), dimensions={{1}}, to_apply=%sum
  %rr = f32[1,8] reshape(%red)
  %dus = f32[4,8] dynamic-update-slice(%v2, %rr, %idx, %zero64)""", ["%v1", "%dus", "%v3"])

#: forward with scheduling annotations: the peeled multiply gets a new group, the last all-reduce none
FORWARD_ANNOTATED = loop("forward_annotated", ["f32[4,8]", "f32[4,8]"], f"""  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={{1,8}}
  %g = f32[1,8] multiply(%ds, %ds), frontend_attributes={{_scheduling_group_id="1"}}
  %ar = f32[1,8] all-reduce(%g), {G}, to_apply=%sum, frontend_attributes={{_scheduling_group_id="2"}}
  %dus = f32[4,8] dynamic-update-slice(%v2, %ar, %v0, %zero)""", ["%v1", "%dus"])

PIPELINED += [
    ("forward_jax_index", FORWARD_JAX_INDEX, {"direction": "forward", "op": ("reduce-scatter",)}),
    ("sink_chain", SINK_CHAIN, {"direction": "forward-sink", "op": ("all-reduce",), "pipeline_use_tree": True}),
    ("forward_annotated", FORWARD_ANNOTATED, {"direction": "forward", "op": ("all-reduce",)}),
]
LEFT_ALONE += [
    ("forward_jax_index_wraps", FORWARD_JAX_INDEX_WRAPS, {"direction": "forward", "op": ("reduce-scatter",)}),
    ("sink_chain_without_tree", SINK_CHAIN, {"direction": "forward-sink", "op": ("all-reduce",)}),
]
