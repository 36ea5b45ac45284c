"""The catalogue, run for the interpreter and for every installed backend.

One test per (backend, level, case) that the backend claims: the interpreter level for
every case the interpreter claims, and each level every installed backend provides for
the cases it claims. A backend package that lands in the workspace gets its rows here
without any change to this file. Unclaimed cases are not collected (the CLI and the
pytest plugin report them as ``unsupported``); a level the machine cannot reach skips.

``PALLAS_CONFORMANCE_BACKENDS=interpret,triton`` restricts the backends (default: every
installed backend). A (backend, level) in :data:`SAMPLED` is too slow to run on every
claimed case in CI: there, one case per claimed tag (of those with the fewest tags, the
first by name) stands for it;
the GPU cases (tags in :data:`SAMPLED_TAGS`) are sampled at every level, the fewest
cases that carry all those tags between them; the cases in :data:`SLOW_CASES` are left
out;
``PALLAS_CONFORMANCE_FULL=1`` runs them all (the CLI always does).
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
    UNSUPPORTED,
    CaseRunner,
    all_cases,
    claimed_tags,
    get_case,
)
from pallas_conformance.levels import interpreter_claims

# (backend, level) pairs run on one case per claimed tag unless PALLAS_CONFORMANCE_FULL=1:
# executing Mosaic GPU's generated code takes ~1 s a case on CPU (~7 min for all of them);
# the TPU compile level runs libtpu, the real compiler, in a child process (seconds to
# start, 0.1-1 s a kernel; pallas-conformance --level compile runs every case).
SAMPLED = {("mosaic_gpu", "emulate"), ("mosaic_tpu", "compile"),
           ("mosaic_sparsecore", "compile")}
# Cases carrying one of these tags (the GPU cases, whose reference runs in GPU interpret
# mode, seconds each) are sampled at every (backend, level), the interpreter level
# included, unless PALLAS_CONFORMANCE_FULL=1: a few that carry all of them between them
# (today the warp-specialised wgmma matmul and the cluster multicast load).
SAMPLED_TAGS = frozenset({"warpgroups", "tma_pipelines", "wgmma", "clusters"})

# (backend, platform) pairs beyond a backend's first platform that CI runs, at lower,
# compile and emulate, on a few cases (all claimed ones with PALLAS_CONFORMANCE_FULL=1);
# the CLI (--platform) runs them all. Triton on AMD: MFMA dots, an atomic, libdevice
# (ocml on AMD) and a K loop with a scratch accumulator.
OTHER_PLATFORMS = {("triton", "rocm"): ("dot/f16_to_f16", "atomics/add_returns_old_f32",
                                        "elementwise/digamma_f32",
                                        "dot/accumulate_over_grid_in_scratch_bf16")}

# Cases of the sampled TPU compile level that libtpu rejects today (issue 27: the real
# compiler rejects some of what the TPU backends pass at lower/emulate; the lowering
# work drives this list to empty). Strict: a case that starts to compile fails
# here until its line is removed. The CLI reports every such case as a failure.
KNOWN_COMPILE_FAILURES: dict[tuple[str, str], str] = {}

# Cases too slow for CI at any level (minutes on 2 cores: the grid-KV flash-attention
# backward is six kernels, each traced, lowered and run per level); the CLI and
# PALLAS_CONFORMANCE_FULL=1 run them.
SLOW_CASES = {"grad/flash_attention_grid_kv"}


def _sample(cases, claims) -> set[str]:
    """One case per claimed tag: of the claimed cases carrying it, one with the fewest tags
    (the simplest), the first by name."""
    picked = set()
    ordered = sorted(cases, key=lambda c: (len(c.tags), c.name))
    for tag in sorted(claims):
        first = next((c.name for c in ordered if tag in c.tags), None)
        if first is not None:
            picked.add(first)
    return picked


def _cover(cases, tags) -> set[str]:
    """Few cases that carry every tag of ``tags`` between them: greedily the case with
    the most tags not yet covered (the first by name)."""
    picked, left = set(), set(tags)
    while left:
        best = max(sorted(cases, key=lambda c: c.name), key=lambda c: len(c.tags & left),
                   default=None)
        if best is None or not best.tags & left:
            break
        picked.add(best.name)
        left -= best.tags
    return picked


def _params():
    params = []
    full = os.environ.get("PALLAS_CONFORMANCE_FULL", "") not in ("", "0")
    cases = all_cases()
    if not full:
        keep = _cover([c for c in cases if c.tags & SAMPLED_TAGS], SAMPLED_TAGS)
        cases = [c for c in cases if not c.tags & SAMPLED_TAGS or c.name in keep]
        cases = [c for c in cases if c.name not in SLOW_CASES]
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
            claimed = [c for c in cases if c.tags <= claims]
            if (b.name, level) in SAMPLED and not full:
                keep = _sample(claimed, claims)
                claimed = [c for c in claimed if c.name in keep]
            for c in claimed:
                known = KNOWN_COMPILE_FAILURES.get((b.name, c.name)) if level == "compile" \
                    else None
                marks = [pytest.mark.xfail(strict=True, reason=f"libtpu: {known}")] \
                    if known and not full else []
                params.append(pytest.param(b.name, level, c.name, marks=marks,
                                           id=f"{b.name}:{level}:{c.name}"))
            for platform in b.platforms[1:]:
                if (b.name, platform) not in OTHER_PLATFORMS or level not in (
                        "lower", "compile", "emulate"):
                    continue
                few = claimed
                if not full:
                    few = [c for c in claimed if c.name in OTHER_PLATFORMS[b.name, platform]]
                for c in few:
                    params.append(pytest.param(f"{b.name}@{platform}", level, c.name,
                                               id=f"{b.name}@{platform}:{level}:{c.name}"))
    return params


_RUNNERS: dict[str, CaseRunner] = {}


def _runner(name: str) -> CaseRunner:
    """The runner of ``backend`` or ``backend@platform``."""
    if name not in _RUNNERS:
        backend, _, platform = name.partition("@")
        _RUNNERS[name] = CaseRunner(pallas.plugins.get_backend(backend),
                                    platform=platform or None)
    return _RUNNERS[name]


@pytest.mark.parametrize("backend,level,case_name", _params())
def test_conformance(backend, level, case_name):
    r = _runner(backend).run(get_case(case_name), level)
    if r.status == FAIL:
        pytest.fail(f"{backend} fails {case_name} at level {level}: {r.detail}", pytrace=False)
    if r.status in (SKIPPED, UNSUPPORTED):  # UNSUPPORTED: LevelUnsupportedError's reason
        pytest.skip(r.detail)
    assert r.status == PASS, r
