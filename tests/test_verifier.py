"""hlo.verify: accepts what JAX and XLA produce, and rejects broken modules naming what is broken.

Accepted: every corpus module (unoptimized and XLA:CPU-optimized, 8-device shard_map programs included),
the XLA test modules in ../shared/xla_cases, and a dozen more JAX programs chosen for opcodes the corpus
lacks. Rejected: modules broken on purpose (shapes, operand counts, use-def written behind the IR's back,
order, cycles, parameters, callee signatures, collectives), each complaint naming the instruction, its
computation and showing its neighbourhood.
"""

from __future__ import annotations

import re

import pytest
from hlopt.hlo.builder import Builder, scalar_computation
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.shape import Shape
from hlopt.hlo.verifier import HloVerifyError, VerifyProblem, verify, verify_report

from hlopt import hlo


def _errors(module: hlo.Module) -> list[VerifyProblem]:
    return [p for p in verify_report(module) if p.severity == "error"]


def _about(problems: list[VerifyProblem], name: str) -> list[str]:
    return [p.message for p in problems if p.instruction == name]


# ----------------------------------------------------------------------------- what must be accepted


def test_corpus_modules_verify():
    from hlopt.corpus.programs import corpus_texts

    for entry in corpus_texts():
        module = hlo.parse(entry.text, filename=entry.id)
        problems = verify_report(module)
        assert not problems, f"{entry.id}:\n" + "\n".join(map(str, problems[:5]))


def test_xla_test_modules_verify(shared_dir):
    paths = sorted((shared_dir / "xla_cases").glob("**/*.hlo"))
    assert paths
    for path in paths:
        errors = _errors(hlo.parse_file(path))
        assert not errors, f"{path.name}:\n" + "\n".join(map(str, errors[:5]))


