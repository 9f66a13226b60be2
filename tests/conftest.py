"""Test configuration: 8 CPU devices for multi-device tests (set before jax is imported); corpus fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout (skip when absent)."""
    if not SHARED.exists():
        pytest.skip("../shared is not present")
    return SHARED


@pytest.fixture(scope="session")
def corpus_programs() -> list:
    """The corpus programs (tests/corpus.py): name, builder of (function, example args), devices."""
    from corpus import PROGRAMS

    return PROGRAMS


@pytest.fixture(scope="session")
def corpus_entries() -> list:
    """Every corpus module (unoptimized and XLA:CPU-optimized HLO text), generated once per session."""
    from corpus import corpus_texts

    return corpus_texts()
