"""Use-def edits: random sequences of IR edits (hypothesis state machine) keep operands, users, control edges,
parents and order exactly as an independent model of the same edits says; the edited module prints, parses
back to the same graph and passes the verifier's use-def checks."""

from __future__ import annotations

from collections import Counter

import pytest
from hlopt.hlo.ir import Computation, Instruction, IrError
from hlopt.hlo.verifier import verify_report
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hlopt import hlo

BASE = """HloModule edits

%callee (x: f32[4], y: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  %y = f32[4] parameter(1)
  %s = f32[4] subtract(%x, %y)
  ROOT %m = f32[4] multiply(%s, %x)
}

ENTRY %main (p: f32[4], q: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %a = f32[4] add(%p, %q)
  %b = f32[4] multiply(%a, %p), control-predecessors={%q}
  %c = f32[4] subtract(%b, %q)
  %k = f32[4] call(%c, %a), to_apply=%callee
  ROOT %d = f32[4] add(%k, %a)
}
"""


class Model:
    """What the graph must be, kept with plain lists and sets, independently of hlo.ir."""

    def __init__(self, module: hlo.Module):
        self.order: dict[Computation, list[Instruction]] = {c: list(c.instructions) for c in module.computations}
        self.operands: dict[Instruction, list[Instruction]] = {
            i: list(i.operands) for c in module.computations for i in c.instructions}
        self.control: set[tuple[Instruction, Instruction]] = {
            (p, i) for c in module.computations for i in c.instructions for p in i.control_predecessors}
        self.root: dict[Computation, Instruction] = {c: c.root for c in module.computations}
        self.removed: list[Instruction] = []

    def users(self, x: Instruction) -> set[Instruction]:
        return {u for u, ops in self.operands.items() if x in ops}

    def computation_of(self, x: Instruction) -> Computation:
        return next(c for c, order in self.order.items() if x in order)

    def remove(self, x: Instruction) -> None:
        self.order[self.computation_of(x)].remove(x)
        del self.operands[x]
        self.control = {(a, b) for a, b in self.control if x not in (a, b)}
        self.removed.append(x)

    def remove_dead(self, x: Instruction) -> None:
        work = [x]
        while work:
            y = work.pop()
            if y not in self.operands or self.users(y) or self.root[self.computation_of(y)] is y \
                    or y.opcode == "parameter":
                continue
            ops = list(dict.fromkeys(self.operands[y]))
            self.remove(y)
            work.extend(ops)

    def remove_with_unused_operands(self, x: Instruction) -> None:
        """XLA's RemoveInstructionAndUnusedOperands: operands with control edges stay too."""
        ops = list(dict.fromkeys(self.operands[x]))
        self.remove(x)
        while ops:
            y = ops.pop()
            if y not in self.operands or self.users(y) or self.root[self.computation_of(y)] is y \
                    or y.opcode == "parameter" or any(y in edge for edge in self.control):
                continue
            ops.extend(dict.fromkeys(self.operands[y]))
            self.remove(y)


def check_against_model(module: hlo.Module, model: Model) -> None:
    """Every fact of the IR equals the model's."""
    live = set(model.operands)
    for comp, order in model.order.items():
        assert list(comp.instructions) == order and len(comp) == len(order)
        assert comp.root is model.root[comp] and comp.root in order
        assert comp.parameters == sorted((i for i in order if i.opcode == "parameter"),
                                         key=lambda i: i["parameter_number"])
        for inst in order:
            assert inst.parent is comp
            assert list(inst.operands) == model.operands[inst] and inst.operand_count == len(model.operands[inst])
            users = inst.users
            assert len(users) == len(set(users)) == inst.user_count
            assert set(users) == model.users(inst)
            preds = {p for p, s in model.control if s is inst}
            succs = {s for p, s in model.control if p is inst}
            assert set(inst.control_predecessors) == preds and len(inst.control_predecessors) == len(preds)
            assert set(inst.control_successors) == succs and len(inst.control_successors) == len(succs)
    names = [i.name for c in module.computations for i in c.instructions]
    assert len(names) == len(set(names))
    for gone in model.removed:
        assert gone.parent is None and not gone.operands and not gone.control_predecessors
        assert not gone.control_successors and gone not in live
        assert all(gone not in i.operands for i in live)