def _programs():
    """JAX programs for opcodes and forms the shared corpus does not have."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def depthwise(w, x):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=4, rhs_dilation=(2, 1),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC")).sum()

    return {
        "rbg_random": (lambda k: jax.random.uniform(k, (4, 3)), (jax.random.key(0, impl="rbg"),)),
        "precision_cumulative": (lambda x: (lax.reduce_precision(x, 5, 10), lax.clamp(0.0, x, 1.0), lax.cumsum(x),
                                            lax.cummax(x, axis=0)), (jnp.linspace(-1, 2, 8),)),
        "grouped_conv_grad": (jax.grad(depthwise), (jnp.ones((3, 3, 1, 8)), jnp.ones((2, 7, 7, 4)))),
        "conv_dilated_1d": (lambda x, w: lax.conv_general_dilated(x, w, (2,), [(1, 2)], lhs_dilation=(2,),
                                                                  dimension_numbers=("NCH", "OIH", "NCH")),
                            (jnp.ones((2, 3, 9)), jnp.ones((5, 3, 3)))),
        "dot_preferred_types": (lambda a, b: (lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                              preferred_element_type=jnp.float32),
                                              jnp.einsum("ij,jk->ik", a.astype(jnp.int8), b.astype(jnp.int8),
                                                         preferred_element_type=jnp.int32)),
                                (jnp.ones((4, 5), jnp.bfloat16), jnp.ones((5, 3), jnp.bfloat16))),
        "sort_keys_values": (lambda x, y: (lax.sort((x, y), num_keys=1), lax.top_k(x, 2), lax.sort(x, dimension=0)),
                             (jnp.arange(12.0).reshape(3, 4)[::-1], jnp.arange(12).reshape(3, 4))),
        "fft_nd": (lambda x: (jnp.fft.fft2(x.astype(jnp.complex64)), jnp.fft.irfft2(jnp.fft.rfft2(x))),
                   (jnp.arange(24.0).reshape(4, 6),)),
        "switch_fori_scan": (lambda x, i: (lax.switch(i, [jnp.sin, jnp.cos, lambda v: v * 2], x),
                                           lax.fori_loop(0, 3, lambda j, c: (c[0] + j, c[1] * 2), (0, x)),
                                           lax.scan(lambda c, v: (c + v, c * v), 0.0, x)),
                             (jnp.arange(4.0), jnp.array(2))),
        "gather_scatter_modes": (lambda x, i: (x[i, :, i], jnp.take(x, i, axis=2, mode="clip"), x.at[i, 1].max(1.0),
                                               x.at[:, i].min(x[:, i])),
                                 (jnp.arange(60.0).reshape(3, 4, 5), jnp.array([2, 0, 1]))),
        "bit_ops": (lambda x: (lax.bitcast_convert_type(x, jnp.uint16), lax.population_count(x.astype(jnp.uint8)),
                               lax.clz(x.astype(jnp.int32)), lax.bitcast_convert_type(
                                   x.astype(jnp.float16).reshape(4, 2), jnp.float32)), (jnp.arange(8.0),)),
        "pooling_grad": (lambda x: (lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "VALID",
                                                      base_dilation=(1, 2, 1, 1), window_dilation=(1, 1, 2, 1)),
                                    jax.grad(lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (1, 3, 3, 1),
                                                                         (1, 2, 2, 1), "VALID").sum())(x)),
                         (jnp.ones((2, 8, 8, 3)),)),
        "map_vmapped_cond": (lambda x: (lax.map(lambda v: v * 2 + 1, x),
                                        jax.vmap(lambda v: lax.cond(v.sum() > 0, jnp.sin, jnp.cos, v))(x)),
                             (jnp.arange(12.0).reshape(3, 4) - 5,)),
    }


@pytest.fixture(scope="module")
def extra_modules() -> dict[str, tuple[str, str]]:
    """name -> (unoptimized HLO, XLA:CPU-optimized HLO)."""
    import jax

    out = {}
    for name, (fn, args) in _programs().items():
        lowered = jax.jit(fn).lower(*args)
        out[name] = (lowered.as_text(dialect="hlo"), lowered.compile().as_text())
    return out


PROGRAM_NAMES = ["rbg_random", "precision_cumulative", "grouped_conv_grad", "conv_dilated_1d", "dot_preferred_types",
                 "sort_keys_values", "fft_nd", "switch_fori_scan", "gather_scatter_modes", "bit_ops", "pooling_grad",
                 "map_vmapped_cond"]


@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_more_jax_programs_verify(extra_modules, name):
    assert sorted(extra_modules) == sorted(PROGRAM_NAMES)
    for kind, text in zip(("unoptimized", "optimized"), extra_modules[name], strict=True):
        problems = verify_report(hlo.parse(text, filename=f"{name}.{kind}"))
        assert not problems, f"{name} ({kind}):\n" + "\n".join(map(str, problems[:5]))


def test_builder_made_module_verifies():
    m = hlo.parse("HloModule b\nENTRY e {\n  ROOT p = f32[4,3] parameter(0)\n}\n")
    add = scalar_computation(m, "add", "f32")
    b = Builder(m.entry)
    p = m.entry.parameter(0)
    t = b.transpose(p, (1, 0))
    d = b.dot(p, t, (1,), (0,))
    r = b.reduce(d, b.constant(0.0, "f32"), (1,), add)
    m.entry.set_root(b.tuple(r, b.broadcast(r, (4, 2), (0,))))
    verify(m)


# ----------------------------------------------------------------------------- what must be rejected

GOOD = """HloModule v

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%sum_s32 (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %s = s32[] add(%a, %b)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%cond_s32 (p: (s32[], f32[4])) -> s32[] {
  %p = (s32[], f32[4]) parameter(0)
  ROOT %i = s32[] get-tuple-element(%p), index=0
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4] get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %y = f32[4] negate(%x)
  ROOT %t = (s32[], f32[4]) tuple(%j, %y)
}

