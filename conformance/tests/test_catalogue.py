"""The catalogue, run for the interpreter and for every installed backend.

One test per (backend, level, case) that the backend claims: the interpreter level for
every case the interpreter claims, and each level every installed backend provides for
the cases it claims. A backend package that lands in the workspace gets its rows here
without any change to this file. Unclaimed cases are not collected (the CLI and the
pytest plugin report them as ``unsupported``); a level the machine cannot reach skips.

``PALLAS_CONFORMANCE_BACKENDS=interpret,triton`` restricts the backends (default: every
installed backend).
"""

from __future__ import annotations

import os

import pytest

import pallas.plugins
from pallas_conformance import (
    BACKEND_LEVELS,
    FAIL,
    PASS,
    SKIPPED,
    CaseRunner,
    all_cases,
    claimed_tags,
    get_case,
)
from pallas_conformance.levels import interpreter_claims


def _params():
    params = []
    cases = all_cases()
    for c in cases:
        if c.tags <= interpreter_claims():
            params.append(pytest.param("interpret", "interpret", c.name,
                                       id=f"interpret:interpret:{c.name}"))
    only = {n for n in os.environ.get("PALLAS_CONFORMANCE_BACKENDS", "").split(",") if n}
    for b in pallas.plugins.list_backends():
        if only and b.name not in only:
            continue
        claims = claimed_tags(b)
        for level in BACKEND_LEVELS:
            if level not in b.levels:
                continue
            for c in cases:
                if c.tags <= claims:
                    params.append(pytest.param(b.name, level, c.name,
                                               id=f"{b.name}:{level}:{c.name}"))
    return params


_RUNNERS: dict[str, CaseRunner] = {}


def _runner(name: str) -> CaseRunner:
    if name not in _RUNNERS:
        _RUNNERS[name] = CaseRunner(pallas.plugins.get_backend(name))
    return _RUNNERS[name]


@pytest.mark.parametrize("backend,level,case_name", _params())
def test_conformance(backend, level, case_name):
    r = _runner(backend).run(get_case(case_name), level)
    if r.status == FAIL:
        pytest.fail(f"{backend} fails {case_name} at level {level}: {r.detail}", pytrace=False)
    if r.status == SKIPPED:
        pytest.skip(r.detail)
    assert r.status == PASS, r