def graph(module: hlo.Module) -> dict[str, list[tuple]]:
    """The module's graph by names (for comparing a module with its printed-and-parsed copy)."""
    return {
        c.name: [(i.name, i.opcode, [o.name for o in i.operands], sorted(p.name for p in i.control_predecessors),
                  i is c.root) for i in c.instructions]
        for c in module.computations
    }


class EditMachine(RuleBasedStateMachine):
    """Random edits through the public IR API, mirrored on the model."""

    def __init__(self) -> None:
        super().__init__()
        self.module = hlo.parse(BASE)
        self.model = Model(self.module)

    # helpers ----------------------------------------------------------------
    def _comp(self, data: st.DataObject) -> Computation:
        return data.draw(st.sampled_from(self.module.computations))

    def _pick(self, data: st.DataObject, comp: Computation, *, params: bool = True) -> Instruction | None:
        choices = [i for i in comp.instructions if params or i.opcode != "parameter"]
        return data.draw(st.sampled_from(choices)) if choices else None

    def _earlier(self, data: st.DataObject, comp: Computation, x: Instruction) -> Instruction | None:
        order = list(comp.instructions)
        before = order[: order.index(x)]
        return data.draw(st.sampled_from(before)) if before else None

    # rules ------------------------------------------------------------------
    @rule(data=st.data())
    def set_operand(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        x = self._pick(data, comp, params=False)
        y = x and self._earlier(data, comp, x)
        if x is None or y is None or not x.operand_count:
            return
        i = data.draw(st.integers(0, x.operand_count - 1))
        x.set_operand(i, y)
        self.model.operands[x][i] = y

    @rule(data=st.data())
    def replace_or_add_or_remove_operands(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        x = self._pick(data, comp, params=False)
        order = list(comp.instructions)
        if x is None or order.index(x) == 0:
            return
        earlier = order[: order.index(x)]
        kind = data.draw(st.sampled_from(["replace", "add", "remove"]))
        if kind == "replace":
            new = data.draw(st.lists(st.sampled_from(earlier), max_size=3))
            x.replace_operands(new)
            self.model.operands[x] = list(new)
        elif kind == "add":
            y = data.draw(st.sampled_from(earlier))
            x.add_operand(y)
            self.model.operands[x].append(y)
        elif x.operand_count:
            i = data.draw(st.integers(0, x.operand_count - 1))
            x.remove_operand(i)
            del self.model.operands[x][i]

    @rule(data=st.data())
    def replace_use_of(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        x = self._pick(data, comp, params=False)
        new = x and self._earlier(data, comp, x)
        if x is None or new is None or not x.operand_count:
            return
        old = data.draw(st.sampled_from(list(x.operands)))
        x.replace_use_of(old, new)
        self.model.operands[x] = [new if o is old else o for o in self.model.operands[x]]

    @rule(data=st.data(), keep_root=st.booleans())
    def replace_all_uses_with(self, data: st.DataObject, keep_root: bool) -> None:
        comp = self._comp(data)
        x = self._pick(data, comp, params=False)
        y = x and self._earlier(data, comp, x)
        if x is None or y is None:
            return
        x.replace_all_uses_with(y, keep_root=keep_root)
        for u, ops in self.model.operands.items():
            if u is not y:
                self.model.operands[u] = [y if o is x else o for o in ops]
        if not keep_root and self.model.root[comp] is x:
            self.model.root[comp] = y

    @rule(data=st.data(), where=st.sampled_from(["after", "before", "end"]))
    def add_instruction(self, data: st.DataObject, where: str) -> None:
        comp = self._comp(data)
        y = self._pick(data, comp)
        order = self.model.order[comp]
        later = order[order.index(y) + 1 :]
        if where == "before" and not later:
            return
        new = Instruction("negate", y.shape, [y])  # y has a new user from here on
        if where == "after":
            comp.add(new, after=y)
            order.insert(order.index(y) + 1, new)
        elif where == "before":
            z = data.draw(st.sampled_from(later))
            comp.add(new, before=z)
            order.insert(order.index(z), new)
        else:
            comp.add(new)
            order.append(new)
        assert new.name and new.parent is comp
        self.model.operands[new] = [y]

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        x = self._pick(data, comp, params=False)
        if x is None:
            return
        if x.user_count or x is comp.root:
            with pytest.raises(IrError):
                comp.remove(x)
            return
        comp.remove(x)
        self.model.remove(x)

    @rule(data=st.data())
    def remove_dead(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        x = self._pick(data, comp)
        comp.remove_dead(x)
        self.model.remove_dead(x)

    @rule(data=st.data())
    def replace_instruction(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        old = self._pick(data, comp, params=False)
        src = old and self._earlier(data, comp, old)
        if old is None or src is None:
            return
        new = Instruction("negate", old.shape, [src])
        comp.replace_instruction(old, new)
        m = self.model
        order = m.order[comp]
        order.insert(order.index(old), new)
        m.operands[new] = [src]
        m.control |= {(p, new) for p, s in list(m.control) if s is old and p is not new}
        m.control |= {(new, s) for p, s in list(m.control) if p is old and s is not new}
        for u, ops in m.operands.items():
            if u is not new:
                m.operands[u] = [new if o is old else o for o in ops]
        if m.root[comp] is old:
            m.root[comp] = new
        m.remove_with_unused_operands(old)

    @rule(data=st.data(), add=st.booleans())
    def control_edge(self, data: st.DataObject, add: bool) -> None:
        comp = self._comp(data)
        b = self._pick(data, comp)
        a = self._earlier(data, comp, b)
        if a is None:
            return
        if add:
            a.add_control_successor(b)
            self.model.control.add((a, b))
        elif (a, b) in self.model.control:
            a.remove_control_successor(b)
            self.model.control.discard((a, b))

    @rule(data=st.data())
    def drop_control_dependencies(self, data: st.DataObject) -> None:
        x = self._pick(data, self._comp(data))
        x.drop_control_dependencies()
        self.model.control = {(a, b) for a, b in self.model.control if x not in (a, b)}

    @rule(data=st.data())
    def set_root(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        x = self._pick(data, comp)
        if comp is self.module.entry or comp.root.shape == x.shape:
            comp.set_root(x)
            self.model.root[comp] = x

    @precondition(lambda self: True)
    @rule(data=st.data())
    def reorder_topologically(self, data: st.DataObject) -> None:
        comp = self._comp(data)
        comp.make_topological()
        order = list(comp.instructions)
        assert sorted(order, key=id) == sorted(self.model.order[comp], key=id)
        pos = {x: k for k, x in enumerate(order)}
        assert all(pos[o] < pos[x] for x in order for o in x.operands)
        assert all(pos[p] < pos[x] for x in order for p in x.control_predecessors)
        self.model.order[comp] = order

    # checks -----------------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        check_against_model(self.module, self.model)

    def teardown(self) -> None:
        problems = [p for p in verify_report(self.module) if "user" in p.message or "order" in p.message
                    or "operand" in p.message and "defined" in p.message]
        assert not problems, problems
        text = self.module.to_text()
        again = hlo.parse(text)
        assert graph(again) == graph(self.module)
        assert again.to_text() == text


EditMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_random_edit_sequences = EditMachine.TestCase


# ----------------------------------------------------------------------------- specific edits


def test_users_count_each_user_once_and_keep_order() -> None:
    m = hlo.parse(BASE)
    p, q, a = (m.entry.instruction(n) for n in "pqa")
    twice = Instruction("add", p.shape, [p, p])
    m.entry.add(twice, after=q)
    assert p.users.count(twice) == 1 and p.users[-1] is twice
    twice.set_operand(0, q)
    assert twice in p.users  # still an operand once
    twice.set_operand(1, q)
    assert twice not in p.users and Counter(q.users)[twice] == 1
    assert [u.name for u in a.users] == ["b", "k", "d"]


def test_remove_refuses_used_or_root_and_removed_instruction_is_detached() -> None:
    m = hlo.parse(BASE)
    entry = m.entry
    with pytest.raises(IrError, match="still used"):
        entry.remove(entry.instruction("a"))
    with pytest.raises(IrError, match="root"):
        entry.remove(entry.root)
    dead = entry.add(Instruction("negate", entry.root.shape, [entry.instruction("a")]))
    dead.add_control_predecessor(entry.instruction("q"))
    entry.remove(dead)
    assert dead.parent is None and not dead.operands and not dead.control_predecessors
    assert dead not in entry.instruction("a").users and dead not in entry.instruction("q").control_successors


def test_remove_dead_removes_chains_but_keeps_parameters_and_side_effects() -> None:
    m = hlo.parse(BASE)
    entry = m.entry
    d = entry.root
    entry.set_root(entry.instruction("a"))
    assert entry.remove_dead(d) == 4  # d, k, c, b (a is the root now; p, q are parameters)
    assert [i.name for i in entry.instructions] == ["p", "q", "a"]


def test_replace_all_uses_with_moves_root_unless_kept() -> None:
    m = hlo.parse(BASE)
    entry = m.entry
    new = entry.add(Instruction("negate", entry.root.shape, [entry.instruction("k")]))
    entry.root.replace_all_uses_with(new, keep_root=True)
    assert entry.root.name == "d"
    entry.root.replace_all_uses_with(new)
    assert entry.root is new


def test_replace_instruction_carries_control_dependencies() -> None:
    m = hlo.parse(BASE)
    entry = m.entry
    b = entry.instruction("b")
    new = Instruction("negate", b.shape, [entry.instruction("a")])
    entry.replace_instruction(b, new)
    assert b.parent is None and [p.name for p in new.control_predecessors] == ["q"]
    assert entry.instruction("c").operand(0) is new


def test_reordering_must_keep_the_same_instructions() -> None:
    m = hlo.parse(BASE)
    entry = m.entry
    with pytest.raises(IrError):
        entry.instructions = list(entry.instructions)[:-1]
    entry.instructions = list(reversed(entry.instructions))
    assert entry.instructions[0].name == "d"
    entry.make_topological()
    assert [i.name for i in entry.instructions][:2] == ["p", "q"]


def test_ids_are_unique_increasing_and_public_across_threads() -> None:
    import threading

    made: list[int] = []
    lock = threading.Lock()

    def make() -> None:
        ids = [Instruction("constant", hlo.parse_shape("f32[]")).id for _ in range(2000)]
        with lock:
            made.extend(ids)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == len(made) == 8000
    mark = Instruction.id_watermark()
    assert Instruction("constant", hlo.parse_shape("f32[]")).id > mark > max(made)


def test_move_reorders_within_the_computation_only() -> None:
    m = hlo.parse(BASE)
    main = m.entry
    a, c, d = (main.instruction(n) for n in ("a", "c", "d"))
    main.move(c, before=a)
    assert [i.name for i in main.instructions] == ["p", "q", "c", "a", "b", "k", "d"]
    main.move(c, after=d)
    assert [i.name for i in main.instructions][-2:] == ["d", "c"]
    assert main.first_instruction.name == "p" and main.first_instruction.next_instruction.name == "q"
    assert c.previous_instruction is d and c.next_instruction is None
    with pytest.raises(IrError):
        main.move(m.computation("callee").instruction("s"), before=a)


def test_remove_parameter_renumbers_the_later_ones() -> None:
    m = hlo.parse("""HloModule rp

ENTRY %e (a: f32[2], b: f32[2], c: f32[2]) -> f32[2] {
  %a = f32[2] parameter(0)
  %b = f32[2] parameter(1)
  %c = f32[2] parameter(2)
  ROOT %r = f32[2] add(%a, %c)
}
""")
    e = m.entry
    e.remove_parameter(1)
    assert [(p.name, p.attrs["parameter_number"]) for p in e.parameters] == [("a", 0), ("c", 1)]
    assert e.parameter(1).name == "c"
    with pytest.raises(IrError):
        e.remove_parameter(0)  # still used


def test_update_computations_places_each_before_its_caller_and_drops_removed() -> None:
    m = hlo.parse(BASE)
    callee, main = m.computation("callee"), m.entry
    new1 = Computation("n1", [Instruction("parameter", hlo.parse_shape("f32[]"), name="z1", parameter_number=0)])
    new2 = Computation("n2", [Instruction("parameter", hlo.parse_shape("f32[]"), name="z2", parameter_number=0)])
    m.update_computations({new1: main, new2: callee}, removed=[])
    assert [c.name for c in m.computations] == ["n2", "callee", "n1", "main"]
    assert new1.module is m and m.unique_name("z1") == "z1.1"
    m.update_computations({}, removed=[new2])
    assert [c.name for c in m.computations] == ["callee", "n1", "main"] and new2.module is None


def test_unique_name_strips_a_numeric_suffix_and_counts_past_used_names() -> None:
    m = hlo.parse(BASE)
    assert m.unique_name("add") == "add"
    assert m.unique_name("add.7") == "add.1"
    assert m.unique_name("x.3.4") == "x.3"
    assert m.unique_name("x") == "x.4"  # `x.3` raised the count of `x`
    assert m.unique_name("a") == "a.1"


def test_move_to_splices_an_instruction_into_another_computation() -> None:
    m = hlo.parse(BASE)
    callee, main = m.computation("callee"), m.entry
    s = callee.instruction("s")
    callee.instruction("m").replace_use_of(s, callee.instruction("x"))
    callee.move_to(s, main, before=main.instruction("d"))
    assert s.parent is main and s not in callee.instructions
    assert [i.name for i in main.instructions][-2:] == ["s", "d"]


def test_move_all_to_splices_a_run_in_order_as_one_stamped_edit() -> None:
    m = hlo.parse(BASE)
    callee, main = m.computation("callee"), m.entry
    s, mul, x = (callee.instruction(n) for n in ("s", "m", "x"))
    d = main.instruction("d")
    before = (callee.edit_stamp, main.structure_stamp, s.edit_stamp, mul.edit_stamp, m.mutations)
    callee.move_all_to([s, mul], main, before=d)
    assert s.parent is main and mul.parent is main and [i.name for i in callee.instructions] == ["x", "y"]
    assert [i.name for i in main.instructions][-3:] == ["s", "m", "d"] and len(main) == 9 and len(callee) == 2
    assert d.previous_instruction is mul and mul.previous_instruction is s
    after = (callee.edit_stamp, main.structure_stamp, s.edit_stamp, mul.edit_stamp, m.mutations)
    assert all(b < a for b, a in zip(before, after, strict=True))
    assert s.operands[1] is callee.instruction("y") and x in s.operands  # operands stay: the caller rewires them
    callee.move_all_to([], main)  # nothing to move: no edit
    assert m.mutations == after[4]
    with pytest.raises(IrError):
        callee.move_all_to([d], main)  # not in callee
    with pytest.raises(IrError):
        callee.move_all_to([x], main, before=x)  # `before` is not in main
    with pytest.raises(IrError):
        callee.move_all_to([x, x], main)  # twice
    assert x.parent is callee and len(callee) == 2


def _reference_post_order(comp: Computation) -> list[Instruction]:
    """Depth-first post-order from each instruction in turn, operands then control predecessors first."""
    seen: set[Instruction] = set()
    out: list[Instruction] = []

    def visit(x: Instruction) -> None:
        seen.add(x)
        for d in list(x.operands) + list(x.control_predecessors):
            if d not in seen and d.parent is comp:
                visit(d)
        out.append(x)

    for x in comp.instructions:
        if x not in seen:
            visit(x)
    return out


def test_post_order_is_remembered_until_the_next_edit() -> None:
    m = hlo.parse(BASE)
    main = m.entry
    first = main.post_order()
    assert first == _reference_post_order(main)
    first.reverse()  # a caller's list: the next answer is not changed by it
    assert main.post_order() == _reference_post_order(main)
    a, b, c, d = (main.instruction(n) for n in ("a", "b", "c", "d"))
    main.move(d, before=a)  # d first: its operands now come after it
    assert main.post_order() == _reference_post_order(main) and main.post_order()[-1] is d
    c.set_operand(0, a)  # an operand edit alone (no reorder) is seen too
    assert main.post_order() == _reference_post_order(main)
    k1 = main.add(Instruction("constant", a.shape, name="k1", literal=main.instruction("p").attrs.get("literal")))
    k2 = main.add(Instruction("negate", a.shape, [a], name="k2"), before=k1)
    assert main.post_order().index(k2) < main.post_order().index(k1)
    k1.add_control_successor(k2)  # ... and a control edge: k1 must come first now
    assert main.post_order() == _reference_post_order(main)
    assert main.post_order().index(k1) < main.post_order().index(k2)


def test_calling_instructions_follow_callee_edits() -> None:
    m = hlo.parse(BASE)
    main, callee = m.entry, m.computation("callee")
    k = main.instruction("k")
    assert main.calling_instructions() == [(k, [callee])] and main.called_computations() == [callee]
    main.calling_instructions()[0][1].clear()  # a caller's copy: what is remembered stays
    assert main.called_computations() == [callee]
    other = Computation("other")
    k.replace_called_computation(callee, other)
    assert main.calling_instructions() == [(k, [other])] and main.called_computations() == [other]
    k.attrs["to_apply"] = callee
    assert main.called_computations() == [callee]
    k.replace_all_uses_with(main.instruction("a"))
    main.remove(k)
    assert main.calling_instructions() == [] and main.called_computations() == []


def test_first_non_parameter_and_operand_index() -> None:
    m = hlo.parse(BASE)
    main = m.entry
    a, p, q = (main.instruction(n) for n in ("a", "p", "q"))
    assert main.first_non_parameter() is a
    assert Computation("empty").first_non_parameter() is None
    b = main.instruction("b")  # multiply(a, p)
    assert b.operand_index(p) == 1 and b.operand_index(a) == 0 and b.operand_index(q) is None
    twice = Instruction("add", a.shape, [p, p])
    assert twice.operand_index(p) == 0 and p.user_use_count(twice) == 2


def test_replace_instruction_carries_annotations_and_refuses_like_xla() -> None:
    m = hlo.parse("""HloModule r

ENTRY %e (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %n = f32[4] negate(%p), metadata={op_name="jit(f)/neg"}, sharding={replicated}
  %x = f32[4] exponential(%n)
  ROOT %r = f32[4] add(%x, %p), control-predecessors={%n}
}
""")
    e = m.entry
    n, r = e.instruction("n"), e.instruction("r")
    refused = Instruction("abs", n.shape, [e.instruction("p")])
    assert not e.replace_instruction(r, refused, relay_control_dependency=False)  # r has a control edge
    assert refused.parent is None and e.root is r
    new = Instruction("abs", n.shape, [e.instruction("p")])
    assert e.replace_instruction(n, new)
    assert new.metadata.op_name == "jit(f)/neg" and new.sharding is not None
    assert [s.name for s in new.control_successors] == ["r"] and n.parent is None
    root = Instruction("multiply", r.shape, [e.instruction("x"), e.instruction("p")])
    assert e.replace_instruction(r, root) and e.root is root


def test_root_changes_through_set_root_and_replace_all_uses_with() -> None:
    m = hlo.parse(BASE)
    e = m.entry
    d, a = e.instruction("d"), e.instruction("a")
    with pytest.raises(IrError):
        e.set_root(m.computation("callee").instruction("s"))
    neg = e.add(Instruction("negate", d.shape, [d]))
    d.replace_all_uses_with(neg)
    assert e.root is neg  # callers no longer move the root themselves
    e.set_root(a)
    assert e.root is a


def test_backend_config_dict_is_one_read_only_answer():
    from hlopt import hlo

    module = hlo.parse("""HloModule m
ENTRY e {
  p = f32[4]{0} parameter(0), backend_config={"a":{"b":2}}
  q = f32[4]{0} negate(p), backend_config="not json"
  ROOT r = f32[4]{0} negate(q)
}
""")
    p, q, r = module.entry.instructions
    assert p.backend_config_dict()["a"] == {"b": 2} and p.backend_config_value("a", "b") == 2
    assert p.backend_config_value("a", "missing") is None and p.backend_config_value("a", "b", "c") is None
    assert q.backend_config_dict() == {} and r.backend_config_dict() == {}
    with pytest.raises(TypeError):
        p.backend_config_dict()["a"] = 1  # read-only: edits go through set_backend_config_json
    p.set_backend_config_json({"a": 3})
    assert p.backend_config_value("a") == 3


def test_add_all_links_new_instructions_in_order_as_one_stamped_edit() -> None:
    m = hlo.parse(BASE)
    main = m.entry
    p, q, d = (main.instruction(n) for n in ("p", "q", "d"))
    x = Instruction("negate", p.shape, [p], name="x")
    y = Instruction("add", p.shape, [x, q], name="y")
    w = Instruction("parameter", p.shape, name="w", parameter_number=2)
    before = (main.edit_stamp, main.structure_stamp, m.mutations)
    main.add_all([w, x, y], before=d)
    assert [i.name for i in main.instructions][-4:] == ["w", "x", "y", "d"] and len(main) == 10
    assert all(i.parent is main for i in (w, x, y)) and main.parameter(2) is w
    assert d.previous_instruction is y and y.next_instruction is d
    assert w.edit_stamp == x.edit_stamp == y.edit_stamp == main.edit_stamp == main.structure_stamp
    assert main.edit_stamp > max(before[:2]) and m.mutations > before[2]
    z = Instruction("negate", p.shape, [y], name="z")
    main.add_all([z])  # at the end
    assert main.instructions[-1] is z
    main.add_all([])  # nothing to add: no edit
    a, b = Instruction("negate", p.shape, [p], name="a"), Instruction("negate", p.shape, [p], name="b")
    with pytest.raises(IrError):
        main.add_all([a, b, a])  # twice
    with pytest.raises(IrError):
        main.add_all([a, x])  # x is in main already
    with pytest.raises(IrError):
        main.add_all([a], before=m.computation("callee").instruction("x"))  # `before` is not in main
    assert a.parent is None and b.parent is None and len(main) == 11


def test_extend_operands_appends_uses_in_order_as_one_stamped_edit() -> None:
    m = hlo.parse(BASE)
    main = m.entry
    p, q, a = (main.instruction(n) for n in ("p", "q", "a"))
    t = Instruction("tuple", p.shape, [p], name="t")
    main.add(t, before=main.root)
    users_of_q = list(q.users)
    mutations = m.mutations
    t.extend_operands([q, a, q])
    assert t.operands == (p, q, a, q) and q.user_use_count(t) == 2 and a.user_use_count(t) == 1
    assert list(q.users) == [*users_of_q, t]
    assert t.edit_stamp == q.edit_stamp == a.edit_stamp == main.edit_stamp and m.mutations == mutations + 1
    t.extend_operands([])  # nothing to add: no edit
    assert m.mutations == mutations + 1


def test_replace_with_new_takes_place_users_and_root_as_one_stamped_edit() -> None:
    m = hlo.parse(BASE)
    main = m.entry
    p, q, a, b, c, k, d = (main.instruction(n) for n in ("p", "q", "a", "b", "c", "k", "d"))
    users_of_p = list(p.users)
    n = Instruction("subtract", a.shape, [p, q], name="n")
    before = (main.edit_stamp, main.structure_stamp, m.mutations)
    main.replace_with_new(a, n)
    assert a.parent is None and n.parent is main and a not in main.instructions and len(main) == 7
    assert [i.name for i in main.instructions][:3] == ["p", "q", "n"] and q.next_instruction is n
    assert b.operands == (n, p) and k.operands == (c, n) and d.operands == (k, n)
    assert list(n.users) == [b, k, d] and not a.users and not a.operands
    assert list(p.users) == [u for u in users_of_p if u is not a] + [n] and a not in q.users
    stamp = main.edit_stamp
    assert stamp == main.structure_stamp == n.edit_stamp == b.edit_stamp == p.edit_stamp and stamp > before[0]
    assert m.mutations == before[2] + 1
    r = Instruction("negate", d.shape, [k], name="r")
    main.replace_with_new(d, r)  # the root role goes too
    assert main.root is r and main.instructions[-1] is r and not d.users
    assert not [p for p in verify_report(m) if p.severity == "error"]
    assert hlo.parse(m.to_text()).to_text() == m.to_text()
    with pytest.raises(IrError):
        main.replace_with_new(d, Instruction("negate", d.shape, [k], name="s"))  # d is not in main any more
    w = Instruction("negate", r.shape, [r], name="w")
    with pytest.raises(IrError):
        main.replace_with_new(r, w)  # `new` reading `old`: step by step, and `r` stays used by `w`


def test_remove_parameter_with_replacement_moves_uses_and_renumbers_as_one_edit() -> None:
    m = hlo.parse("""HloModule rp

%f (a: f32[4], b: f32[4], c: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  %b = f32[4] parameter(1)
  %c = f32[4] parameter(2)
  %n = f32[4] negate(%c)
  %s = f32[4] add(%a, %b)
  ROOT %t = f32[4] multiply(%s, %a)
}

ENTRY %main (x: f32[4], y: f32[4], z: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  %y = f32[4] parameter(1)
  %z = f32[4] parameter(2)
  ROOT %r = f32[4] call(%x, %y, %z), to_apply=%f
}
""")
    f = m.computation("f")
    a, b, c, n, s, t = (f.instruction(x) for x in ("a", "b", "c", "n", "s", "t"))
    f.remove_parameter(0, replacement=n)
    assert a.parent is None and f.parameters == [b, c] and b.attrs["parameter_number"] == 0
    assert c.attrs["parameter_number"] == 1 and s.operands == (n, b) and t.operands == (s, n)
    assert list(n.users) == [s, t] and not a.users
    assert n.edit_stamp == s.edit_stamp == t.edit_stamp == b.edit_stamp == c.edit_stamp == f.structure_stamp
    with pytest.raises(IrError):
        f.remove_parameter(1, replacement=n)  # n reads c: c stays used
    g = hlo.parse("""HloModule rp2

ENTRY %g (a: f32[4], b: f32[4]) -> f32[4] {
  %b = f32[4] parameter(1)
  %k = f32[4] negate(%b)
  ROOT %a = f32[4] parameter(0)
}
""").entry
    k = g.instruction("k")
    g.remove_parameter(0, replacement=k)  # the root role goes to the replacement
    assert g.root is k and g.parameters == [g.instruction("b")] and g.parameter(0).name == "b"