ENTRY %main (a: f32[2,4], b: f32[4,3]) -> (f32[2,3], f32[2], (s32[], f32[4])) {
  %a = f32[2,4] parameter(0)
  %b = f32[4,3] parameter(1)
  %d = f32[2,3] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %z = f32[] constant(0)
  %r = f32[2] reduce(%a, %z), dimensions={1}, to_apply=%sum
  %zero = s32[] constant(0)
  %sl1 = f32[1,4] slice(%a), slice={[0:1], [0:4]}
  %v = f32[4] reshape(%sl1)
  %init = (s32[], f32[4]) tuple(%zero, %v)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  ROOT %out = (f32[2,3], f32[2], (s32[], f32[4])) tuple(%d, %r, %w)
}
"""


def _good() -> hlo.Module:
    return hlo.parse(GOOD)


def _inst(m: hlo.Module, name: str, comp: str | None = None) -> Instruction:
    return (m.computation(comp) if comp else m.entry).instruction(name)


def test_good_module_verifies():
    m = _good()
    verify(m)
    assert all(p.severity == "warning" for p in verify_report(m))


@pytest.mark.parametrize("old, new, message", [
    ("%d = f32[2,3] dot", "%d = f32[2,4] dot", "does not match the inferred"),
    ("%r = f32[2] reduce", "%r = f32[4] reduce", "does not match the inferred"),
    ("ROOT %lt = pred[] compare", "ROOT %lt = s32[] compare", "does not match the inferred"),
    ("ROOT %t = (s32[], f32[4]) tuple(%j, %y)", "ROOT %t = (s32[], f32[4], s32[]) tuple(%j, %y, %j)", "body"),
    ("%sl1 = f32[1,4] slice(%a), slice={[0:1], [0:4]}", "%sl1 = f32[1,4] slice(%a), slice={[0:1], [0:5]}",
     "out of bounds"),
])
def test_broken_text_is_reported(old, new, message):
    assert old in GOOD
    text = _UNSIGNED_RE.sub(r"\1 {", GOOD.replace(old, new))  # signatures aside: the parser checks those
    with pytest.raises(HloVerifyError, match=message):
        verify(hlo.parse(text))


_UNSIGNED_RE = re.compile(r"^((?:ENTRY )?%[\w.\-]+) \(.*\) -> .* \{$", re.M)


def test_a_signature_that_disagrees_with_the_root_is_a_parse_error():
    text = GOOD.replace("ROOT %lt = pred[] compare", "ROOT %lt = s32[] compare")
    with pytest.raises(hlo.HloParseError, match=r"declares result pred\[\] but its root %lt is s32\[\]"):
        hlo.parse(text)


def test_wrong_shape_names_the_instruction_and_shows_its_neighbourhood():
    m = _good()
    _inst(m, "d").shape = Shape("f32", (2, 4))
    with pytest.raises(HloVerifyError) as info:
        verify(m)
    text = str(info.value)
    assert "%d in %main: shape f32[2,4] does not match the inferred f32[2,3]" in text
    assert ">> %d = f32[2,4] dot(%a, %b)" in text and "%b = f32[4,3] parameter(1)" in text
    assert info.value.problems[0].instruction == "d" and info.value.problems[0].computation == "main"
    assert "verifier error(s) in module v" in text


def test_bad_operand_count():
    m = _good()
    _inst(m, "d").add_operand(_inst(m, "a"))
    assert any("takes 2 operand(s), got 3" in msg for msg in _about(_errors(m), "d"))


def test_use_def_broken_by_writing_operands_directly():
    m = _good()
    d, a, b = _inst(m, "d"), _inst(m, "a"), _inst(m, "b")
    d._operands[1] = a  # noqa: SLF001 (bypass set_operand: users are now wrong on both sides)
    problems = _errors(m)
    assert any("operand %a lists this instruction 1 time(s) among its users, but it is used 2" in msg
               for msg in _about(problems, "d"))
    assert any("lists %d as a user 1 time(s), but %d uses it 0 time(s)" in msg for msg in _about(problems, "b"))
    assert b.users == (d,)  # the verifier only reports; it changes nothing


REPEATED = """HloModule r

ENTRY %main (a: f32[4], b: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  %b = f32[4] parameter(1)
  %sq = f32[4] multiply(%a, %a)
  %t = f32[4] add(%sq, %b)
  %u = f32[4] add(%t, %t)
  %v = f32[4] clamp(%u, %u, %u)
  ROOT %w = f32[4] subtract(%v, %b)
}
"""


REPEATED_ONCE = """HloModule r1

