"""Mutation fuzzing of HLO text against XLA's own parser (the oracle), for tests/test_parser_fuzz.py.

`mutants` derives malformed (and sometimes still valid) modules from real ones by small textual edits;
`xla_verdicts` asks XLA's HLO parser (jaxlib's `hlo_module_from_text`) about many modules in one child
process, restarting it past any module on which XLA's parser aborts the process; `our_verdict` is
`hlo.parse` followed by `hlo.verify`. `compare` puts the two side by side.

Run as a script for the figures: `python3 tests/hlo_fuzz.py [N] [SEED]`.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass

__all__ = ["Mutant", "mutants", "xla_verdicts", "our_verdict", "compare", "FuzzResult", "diff"]

_TOKEN_RE = re.compile(r"\s+|%?[A-Za-z_][\w.\-]*|\d+|\"(?:[^\"\\\n]|\\.)*\"|\S")
#: Fragments an edit may insert: HLO punctuation, keywords and plausible-but-wrong words.
_VOCABULARY = (
    "{", "}", "(", ")", "[", "]", ",", "=", ":", "x", "_", "-", "%", "#", "\"", "*", "0", "1", "-1", "99",
    "{}", "{0}", "{1,0}", "f32", "s32[]", "pred", "ROOT", "ENTRY", "true", "false", "dimensions={0}",
    "metadata={}", "foo=1", "index=0", "T(8)", "S(1)", "@", "?", ";", "<=", "\\", "/*c*/", "zz",
    "/*index=5*/", " ", "//c\n", "/*", "*/",
)
_EDITS = ("insert_char", "delete_span", "replace_token", "duplicate_token", "swap_tokens", "misspell",
          "change_digit", "insert_vocabulary", "delete_token")


@dataclass(frozen=True)
class Mutant:
    """A mutated module: where it comes from, which edit made it, and its text."""

    seed_id: str
    edit: str
    text: str


def _tokens(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _TOKEN_RE.finditer(text) if not text[m.start()].isspace()]


def mutate(text: str, rng: random.Random) -> tuple[str, str]:
    """One random edit of `text`: (edit name, new text)."""
    edit = rng.choice(_EDITS)
    tokens = _tokens(text)
    s, e = rng.choice(tokens)
    if edit == "insert_char":
        pos = rng.randrange(len(text) + 1)
        return edit, text[:pos] + rng.choice("{}()[],=:%#\"x_-.0123456789aZ /@<>*!") + text[pos:]
    if edit == "delete_span":
        pos = rng.randrange(len(text))
        return edit, text[:pos] + text[pos + rng.randint(1, 6):]
    if edit == "replace_token":
        s2, e2 = rng.choice(tokens)
        return edit, text[:s] + text[s2:e2] + text[e:]
    if edit == "duplicate_token":
        return edit, text[:e] + text[s:e] + text[e:]
    if edit == "swap_tokens":
        i = tokens.index((s, e))
        if i + 1 >= len(tokens):
            return edit, text[:s] + text[e:]
        s2, e2 = tokens[i + 1]
        return edit, text[:s] + text[s2:e2] + text[e:s2] + text[s:e] + text[e2:]
    if edit == "misspell":
        words = [(a, b) for a, b in tokens if text[a].isalpha() or text[a] in "%_"]
        a, b = rng.choice(words or tokens)
        i = rng.randrange(a, b)
        return edit, text[:i] + rng.choice("abcdeilmnorstuxz_") + text[i + 1:]
    if edit == "change_digit":
        digits = [m.start() for m in re.finditer(r"\d", text)]
        i = rng.choice(digits) if digits else s
        return edit, text[:i] + rng.choice("0123456789") + text[i + 1:]
    if edit == "insert_vocabulary":
        pos = rng.choice((s, e))
        return edit, text[:pos] + rng.choice(_VOCABULARY) + text[pos:]
    return edit, text[:s] + text[e:]  # delete_token


def mutants(seeds: list[tuple[str, str]], count: int, seed: int = 0) -> list[Mutant]:
    """`count` mutants of the (id, text) seeds, one or two edits each, deterministic for a given `seed`."""
    rng = random.Random(seed)
    out: list[Mutant] = []
    while len(out) < count:
        seed_id, text = seeds[len(out) % len(seeds)]
        edits = []
        for _ in range(1 if rng.random() < 0.8 else 2):
            edit, text = mutate(text, rng)
            edits.append(edit)
        out.append(Mutant(seed_id, "+".join(edits), text))
    return out


# ----------------------------------------------------------------------------- XLA's verdict (child process)

_CHILD = r"""
import json, os, sys
from jaxlib import _hlo
texts = json.load(open(sys.argv[1]))
out = os.fdopen(1, "w", buffering=1)
for i in range(int(sys.argv[2]), len(texts)):
    try:
        _hlo.hlo_module_from_text(texts[i])
        out.write(json.dumps([i, "ok"]) + "\n")
    except Exception as e:
        out.write(json.dumps([i, "reject: " + " | ".join(str(e).strip().splitlines()[1:3])[:300]]) + "\n")
