"""Bad input: only HloParseError, located at file:line:col with the line, a caret and what was expected.

Deterministic sweeps (truncation at every position, deletion/swap/duplication of every token) and hypothesis
fuzzing (mutations of valid modules, random text and bytes) check that nothing but `HloParseError` (or a
valid module that prints) ever comes out of the parser.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hlopt.hlo import HloParseError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_roundtrip import MODULES, OUR_EXTENSIONS

from hlopt import hlo

VALID = """HloModule m, entry_computation_layout={(f32[4]{0}, s32[])->(f32[4]{0}, pred[])}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[4], i: s32[]) -> (f32[4], pred[]) {
  %p = f32[4]{0} parameter(0)
  %i = s32[] parameter(1)
  %c = f32[] constant(1.5)
  %b = f32[4]{0} broadcast(%c), dimensions={}, metadata={op_name="x/y" source_line=3}
  %m = f32[4]{0} multiply(%p, %b)
  %r = f32[] reduce(%m, %c), dimensions={0}, to_apply=%add
  %lt = pred[] compare(%r, %c), direction=LT
  %sl = f32[2]{0} slice(%m), slice={[0:2]}
  %d = f32[4]{0} dynamic-update-slice(%m, %sl, %i)
  ROOT %t = (f32[4]{0}, pred[]) tuple(%d, %lt)
}
"""

#: Every valid module the fuzzers start from.
SEEDS: list[str] = [VALID, *MODULES.values(), *OUR_EXTENSIONS.values()]
_TOKEN_RE = re.compile(r"\s+|%?[A-Za-z_][\w.\-]*|\d+|\S", re.S)


def _error(text: str, filename: str = "bad.hlo") -> HloParseError:
    with pytest.raises(HloParseError) as info:
        hlo.parse(text, filename=filename)
    check_located(info.value, text, filename)
    return info.value


def check_located(err: HloParseError, text: str, filename: str) -> None:
    """The error names the file, a real line and column, shows that line and puts a caret under the column."""
    lines = text.split("\n")
    assert err.filename == filename
    assert 1 <= err.line <= len(lines)
    assert err.source_line == lines[err.line - 1]
    assert 1 <= err.col <= len(err.source_line) + 1
    rendered = str(err).split("\n")
    assert rendered[0] == f"{filename}:{err.line}:{err.col}: error: {err.message}"
    assert rendered[1] == err.source_line
    assert rendered[2] == " " * (err.col - 1) + "^"
    assert err.message and "\n" not in err.message


def parse_or_error(text: str, filename: str = "fuzz.hlo") -> HloParseError | None:
    """Parse; the only acceptable outcomes are a module that prints or a located HloParseError."""
    try:
        module = hlo.parse(text, filename=filename)
    except HloParseError as e:
        check_located(e, text, filename)
        return e
    module.to_text()
    return None


# ----------------------------------------------------------------------------- each error, exactly located


@pytest.mark.parametrize(
    "old, new, message, line, at",
    [
        ("multiply(%p, %b)", "multiply(%p, %nope)", "operand %nope is not defined", 14, "%nope"),
        ("f32[4]{0} multiply", "f33[4]{0} multiply", "unknown primitive type 'f33'", 14, "f33"),
        ("multiply(%p, %b)", "multiplyy(%p, %b)", "unknown opcode 'multiplyy'", 14, "multiplyy"),
        ("to_apply=%add", "to_apply=%sub", "computation %sub is not defined", 15, "%sub"),
        ("dimensions={0}, to_apply", "dimensions={0,x}, to_apply", "expected a list of integers for dimensions",
         15, "{0,x}"),
        ("%p = f32[4]{0} parameter(0)", "%p = f32[4]{0} parameter(x)", "expected the parameter number", 10, "x)"),
        ("direction=LT", "direction=LT, direction=GT", "attribute 'direction' is given twice", 16, "direction=GT"),
        ('op_name="x/y"', 'op_name="x/y', "expected '\"' to end this string", 13, '"x/y'),
        ("slice={[0:2]}", "slice={[0:2]", "expected '}' to close this '{'", 17, "{[0:2]"),
        ("%lt = pred[]", "%m = pred[]", "defined twice", 16, "%m = pred"),
        ("%m = f32[4]{0} multiply", "%m f32[4]{0} multiply", "expected '=' after the instruction name", 14,
         "f32[4]{0} multiply"),
        ("multiply(%p, %b)", "multiply(%p %b)", "expected ',' or ')' in the operand list", 14, "%b)"),
        ("f32[4]{0} multiply", "f32[4,]{0} multiply", "expected a dimension size", 14, "4,]"),
        ("f32[4]{0} multiply", "f32[4]{x} multiply", "expected a minor-to-major list", 14, "x}"),
        ("f32[4]{0} multiply", "f32[4]{0:e(1)} multiply", "expected a layout item", 14, "0:e(1)"),
        ("f32[4]{0} multiply", "f32[4]{0:T(8,x)} multiply", "expected tile sizes", 14, "0:T"),
        ("%d = f32[4]{0} dynamic", "%d = f32[4]{0 dynamic", "expected '}' to close the layout", 18, "{0 dynamic"),
        ("(f32[4]{0}, pred[]) tuple", "(f32[4]{0} pred[]) tuple", "expected ',' or ')' in tuple shape", 19,
         "pred[]) tuple"),
        ("%c = f32[] constant(1.5)", "%c = constant(1.5)", "a constant needs its shape", 12, "constant(1.5)"),
        ("%c = f32[] constant(1.5)", "%c = f32[] constant(1.5", "expected ')' after the literal", 12, ""),
        ("%i = s32[] parameter(1)", "%i = s32[] parameter(0)", "parameter number 0 is used twice", 11, "0)"),
        ("%i = s32[] parameter(1)", "%i = s32[] parameter(2)", "expected parameter numbers 0..1", 11, "2)"),
        ("ROOT %t", "ROOT %t2 = pred[] not(%lt)\n  ROOT %t", "has two ROOT instructions", 20, "ROOT %t ="),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} multiply(%p, %b), control-predecessors={%zz}",
         "control predecessor %zz is not defined", 14, "{%zz}"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} multiply(%p, %b), 7=1",
         "expected 'attribute=value'", 14, "7=1"),
        ("%r = f32[] reduce(%m, %c), dimensions={0}", "%r = f32[] reduce(%m, %c), dimensions=, x=1",
         "expected an attribute value", 15, ", x=1"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%f32 = f32[4]{0} multiply(%p, %b)", "it is a primitive type", 14,
         "%f32"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} reduce-window(%p, %c), window={size=2 pad=1}",
         "expected pad=lo_hi", 14, "{size=2"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} all-reduce(%p), replica_groups={{0,1}{2}}",
         "expected replica groups like", 14, "{{0,1}{2}}"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} pad(%p, %c), padding=1_2_3_4",
         "expected lo_hi[_interior]", 14, "1_2_3_4"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} get-tuple-element(%p), index=x",
         "expected an integer for index", 14, "x"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} sort(%p), is_stable=yes",
         "expected true or false", 14, "yes"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} multiply(%p, %b), metadata={op_name}",
         "expected key=value in metadata", 14, "{op_name}"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} multiply(%p, %b), frontend_attributes={a}",
         "expected key=\"value\" in frontend_attributes", 14, "{a}"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} conditional(%i), branch_computations=%add",
         "expected '{%comp, ...}'", 14, "%add"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} multiply(%p#x, %b)",
         "expected a tuple index after '#'", 14, "#x"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = f32[4]{0} multiply(%p#1, %b)",
         "cannot infer the shape of %p.gte", 14, "%p#1"),
        ("%m = f32[4]{0} multiply(%p, %b)", "%m = broadcast(%p), dimensions={0}",
         "cannot infer the shape of %m", 14, "broadcast"),
        ("ENTRY %main (p: f32[4], i: s32[])", "ENTRY %main (p: f32[4], i: s32[]", "expected ',' or ')' in the "
         "parameter list", 9, "-> (f32[4]"),
        ("ENTRY %main (p: f32[4], i: s32[]) -> (f32[4], pred[]) {", "ENTRY %main (p: f32[4], i: s32[]) -> "
         "(f32[4], pred[])", "expected '{' to start the computation body", 10, "%p = "),
        ("HloModule m,", "HloModule m, replica_count=x,", "expected an integer", 1, "x,"),
        ("HloModule m,", "HloModule m, is_scheduled=maybe,", "expected true or false", 1, "maybe,"),
        ("HloModule m,", "HloModule m, 1=2,", "expected 'key=value' in the HloModule line", 1, "1=2"),
        ("HloModule m,", "HloModule ,", "expected the module name", 1, ","),
        ("%add (a: f32[]", "ENTRY %add (a: f32[]", "one ENTRY computation; found a second", 21, ""),
        ("\n\n%add (a", "\n\nFileNamesX\n1 \"a\"\n\n%add (a", "expected 'FileNames'", 3, "FileNamesX"),
    ],
)
def test_errors_point_at_the_problem(old: str, new: str, message: str, line: int, at: str) -> None:
    assert old in VALID
    text = VALID.replace(old, new, 1)
    err = _error(text)
    assert message in err.message, err.message
    assert err.line == line, str(err)
    assert err.source_line[err.col - 1 :].startswith(at), str(err)


def test_error_column_is_exact() -> None:
    err = _error(VALID.replace("multiply(%p, %b)", "multiply(%p, %nope)"))
    assert (err.line, err.col) == (14, 31)
    assert err.source_line[err.col - 1 :].startswith("%nope")


def test_missing_header_and_empty_input() -> None:
    assert "expected 'HloModule'" in _error("c { ROOT x = f32[] constant(0) }").message
    assert "expected 'HloModule'" in _error("").message
    assert "expected at least one computation" in _error("HloModule m").message
    assert "has no instructions" in _error("HloModule m\nENTRY e {\n}").message
    assert "expected '}' to close the computation" in _error("HloModule m\nENTRY e {\n p = f32[] parameter(0)").message


def test_nesting_too_deep_is_an_error_not_a_recursion_error() -> None:
    deep_tuple = "HloModule m\nENTRY e {\n  ROOT p = " + "(" * 500 + "f32[]" + ")" * 500 + " parameter(0)\n}"
    assert "nested more than" in _error(deep_tuple).message
    deep_operands = "HloModule m\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT n = f32[] " + "negate(" * 500 + "p" + \
        ")" * 500 + "\n}"
    assert "nested more than" in _error(deep_operands).message
    deep_calls = "HloModule m\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=" + \
        "{\n x = f32[] parameter(0)\n ROOT c = f32[] call(x), to_apply=" * 300 + "{ ROOT y = f32[] parameter(0) }" + \
        "\n}" * 300 + "\n}"
    assert "nested more than" in _error(deep_calls).message
    ok = "HloModule m\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT n = f32[] " + "negate(" * 40 + "p" + ")" * 40 + "\n}"
    assert hlo.parse(ok).entry.root.opcode == "negate"


def test_parse_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.hlo"
    path.write_text(VALID.replace("multiply(%p, %b)", "multiply(%p, %nope)"))
    with pytest.raises(HloParseError) as info:
        hlo.parse_file(path)
    assert str(info.value).startswith(f"{path}:14:31: error: operand %nope is not defined")


def test_valid_module_parses() -> None:
    assert hlo.parse(VALID).entry.root.opcode == "tuple"


def test_error_is_a_value_error_with_attributes() -> None:
    err = _error(VALID.replace("%add", "%nope", 1))
    assert isinstance(err, ValueError)
    assert (err.filename, err.line) == ("bad.hlo", 15) and err.col > 1


# ----------------------------------------------------------------------------- deterministic sweeps


def test_truncation_at_every_character_says_what_was_expected() -> None:
    for n in range(len(VALID)):
        err = parse_or_error(VALID[:n])
        if err is not None:
            assert "expected" in err.message, (n, str(err))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_truncation_at_every_token(name: str) -> None:
    text = MODULES[name]
    pos = 0
    for token in _TOKEN_RE.findall(text):
        pos += len(token)
        err = parse_or_error(text[:pos])
        if err is not None and pos < len(text.rstrip()):
            assert "expected" in err.message or "cannot infer" in err.message, (pos, str(err))


def test_every_token_deleted_swapped_or_doubled() -> None:
    tokens = _TOKEN_RE.findall(VALID)
    for i in range(len(tokens)):
        parse_or_error("".join(tokens[:i] + tokens[i + 1 :]))
        parse_or_error("".join(tokens[: i + 1] + tokens[i:]))
        if i + 1 < len(tokens):
            parse_or_error("".join(tokens[:i] + [tokens[i + 1], tokens[i]] + tokens[i + 2 :]))


# ----------------------------------------------------------------------------- hypothesis fuzzing

_PUNCT = "{}()[],=%\"'<>:/*#!?\\;-._\n\t "


@st.composite
def _mutated(draw: st.DrawFn, seeds: list[str]) -> str:
    """A valid module with a few random edits: truncation, token deletion/swap/duplication/replacement,
    inserted punctuation or bytes, a deleted span."""
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 3))):
        tokens = _TOKEN_RE.findall(text) or [""]
        i = draw(st.integers(0, len(tokens) - 1))
        kind = draw(st.sampled_from(["truncate", "delete", "swap", "double", "replace", "insert", "span", "byte"]))
        if kind == "truncate":
            text = text[: draw(st.integers(0, len(text)))]
        elif kind == "delete":
            text = "".join(tokens[:i] + tokens[i + 1 :])
        elif kind == "swap" and i + 1 < len(tokens):
            text = "".join(tokens[:i] + [tokens[i + 1], tokens[i]] + tokens[i + 2 :])
        elif kind == "double":
            text = "".join(tokens[: i + 1] + tokens[i:])
        elif kind == "replace":
            text = "".join(tokens[:i] + [draw(st.sampled_from(tokens))] + tokens[i + 1 :])
        elif kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.text(alphabet=_PUNCT + "abxyzf0123456789", min_size=1, max_size=4)) + text[at:]
        elif kind == "span":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        else:
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.binary(min_size=1, max_size=3)).decode("latin-1") + text[at:]
    return text


_FUZZ = st.one_of(
    _mutated(SEEDS),
    st.text(max_size=200),
    st.text(alphabet=_PUNCT + "HloModuleENTRYROOTf32[]s0123456789 ", max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.binary(max_size=200).map(lambda b: "HloModule m\nENTRY e {\n" + b.decode("latin-1")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_FUZZ)
def test_fuzz_only_parse_errors(text: str) -> None:
    parse_or_error(text)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(st.data())
def test_fuzz_only_parse_errors_long(data: st.DataObject) -> None:
    from hlopt.corpus.programs import corpus_texts

    seeds = [e.text for e in corpus_texts()][::3] + SEEDS
    parse_or_error(data.draw(st.one_of(_mutated(seeds), _FUZZ)))


def test_a_bad_execution_thread_is_a_located_parse_error() -> None:
    """A computation's `execution_thread` takes one quoted string (found by fuzzing: a doubled '=' used to
    escape as a plain ValueError)."""
    text = VALID.replace("ROOT %s = f32[] add(%a, %b)\n}", 'ROOT %s = f32[] add(%a, %b)\n}, execution_thread=="x"')
    err = _error(text)
    assert "execution_thread" in str(err) and err.line == 7
    threaded = hlo.parse(text.replace('=="x"', '="x"'))
    assert threaded.computation("add").execution_thread == "x"


def test_stablehlo_text_gets_a_hint() -> None:
    text = 'module @jit_f attributes {mhlo.num_partitions = 1 : i32} {\n  func.func public @main() {\n  }\n}\n'
    message = _error(text).message
    assert "StableHLO" in message and "dialect='hlo'" in message