ENTRY %main (a: f32[4], b: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  %b = f32[4] parameter(1)
  %sq = f32[4] multiply(%a, %a)
  %t = f32[4] add(%sq, %b)
  %u = f32[4] negate(%t)
  ROOT %w = f32[4] subtract(%u, %b)
}
"""


@pytest.mark.parametrize("text", [GOOD, REPEATED, REPEATED_ONCE])
def test_users_written_behind_the_irs_back_are_reported(text):
    """A users list is checked against the operand lists even where every operand list is right (the
    verifier counts the entries of a clean computation at once: each kind of stray entry must still be
    reported, with the same message, also where operands repeat)."""
    def first(m, opcode):
        return next(i for i in m.entry.instructions if i.opcode == opcode)

    cases = [
        # (users entry written, expected message): a user that does not use it, an instruction of another
        # computation, a count that is too high, a count of 0 for a real use (too low)
        (lambda m: (first(m, "parameter"), m.entry.root, 1), "uses it 0 time(s)"),
        (lambda m: (first(m, "parameter"), m.computations[-2].root, 1), "is not in this computation"),
        (lambda m: (first(m, "parameter"), first(m, "parameter").users[0], 3), "as a user 3 time(s)"),
        (lambda m: (m.entry.root.operands[0], m.entry.root, 2), "as a user 2 time(s)"),
    ]
    if text is not GOOD:  # (one computation; operands repeated)
        cases[1] = (lambda m: (m.entry.instruction("u"), m.entry.instruction("t"), 1), "uses it 0 time(s)")
    if text is REPEATED:
        cases.append((lambda m: (m.entry.instruction("u"), m.entry.root, 1), "uses it 0 time(s)"))
    for plant, message in cases:
        m = hlo.parse(text)
        assert not _errors(m)
        op, user, n = plant(m)
        if op is user:
            continue
        op._users[user] = n  # noqa: SLF001 (a private write, as a broken builder would leave it)
        assert any(message in str(p) for p in _errors(m)), (message, [str(p) for p in _errors(m)])


def test_operand_from_another_computation():
    m = _good()
    d = _inst(m, "d")
    d.set_operand(1, _inst(m, "x", "body"))
    assert any("operand %x is not in this computation (it is in %body)" in msg for msg in _about(_errors(m), "d"))


def test_out_of_order_instructions():
    m = _good()
    order = list(m.entry.instructions)
    d = _inst(m, "d")
    order.remove(d)
    order.insert(0, d)
    m.entry.instructions = order
    with pytest.raises(HloVerifyError, match="defined after its use") as info:
        verify(m)
    assert "%d" in str(info.value) and ">>" in str(info.value)


def test_forward_reference_in_text_is_out_of_order():
    m = hlo.parse("HloModule f\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(q)\n"
                  "  q = f32[4] negate(p)\n}\n")
    assert any("operand %q is defined after its use" in msg for msg in _about(_errors(m), "n"))


def test_cycle_is_reported():
    m = _good()
    _inst(m, "sl1").set_operand(0, _inst(m, "w"))  # w -> init -> v -> sl1 -> w
    messages = [p.message for p in _errors(m)]
    cycle = [msg for msg in messages if "cycle" in msg]
    assert cycle and all(f"%{n}" in cycle[0] for n in ("w", "init", "v", "sl1"))


def test_scheduled_module_order_is_checked():
    m = _good()
    m.is_scheduled = True
    order = list(m.entry.instructions)
    order[2], order[3] = order[3], order[2]  # %z before %d: still a valid schedule
    m.entry.instructions = order
    verify(m)
    order.remove(_inst(m, "d"))
    order.insert(1, _inst(m, "d"))  # the dot before its second parameter
    m.entry.instructions = order
    assert any("operand %b is defined after its use" in msg for msg in _about(_errors(m), "d"))


def test_missing_and_duplicate_parameters():
    # The parser refuses both (as XLA's does); modules edited through the API are the verifier's to catch.
    gap = GOOD.replace("%b = f32[4,3] parameter(1)", "%b = f32[4,3] parameter(2)")
    with pytest.raises(hlo.HloParseError, match="expected parameter numbers 0..1"):
        hlo.parse(gap)
    dup = GOOD.replace("%b = f32[4,3] parameter(1)", "%b = f32[4,3] parameter(0)")
    with pytest.raises(hlo.HloParseError, match="parameter number 0 is used twice"):
        hlo.parse(dup)
    m = _good()
    _inst(m, "b").attrs["parameter_number"] = 2
    assert any("missing [1]" in p.message for p in _errors(m))
    m = _good()
    _inst(m, "b").attrs["parameter_number"] = 0
    assert any("parameter number 0 is also used by %a" in msg for msg in _about(_errors(m), "b"))


def test_parameter_numbering_is_checked():
    m = _good()
    m.entry.parameter(1).attrs["parameter_number"] = 5
    m.entry._reindex_parameters()  # noqa: SLF001 (deliberately pokes internals)
    with pytest.raises(HloVerifyError, match="parameter numbers"):
        verify(m)


def test_swapped_parameter_index_is_reported():
    # Numbers 0..n-1 each once, but the computation's index maps them to each other's instructions (written
    # behind the IR's back): the same set of instructions, so only a per-number comparison sees it.
    m = _good()
    params = m.entry._params  # noqa: SLF001 (deliberately pokes internals)
    params[0], params[1] = params[1], params[0]
    assert any("parameter index does not match" in p.message for p in _errors(m))


def test_bad_while_signatures():
    m = _good()
    w = _inst(m, "w")
    w.attrs["condition"] = m.computation("cond_s32")
    assert any("the result of while condition %cond_s32 is s32[], expected pred[]" in msg
               for msg in _about(_errors(m), "w"))
    w.attrs["condition"] = m.computation("cond")
    w.attrs["body"] = m.computation("sum")
    messages = _about(_errors(m), "w")
    assert any("while body %sum takes 2 parameter(s), expected 1" in msg for msg in messages)
    assert any("the result of while body %sum is f32[]" in msg for msg in messages)


def test_bad_reduce_computation():
    m = _good()
    r = _inst(m, "r")
    r.attrs["to_apply"] = m.computation("sum_s32")
    messages = _about(_errors(m), "r")
    assert any("to_apply %sum_s32 accumulates s32 but init value 0 is f32" in msg for msg in messages)
    r.attrs["to_apply"] = m.computation("cond")
    assert any("to_apply %cond takes 1 parameter(s), expected 2" in msg for msg in _about(_errors(m), "r"))


def test_missing_callee_and_callee_not_in_module():
    m = _good()
    m.remove_computation(m.computation("body"))
    assert any("calls computation %body, which is not in the module" in msg for msg in _about(_errors(m), "w"))
    m = _good()
    del _inst(m, "w").attrs["body"]
    assert any("while needs a body computation" in msg for msg in _about(_errors(m), "w"))


def test_call_and_fusion_parameters_must_match_operands():
    m = hlo.parse("""HloModule c
