"""The pytest plugin (entry point ``pytest11: pallas_conformance``).

Inactive unless ``--pallas-backend`` is given; then the session gains one test per case
and level, with the node id ``pallas-conformance::BACKEND:LEVEL:CASE``::

    pytest --pallas-backend=triton                       # every level triton provides
    pytest --pallas-backend=triton --pallas-level=lower  # one level
    pytest --pallas-backend=triton --pallas-tag=dot -k flash -n 4
    pytest --pallas-backend=triton --pallas-report=report.md

``pass`` passes; ``fail`` fails with the reason; ``unsupported`` and ``skipped`` are
reported as pytest skips whose reason starts with that word. Works with pytest-xdist.
"""

from __future__ import annotations

import json

import pytest

import pallas
from pallas_conformance.catalogue import all_cases
from pallas_conformance.levels import FAIL, LEVELS, PASS, CaseRunner, Result, claimed_tags
from pallas_conformance.suite import Report, resolve_backend, select_cases

_RUNNERS: dict[str, CaseRunner] = {}
_PROPERTY = "pallas_conformance_result"
_config = None  # this process's pytest config (set in pytest_configure)


def pytest_addoption(parser):
    group = parser.getgroup("pallas-conformance", "Pallas conformance suite")
    group.addoption("--pallas-backend", action="store", default=None, metavar="NAME",
                    help="run the Pallas conformance catalogue for this installed backend")
    group.addoption("--pallas-level", action="append", default=None, choices=LEVELS,
                    help="conformance level to run (repeatable); default: interpret and "
                         "every level the backend provides")
    group.addoption("--pallas-tag", action="append", default=None, metavar="TAG",
                    help="only conformance cases with this tag (repeatable)")
    group.addoption("--pallas-report", action="append", default=[], metavar="PATH",
                    help="write the conformance report (.json or Markdown) at the end")


class ConformanceFailure(AssertionError):
    pass


class ConformanceCollector(pytest.Collector):
    """The parent of the conformance items (node id ``pallas-conformance``)."""

    def collect(self):
        return []


class ConformanceItem(pytest.Item):
    """One case at one level for one backend."""

    def __init__(self, *, case, level, backend_name, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.level = level
        self.backend_name = backend_name
        for tag in sorted(case.tags):
            self.add_marker(pytest.mark.pallas_tag(tag))

    def _runner(self) -> CaseRunner:
        runner = _RUNNERS.get(self.backend_name)
        if runner is None:
            runner = _RUNNERS[self.backend_name] = CaseRunner(resolve_backend(self.backend_name))
        return runner

    def runtest(self):
        r = self._runner().run(self.case, self.level)
        self.user_properties.append((_PROPERTY, json.dumps(r.to_json())))
        if r.status == PASS:
            return
        if r.status == FAIL:
            raise ConformanceFailure(r.detail)
        pytest.skip(f"{r.status}: {r.detail}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ConformanceFailure):
            return (f"{self.case.name} failed at level {self.level} for backend "
                    f"{self.backend_name}: {excinfo.value}")
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"pallas-conformance::{self.name}"


def pytest_configure(config):
    global _config
    _config = config
    config.addinivalue_line("markers", "pallas_tag(tag): capability tag of a conformance case")
    if config.getoption("--pallas-report"):
        config._pallas_conformance_results = []


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    name = config.getoption("--pallas-backend")
    if not name:
        return
    backend = resolve_backend(name)  # a missing backend fails the session here, clearly
    levels = config.getoption("--pallas-level") or CaseRunner(backend).levels()
    cases = select_cases(tags=config.getoption("--pallas-tag"))
    parent = ConformanceCollector.from_parent(session, name="pallas-conformance",
                                              nodeid="pallas-conformance")
    for case in cases:
        for level in levels:
            items.append(ConformanceItem.from_parent(
                parent, name=f"{name}:{level}:{case.name}", case=case, level=level,
                backend_name=name))


def pytest_runtest_logreport(report):
    results = getattr(_config, "_pallas_conformance_results", None) if _config else None
    if results is None or report.when != "call":
        return
    for key, value in report.user_properties:
        if key == _PROPERTY:
            results.append(Result(**json.loads(value)))


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    results = getattr(config, "_pallas_conformance_results", None)
    if not results or hasattr(config, "workerinput"):  # only the xdist controller writes
        return
    name = config.getoption("--pallas-backend")
    b = resolve_backend(name)
    names = {r.case for r in results}
    levels = tuple(lv for lv in LEVELS if any(r.level == lv for r in results))
    report = Report(
        backend=b.name if b else "interpret", backend_version=b.version if b else
        pallas.__version__, platforms=tuple(b.platforms) if b else ("cpu",),
        claimed=tuple(sorted(claimed_tags(b if b else "interpret"))),
        backend_levels=tuple(b.levels) if b else (), levels=levels,
        results=sorted(results, key=lambda r: (r.case, LEVELS.index(r.level))),
        cases={c.name: c for c in all_cases() if c.name in names},
        seconds=sum(r.seconds for r in results), created="pytest session",
    )
    for path in config.getoption("--pallas-report"):
        report.write(path)
