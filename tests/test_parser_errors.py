"""Bad input: only HloParseError, located at file:line:col with the line, a caret and what was expected."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hlo
from hlo import HloParseError

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


def _error(text: str) -> HloParseError:
    with pytest.raises(HloParseError) as info:
        hlo.parse(text, filename="bad.hlo")
    return info.value


@pytest.mark.parametrize(
    "old, new, message, line",
    [
        ("multiply(%p, %b)", "multiply(%p, %nope)", "operand %nope is not defined", 14),
        ("f32[4]{0} multiply", "f33[4]{0} multiply", "unknown primitive type 'f33'", 14),
        ("multiply(%p, %b)", "multiplyy(%p, %b)", "unknown opcode 'multiplyy'", 14),
        ("to_apply=%add", "to_apply=%sub", "computation %sub is not defined", 15),
        ("dimensions={0}, to_apply", "dimensions={0,x}, to_apply", "bad value for attribute 'dimensions'", 15),
        ("%p = f32[4]{0} parameter(0)", "%p = f32[4]{0} parameter(x)", "expected the parameter number", 10),
        ("direction=LT", "direction=LT, direction=GT", "attribute 'direction' is given twice", 16),
        ('op_name="x/y"', 'op_name="x/y', "unterminated string", 13),
        ("slice={[0:2]}", "slice={[0:2]", "unbalanced bracket", 17),
        ("%lt = pred[]", "%m = pred[]", "defined twice", 16),
    ],
)
def test_errors_point_at_the_problem(old, new, message, line):
    assert old in VALID
    err = _error(VALID.replace(old, new, 1))
    assert message in err.message, err.message
    assert err.filename == "bad.hlo" and err.line == line
    text = str(err)
    assert text.startswith(f"bad.hlo:{line}:{err.col}: error:")
    assert text.splitlines()[-1].strip() == "^"
    assert text.splitlines()[1] == VALID.replace(old, new, 1).splitlines()[line - 1]


def test_error_column_is_exact():
    err = _error(VALID.replace("multiply(%p, %b)", "multiply(%p, %nope)"))
    assert err.source_line[err.col - 1 :].startswith("%nope")


def test_missing_header_and_empty_input():
    assert "HloModule" in _error("ENTRY e { ROOT x = f32[] constant(0) }").message
    assert "HloModule" in _error("").message
    assert "at least one computation" in _error("HloModule m").message


def test_valid_module_parses():
    assert hlo.parse(VALID).entry.root.opcode == "tuple"


def _mutations():
    lines = VALID.splitlines(keepends=True)
    tokens = VALID.split(" ")
    return st.one_of(
        st.integers(0, len(VALID)).map(lambda n: VALID[:n]),
        st.tuples(st.integers(0, len(tokens) - 1)).map(lambda t: " ".join(tokens[: t[0]] + tokens[t[0] + 1 :])),
        st.tuples(st.integers(0, len(tokens) - 2)).map(
            lambda t: " ".join(tokens[: t[0]] + [tokens[t[0] + 1], tokens[t[0]]] + tokens[t[0] + 2 :])),
        st.tuples(st.integers(0, len(lines) - 1)).map(lambda t: "".join(lines[: t[0]] + lines[t[0] + 1 :])),
        st.tuples(st.integers(0, len(VALID)), st.text(alphabet="{}()[],=%\"'<>:/*#ab01 \n", max_size=4)).map(
            lambda t: VALID[: t[0]] + t[1] + VALID[t[0] :]),
        st.text(max_size=200),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_fuzz_only_parse_errors(text):
    try:
        module = hlo.parse(text, filename="fuzz.hlo")
    except HloParseError as e:
        assert e.line >= 1 and e.col >= 1
        return
    module.to_text()  # whatever parses must print