%f (x: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%x)
}
ENTRY %e (p: f32[4], q: f32[3]) -> (f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %q = f32[3] parameter(1)
  %c = f32[4] call(%q), to_apply=%f
  %u = f32[4] fusion(%p, %q), kind=kLoop, calls=%f
  %v = f32[4] fusion(%q), kind=kLoop, calls=%f
  ROOT %t = (f32[4], f32[4]) tuple(%c, %u)
}
""")
    problems = _errors(m)
    assert any("parameter 0 of to_apply %f is f32[4], expected f32[3]" in msg for msg in _about(problems, "c"))
    # XLA's HloVerifier: a fused computation has exactly one parameter per fusion operand
    assert any("fused computation %f takes 1 parameter(s), but the instruction has 2 operand(s)" in msg
               for msg in _about(problems, "u"))
    assert any("parameter 0 of fused computation %f is f32[4], expected f32[3]" in msg
               for msg in _about(problems, "v"))


FUSION = """HloModule fu
%f (x: f32[4], y: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  %y = f32[4] parameter(1)
  ROOT %n = f32[4] add(%x, %y)
}
ENTRY %e (p: f32[4], q: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  ROOT %u = f32[4] fusion(%p, %q), kind=kLoop, calls=%f
}
"""


def _set_root_shape(m):
    m.computation("f").root.shape = Shape("f32", (5,))


def _swap_parameter_numbers(m):
    x, y = m.computation("f").instruction("x"), m.computation("f").instruction("y")
    dict.__setitem__(x.attrs, "parameter_number", 1)  # behind the IR's back: the index still says 0
    dict.__setitem__(y.attrs, "parameter_number", 0)


@pytest.mark.parametrize("plant, message", [
    (_set_root_shape, "the result of fused computation %f is f32[5], expected f32[4]"),
    (lambda m: setattr(m.computation("f").instruction("y"), "shape", Shape("f32", (3,))),
     "parameter 1 of fused computation %f is f32[3], expected f32[4]"),
    (lambda m: setattr(m.entry.root, "shape", Shape("f32", (3,))),
     "the result of fused computation %f is f32[4], expected f32[3]"),
    (lambda m: dict.__setitem__(m.entry.root.attrs, "calls", m.entry), "calls the computation it is in"),
    (lambda m: m.entry.root.add_operand(m.entry.instruction("p")),
     "fused computation %f takes 2 parameter(s), but the instruction has 3 operand(s)"),
    (_swap_parameter_numbers, "the computation's parameter index does not match"),
])
def test_fusion_callee_errors_are_reported(plant, message):
    """Each way a fusion's callee can be wrong is reported (pins what a shortcut for the common case of
    `_Checker.check_calls` must keep; one, `fusion_ok`, measured no faster and was dropped)."""
    m = hlo.parse(FUSION)
    assert not _errors(m)
    plant(m)
    assert any(message in str(p) for p in _errors(m)), [str(p) for p in _errors(m)]


def test_names_roots_and_entry():
    m = _good()
    _inst(m, "z").name = "a"
    assert any("name %a is used twice" in msg for msg in _about(_errors(m), "a"))
    m = _good()
    m.entry._root = _inst(m, "t", "body")  # noqa: SLF001 - a broken module set_root refuses to make
    assert any(p.instruction == "t" and "not an instruction of this computation" in p.message for p in _errors(m))
    m = _good()
    m.entry = None
    assert any("no entry computation" in p.message for p in _errors(m))


def test_control_edges():
    m = _good()
    d, out = _inst(m, "d"), _inst(m, "out")
    out.add_control_successor(d)
    assert any("control predecessor %out is defined after" in msg or "control predecessor %out does not come"
               in msg for msg in _about(_errors(m), "d"))
    m = _good()
    d, a = _inst(m, "d"), _inst(m, "a")
    d._control_preds.append(a)  # one side only  # noqa: SLF001 (deliberately pokes internals)
    assert any("does not list it as a successor" in msg for msg in _about(_errors(m), "d"))


def test_collectives_and_async_pairs():
    m = hlo.parse("""HloModule c, replica_count=4
