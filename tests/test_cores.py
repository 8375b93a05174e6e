"""How many CPU cores the package may use, where the OS cannot say which (macOS has no sched_getaffinity)."""

from __future__ import annotations

import os

import pytest

from nmt.config import ServerLimits
from nmt.devices import usable_cores
from nmt.serve.app import make_workers
from nmt.serve.batch_decoding import TranslatorSpec


@pytest.fixture
def no_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)


def test_usable_cores_follows_the_affinity_mask_where_there_is_one():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("this OS has no affinity mask")
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_usable_cores_counts_every_core_without_an_affinity_mask(no_affinity, monkeypatch):
    assert usable_cores() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # the count cannot be determined
    assert usable_cores() == 1


def test_serve_workers_0_starts_one_worker_per_core_without_an_affinity_mask(no_affinity):
    spec = TranslatorSpec(checkpoint="unused.pt", device="cpu")
    workers = make_workers(None, ServerLimits(workers=0), spec, max_response=2**20)  # type: ignore[arg-type]
    assert [w.name for w in workers] == ["worker 0", "worker 1", "worker 2"]
    assert all(w.process is None for w in workers)  # built, not started
