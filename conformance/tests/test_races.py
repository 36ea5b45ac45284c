"""Planted races are reported by every backend with a race-detecting interpret mode, and
their race-free twins are not (and compute the right numbers)."""

from __future__ import annotations

import pytest

from pallas_conformance.races import RACE_CASES, race_backends, run_race_case

BACKENDS = race_backends()


def test_pallas_tpu_offers_a_race_kit():
    assert "mosaic_tpu" in [b.name for b in BACKENDS]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("case", RACE_CASES, ids=lambda c: c.name)
def test_planted_race_is_reported_and_its_twin_is_not(case, backend):
    assert run_race_case(case, backend, racy=True), f"{case.description}: not reported"
    assert not run_race_case(case, backend, racy=False), f"{case.name}: false positive"