%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %e (p: f32[8]) -> (f32[8], f32[8], f32[8], f32[8]) {
  %p = f32[8] parameter(0)
  %r1 = f32[8] all-reduce(%p), replica_groups={{0,1},{1,2}}, to_apply=%sum
  %r2 = f32[8] all-reduce(%p), replica_groups={{0,1},{2,3},{4,5}}, to_apply=%sum
  %cp = f32[8] collective-permute(%p), source_target_pairs={{0,1},{0,2}}
  %d = f32[8] all-reduce-done(%p)
  ROOT %t = (f32[8], f32[8], f32[8], f32[8]) tuple(%r1, %r2, %cp, %d)
}
""")
    problems = _errors(m)
    assert any("replica ids [1] appear in more than one place" in msg for msg in _about(problems, "r1"))
    assert any("name 6 ids, but in cross-replica mode the module has 4" in msg for msg in _about(problems, "r2"))
    assert any("source [0] appears more than once" in msg for msg in _about(problems, "cp"))
    assert any("operand %p is a parameter, which cannot start this all-reduce-done" in msg
               for msg in _about(problems, "d"))


def test_warnings_do_not_raise():
    m = _good()  # %a, %b, %p, %i ... are reused across computations
    problems = verify_report(m)
    assert problems and all(p.severity == "warning" for p in problems)
    assert str(problems[0]).startswith("warning: ")
    verify(m)


def test_report_lists_every_problem():
    m = _good()
    _inst(m, "d").shape = Shape("f32", (9,))
    _inst(m, "r").shape = Shape("s32", (2,))
    m.computation("body").instruction("y").shape = Shape("f32", (5,))
    names = {p.instruction for p in _errors(m)}
    assert {"d", "r", "y"} <= names
    with pytest.raises(HloVerifyError) as info:
        verify(m)
    assert len(info.value.problems) == len(_errors(m)) and "%y in %body" in str(info.value)


def test_lazy_top_level_names():
    assert hlo.verify is verify and hlo.HloVerifyError is HloVerifyError
    assert isinstance(hlo.parse(GOOD).computation("sum"), Computation)


# ----------------------------------------------------------------------------- checks from XLA's HloVerifier


def _module_errors(text: str) -> list[str]:
    return [f"%{p.instruction}: {p.message}" for p in _errors(hlo.parse(text))]


_COLLECTIVES = """HloModule c, replica_count=1, num_partitions=4
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %e (p: f32[2,8]) -> f32[8,8] {
  %p = f32[2,8] parameter(0)
  %ag = f32[8,8] all-gather(%p), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %cp = f32[2,8] collective-permute(%p), channel_id=2, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %ar = f32[2,8] all-reduce(%cp), channel_id=3, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add
  ROOT %rs = f32[8,8] copy(%ag)
}
"""


def test_collectives_that_xla_accepts_verify():
    assert _module_errors(_COLLECTIVES) == []


@pytest.mark.parametrize("old, new, message", [
    ("replica_groups={{0,1,2,3}}, dimensions={0}", "replica_groups={{0,1},{2,3}}, dimensions={0}",
     "all-gather over groups of 2 should change dimension 0 by a factor of 2, but 2 -> 8 is a factor of 4"),
    ("{3,0}}", "{3,4}}", "target ids [4] in source_target_pairs are not in 0..3"),
    ("replica_groups={{0,1},{2,3}}, use_global_device_ids=true", "replica_groups={}, use_global_device_ids=true",
     "replica_groups must be given in flattened-id mode"),
])
def test_collective_invariants_of_xla(old, new, message):
    assert old in _COLLECTIVES
    assert any(message in e for e in _module_errors(_COLLECTIVES.replace(old, new))), \
        _module_errors(_COLLECTIVES.replace(old, new))


_CONSTRAINED = """HloModule l, entry_computation_layout={(f32[4,4]{0,1}, f32[4]{0})->f32[4,4]{0,1}}
ENTRY %e (a: f32[4,4], t: f32[4]) -> f32[4,4] {
  %a = f32[4,4]{0,1} parameter(0)
  %t = f32[4]{0} parameter(1)
  ROOT %q = f32[4,4]{0,1} custom-call(%a, %t), custom_call_target="lapack_sorgqr_ffi", operand_layout_constraints={f32[4,4]{0,1}, f32[4]{0}}, api_version=API_VERSION_TYPED_FFI
}
"""


def test_layout_constrained_custom_call_and_entry_layout_verify():
    assert _module_errors(_CONSTRAINED) == []


@pytest.mark.parametrize("old, new, message", [
    ("f32[4,4]{0,1}, f32[4]{0}}, api", "f32[4,4]{0,1}, f32[1]{0}}, api",
     "operand_layout_constraints shape 1 is f32[1] but operand 1 is f32[4]"),
    ("f32[4,4]{0,1}, f32[4]{0}}, api", "f32[4,4]{0,1}}, api", "lists 1 shape(s) for 2 operand(s)"),
    ("f32[4,4]{0,1}, f32[4]{0}}, api", "f32[4,4]{0,1}, f32[4]}, api", "shape 1 has no layout"),
    ("{(f32[4,4]{0,1}, f32[4]{0})->", "{(f32[4,4]{0,1}, f32[5]{0})->",
     "parameter 1 is f32[4] but entry_computation_layout says f32[5]"),
    ("{(f32[4,4]{0,1}, f32[4]{0})->", "{(f32[4,4]{0,1})->", "entry_computation_layout has 1 parameter(s)"),
    ("->f32[4,4]{0,1}}", "->f32[4]{0}}", "the entry's result is f32[4,4] but entry_computation_layout says f32[4]"),
])
def test_custom_call_and_entry_layout_invariants_of_xla(old, new, message):
    assert old in _CONSTRAINED
    errors = _module_errors(_CONSTRAINED.replace(old, new))
    assert any(message in e for e in errors), errors


def test_every_corpus_module_verifies(corpus_entries):
    for entry in corpus_entries:
        assert _module_errors(entry.text) == [], entry.id


def test_collectives_may_share_a_channel_as_in_xla():
    """jax gives every collective of a shard_map channel 1; XLA checks one opcode per channel only when asked
    (HloVerifierOpts.verify_unique_channel_ids), and so do we."""
    from hlopt.hlo.verifier import verify_report
    from hlopt.runtime._xla import xla_parse

    text = _COLLECTIVES.replace("%cp = f32[2,8] collective-permute(%p), channel_id=2",
                                "%cp = f32[2,8] collective-permute(%p), channel_id=1")
    xla_parse(text)  # XLA's parser and default verifier accept it
    assert _module_errors(text) == []
    strict = [p.message for p in verify_report(hlo.parse(text), unique_channel_ids=True)]
    assert any("channel 1 is used by different kinds of channel instructions (all-gather, collective-permute)"
               in m for m in strict), strict


def test_a_send_channel_serves_only_sends_and_receives():
    text = """HloModule s
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %e (p: f32[8]) -> f32[8] {
  %p = f32[8] parameter(0)
  %tok = token[] after-all()
  %send = (f32[8], u32[], token[]) send(%p, %tok), channel_id=1
  %sd = token[] send-done(%send), channel_id=1
  ROOT %ar = f32[8] all-reduce(%p), channel_id=1, replica_groups={}, to_apply=%add
}
"""
    assert any("channel 1 is used by different kinds of channel instructions (all-reduce, send/recv)" in e
               for e in _module_errors(text)), _module_errors(text)


def test_only_callers_name_computations():
    m = hlo.parse(_COLLECTIVES)
    cp = m.entry.instruction("cp")
    cp.attrs["to_apply"] = m.computation("add")
    assert any("collective-permute does not call computations, but names %add" in e
               for e in [p.message for p in _errors(m)])


_TUPLE_SHARDED = """HloModule t, num_partitions=2
ENTRY %e (p: f32[4], q: f32[4]) -> (f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  ROOT %t = (f32[4], f32[4]) tuple(%p, %q), sharding={{replicated}, {devices=[2]<=[2]}}
}
"""


def test_a_tuple_sharding_lists_one_sharding_per_leaf():
    assert _module_errors(_TUPLE_SHARDED) == []
    short = _TUPLE_SHARDED.replace("{{replicated}, {devices=[2]<=[2]}}", "{{replicated}}")
    assert any("the sharding lists 1 leaf shardings but the shape has 2 leaves" in e for e in _module_errors(short))
    on_array = _TUPLE_SHARDED.replace("ROOT %t = (f32[4], f32[4]) tuple(%p, %q), sharding={{replicated}, "
                                      "{devices=[2]<=[2]}}", "%t = (f32[4], f32[4]) tuple(%p, %q)\n"
                                      "  ROOT %c = f32[4] copy(%p), sharding={{replicated}, {replicated}}")
    on_array = on_array.replace("-> (f32[4], f32[4])", "-> f32[4]")
    assert any("a tuple sharding (2 entries) on the non-tuple shape" in e for e in _module_errors(on_array))


# ----------------------------------------------------------------------------- remembered shape checks

_TWO_REDUCES = """HloModule two_reduces

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%{second} (c: f32[], d: f32[]) -> {root_type}[] {{
  %c = f32[] parameter(0)
  %d = f32[] parameter(1)
  ROOT %t = {root_type}[] {root_op}
}}

