"""Every text XLA's printer can write, we parse: each corpus module printed by XLA with each `HloPrintOptions`
setting that changes the text, then read back by us and by XLA.

For each (module, options): when XLA's own parser accepts XLA's print, our parser must accept it too, and XLA
must read our print of it as it reads its own (canonical round trip). Prints XLA's parser itself refuses
(e.g. without operand names) are counted apart, and at least one setting per module must be parsable.
"""

from __future__ import annotations

import pytest
from test_roundtrip import xla_canonical

from hlopt import hlo

#: option name -> value different from the default (each changes the text).
SINGLE_OPTIONS: dict[str, object] = {
    "print_large_constants": True,
    "print_metadata": False,
    "print_backend_config": False,
    "print_operand_shape": False,
    "print_ids": False,
    "print_percent": False,
    "include_layout_in_shapes": False,
    "print_program_shape": False,
    "print_control_dependencies": False,
    "print_extra_attributes": False,
    "canonicalize_instruction_names": True,
    "canonicalize_computations": True,
    "compact_operands": True,
    "print_result_shape": False,
    "print_operand_names": False,
    "indent_amount": 3,
}
#: XLA's named presets.
PRESETS = ("short_parsable", "canonical", "fingerprint")
SETTINGS = [*SINGLE_OPTIONS, *PRESETS]
_DEFAULT_RUN = 12  # modules in the default run; the slow run takes every corpus module


def _options(setting: str):
    from jaxlib import _hlo

    if setting in PRESETS:
        return getattr(_hlo.HloPrintOptions, setting)()
    options = _hlo.HloPrintOptions()
    setattr(options, setting, SINGLE_OPTIONS[setting])
    return options


def _sweep(entries) -> tuple[int, list[str]]:
    """(prints checked, failures). XLA's parser runs on its own prints in a child process (some prints make
    it crash: `hlo_fuzz.xla_verdicts` restarts it past them)."""
    from hlo_fuzz import xla_verdicts
    from jaxlib import _hlo

    prints = [(entry.id, setting, _hlo.hlo_module_from_text(entry.text).to_string(_options(setting)))
              for entry in entries for setting in SETTINGS]
    verdicts = xla_verdicts([text for _, _, text in prints])
    checked, failures, parsable = 0, [], set()
    for (name, setting, text), verdict in zip(prints, verdicts, strict=True):
        if verdict != "ok":
            continue
        parsable.add(name)
        checked += 1
        try:
            ours = hlo.parse(text, filename=f"{name}[{setting}]")
        except hlo.HloParseError as e:
            failures.append(f"{name} [{setting}]: {e}")
            continue
        if xla_canonical(ours.to_text()) != xla_canonical(text):
            failures.append(f"{name} [{setting}]: XLA reads our print differently")
    failures += [f"{e.id}: no setting gave text XLA's parser takes (the sweep lost its point)"
                 for e in entries if e.id not in parsable]
    return checked, failures


def test_every_print_option_on_part_of_the_corpus(corpus_entries):
    entries = [e for e in corpus_entries if len(e.text) < 60_000][:_DEFAULT_RUN]
    checked, failures = _sweep(entries)
    assert checked >= len(entries) * 8, checked
    assert not failures, "\n".join(failures[:20])


@pytest.mark.slow
def test_every_print_option_on_the_whole_corpus(corpus_entries):
    checked, failures = _sweep(corpus_entries)
    assert not failures, "\n".join(failures[:20])
