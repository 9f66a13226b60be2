"""Test configuration: 8 CPU devices for multi-device tests (set before jax is imported); corpus fixtures."""

from __future__ import annotations

from pathlib import Path

from hlopt.corpus import use_cpu_devices

use_cpu_devices()  # 8 CPU devices for the multi-device tests, JAX_PLATFORMS=cpu: before jax is imported

import pytest  # noqa: E402 - after the device flags

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout (skip when absent)."""
    if not SHARED.exists():
        pytest.skip("../shared is not present")
    return SHARED


@pytest.fixture(scope="session")
def corpus_programs() -> list:
    """The corpus programs (hlopt.corpus.programs): name, builder of (function, example args), devices."""
    from hlopt.corpus.programs import PROGRAMS

    return PROGRAMS


@pytest.fixture(scope="session")
def corpus_entries() -> list:
    """Every corpus module (unoptimized and XLA:CPU-optimized HLO text), generated once per session."""
    from hlopt.corpus.programs import corpus_texts

    return corpus_texts()
