"""priority-fusion and multi-output-fusion make the same decisions as the code the golden was written
from (tests/fusion_golden.py: structure of every fusion, names aside) on the corpus and the benchmarks'
transformer steps. A deliberate change of decisions rewrites the golden with that script."""

from __future__ import annotations

import json

import pytest
from fusion_golden import GOLDEN, fused, golden_inputs, input_digest

_GOLDEN = json.loads(GOLDEN.read_text())
_INPUTS = golden_inputs()


def test_the_golden_covers_every_input():
    assert sorted(_GOLDEN["modules"]) == sorted(name for name, _ in _INPUTS)


@pytest.mark.parametrize(("name", "text"), _INPUTS, ids=[name for name, _ in _INPUTS])
def test_same_fusions_as_the_golden(name, text):
    want = _GOLDEN["modules"][name]
    if want["input"] != input_digest(text):
        import jax

        pytest.skip(f"{name}: the input differs from the golden's (jax {jax.__version__}, golden from jax "
                    f"{_GOLDEN['jax']}): rewrite it with tests/fusion_golden.py from trusted code")
    got = fused(text)
    missing = sorted(set(want["fusions"]) - set(got))
    extra = sorted(set(got) - set(want["fusions"]))
    assert got == want["fusions"], f"{name}: {len(missing)} golden fusions not made, {len(extra)} new ones"