"""


def xla_verdicts(texts: list[str]) -> list[str]:
    """XLA's parser on each text: "ok", "reject: <message>" or "crash" (XLA's parser aborted the process)."""
    verdicts: list[str | None] = [None] * len(texts)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(texts, f)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        start = 0
        while start < len(texts):
            proc = subprocess.run([sys.executable, "-c", _CHILD, f.name, str(start)], capture_output=True,
                                  text=True, env=env, timeout=600)
            for line in proc.stdout.splitlines():
                i, verdict = json.loads(line)
                verdicts[i] = verdict
            start = next((i for i in range(start, len(texts)) if verdicts[i] is None), len(texts))
            if start < len(texts):
                verdicts[start] = "crash"
                start += 1
    finally:
        os.unlink(f.name)
    return [v or "crash" for v in verdicts]


# ----------------------------------------------------------------------------- our verdict


def our_verdict(text: str) -> str:
    """hlo.parse then hlo.verify: "ok", "extension" (accepted only through hlopt's own syntax: an
    instruction written without its shape, `%t#0`), "parse: <message>" or "verify: <message>"."""
    from hlopt.hlo import HloParseError, HloVerifyError, parse, verify

    try:
        module = parse(text, filename="mutant.hlo")
    except HloParseError as e:
        return "parse: " + e.message
    try:
        verify(module)
    except HloVerifyError as e:
        return "verify: " + str(e.problems[0]).splitlines()[0]
    if any(inst.shape_elided for comp in module.computations for inst in comp.instructions):
        return "extension"
    return "ok"


@dataclass
class FuzzResult:
    """Mutants with both verdicts, and the counts of each combination."""

    mutants: list[Mutant]
    xla: list[str]
    ours: list[str]

    def pairs(self) -> list[tuple[Mutant, str, str]]:
        """(mutant, XLA's verdict, ours) triples."""
        return list(zip(self.mutants, self.xla, self.ours, strict=True))

    def we_accept_xla_rejects(self) -> list[tuple[Mutant, str, str]]:
        """The dangerous direction: XLA's parser rejects (or aborts) but parse + verify accept."""
        return [p for p in self.pairs() if p[1] != "ok" and p[2] == "ok"]

    def xla_accepts_we_reject(self) -> list[tuple[Mutant, str, str]]:
        """XLA's parser accepts, our parse (not our verifier) rejects."""
        return [p for p in self.pairs() if p[1] == "ok" and p[2].startswith("parse:")]

    def counts(self) -> Counter:
        """How many mutants fall in each (XLA, ours) class."""
        return Counter((x if x in ("ok", "crash") else "reject", o.split(":")[0]) for _, x, o in self.pairs())


def compare(seeds: list[tuple[str, str]], count: int, seed: int = 0) -> FuzzResult:
    """Mutate, then ask XLA and us about every mutant."""
    ms = mutants(seeds, count, seed)
    return FuzzResult(ms, xla_verdicts([m.text for m in ms]), [our_verdict(m.text) for m in ms])


def _main() -> None:
    from hlopt.corpus import use_cpu_devices

    use_cpu_devices()  # 8 CPU devices before jax loads
    from hlopt.corpus.programs import corpus_texts

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    seeds = [(e.id, e.text) for e in corpus_texts() if len(e.text) < 40_000]
    result = compare(seeds, count, seed)
    for key, n in sorted(result.counts().items()):
        print(f"xla={key[0]:7s} ours={key[1]:10s} {n}")
    bad = result.we_accept_xla_rejects()
    print(f"XLA rejects, we accept: {len(bad)} of {count}")
    print(f"XLA accepts, our parser rejects: {len(result.xla_accepts_we_reject())} of {count}")
    for m, x, _ in bad[:int(os.environ.get('SHOW', '40'))]:
        print(f"--- {m.seed_id} {m.edit}: XLA {x}\n{diff(seeds, m)}")
    for m, _, o in result.xla_accepts_we_reject()[:int(os.environ.get('SHOW', '40'))]:
        print(f"+++ {m.seed_id} {m.edit}: ours {o}\n{diff(seeds, m)}")


def diff(seeds: list[tuple[str, str]], m: Mutant) -> str:
    """The first line the mutation changed, before and after."""
    original = dict(seeds)[m.seed_id].splitlines()
    new = m.text.splitlines()
    out = []
    for a, b in zip(original, new, strict=False):
        if a != b:
            col = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            start = max(0, col - 100)
            out.append(f"  - {a[start:col + 100]}\n  + {b[start:col + 100]}")
            break
    return "\n".join(out)


if __name__ == "__main__":
    _main()