ENTRY %main (p: f32[4,8]) -> (f32[4], f32[4]) {{
  %p = f32[4,8]{{1,0}} parameter(0)
  %zero = f32[] constant(0)
  %r1 = f32[4]{{0}} reduce(%p, %zero), dimensions={{1}}, to_apply=%sum
  %r2 = f32[4]{{0}} reduce(%p, %zero), dimensions={{1}}, to_apply=%{second}
  ROOT %out = (f32[4]{{0}}, f32[4]{{0}}) tuple(%r1, %r2)
}}
"""


def test_shape_checks_remembered_across_callers_still_see_each_callee():
    """Two reduces alike in opcode, shapes and dimensions: the second one's shape check is remembered from the
    first only when its reducer returns the same shape; a reducer returning another type is still caught."""
    good = hlo.parse(_TWO_REDUCES.replace("{{", "{").replace("}}", "}").replace(
        "{second}", "sum2").replace("{root_type}", "f32").replace("{root_op}", "add(%c, %d)"))
    verify(good)
    bad = hlo.parse(_TWO_REDUCES.replace("{{", "{").replace("}}", "}").replace(
        "{second}", "cmp").replace("{root_type}", "pred").replace("{root_op}", "compare(%c, %d), direction=LT"))
    messages = _about(_errors(bad), "r2")
    assert "shape f32[4] does not match the inferred pred[4]" in messages  # shape inference ran for r2 itself
    assert not _about(_errors(bad), "r1")
