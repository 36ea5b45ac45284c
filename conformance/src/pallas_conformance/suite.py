"""Running the catalogue for a backend, and the report (Markdown for people, JSON for
machines)."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import platform as _platform
import time
from collections.abc import Callable, Iterable

import jax

import pallas.plugins
from pallas_conformance.__about__ import __version__
from pallas_conformance.catalogue import all_cases
from pallas_conformance.levels import (
    FAIL,
    LEVELS,
    PASS,
    SKIPPED,
    STATUSES,
    UNSUPPORTED,
    CaseRunner,
    Result,
    claimed_tags,
)
from pallas_conformance.registry import TAGS, Case


def resolve_backend(name: str | None):
    """The backend called ``name`` (``None`` or ``"interpret-only"`` -> the interpreter
    level alone)."""
    if name in (None, "", "interpret-only"):
        return None
    return pallas.plugins.get_backend(name)


def select_cases(cases: Iterable[Case] | None = None, *, keyword: str | None = None,
                 tags: Iterable[str] | None = None) -> list[Case]:
    """Cases whose name contains ``keyword`` and that carry one of ``tags``."""
    cases = list(all_cases() if cases is None else cases)
    if keyword:
        cases = [c for c in cases if keyword in c.name]
    if tags:
        want = set(tags)
        unknown = want - set(TAGS)
        if unknown:
            raise ValueError(f"unknown tags {sorted(unknown)}; known: {', '.join(TAGS)}")
        cases = [c for c in cases if c.tags & want]
    return cases


@dataclasses.dataclass
class Report:
    """Every result of a run, with what was run and where."""

    backend: str
    backend_version: str
    platforms: tuple[str, ...]
    claimed: tuple[str, ...]
    backend_levels: tuple[str, ...]
    levels: tuple[str, ...]
    results: list[Result]
    cases: dict[str, Case]
    seconds: float = 0.0
    created: str = ""
    platform: str | None = None  # the platform the levels ran for (--platform)
    target: str | None = None  # the device target, when one was chosen (--target)

    @property
    def label(self) -> str:
        """``triton``, or ``triton (rocm, gfx942)`` for a run on another platform or a
        chosen target."""
        extra = []
        if self.platform and self.platforms and self.platform != self.platforms[0]:
            extra.append(self.platform)
        if self.target:
            extra.append(self.target)
        return f"{self.backend} ({', '.join(extra)})" if extra else self.backend
    # The compile level: the options its requests carried (e.g. {"chip": "v6e"}) and
    # what its artifacts say they were compiled for (e.g. ("v5e",)).
    compile_options: dict = dataclasses.field(default_factory=dict)
    compile_targets: tuple[str, ...] = ()

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def status(self, case: str, level: str) -> str | None:
        for r in self.results:
            if r.case == case and r.level == level:
                return r.status
        return None

    # -- summaries

    def counts(self) -> dict[tuple[str, str], collections.Counter]:
        """``{(tag, level): Counter(status -> n)}``; a case counts once under each tag."""
        out: dict[tuple[str, str], collections.Counter] = collections.defaultdict(
            collections.Counter)
        for r in self.results:
            for tag in self.cases[r.case].tags:
                out[(tag, r.level)][r.status] += 1
            out[("all", r.level)][r.status] += 1
        return out

    def summary_table(self) -> str:
        """The per-tag summary, one row per tag and one column per level (Markdown)."""
        counts = self.counts()
        tags = sorted({t for c in self.cases.values() for t in c.tags}) + ["all"]
        head = "| tag | cases | " + " | ".join(self.levels) + " |"
        sep = "|---|---:|" + "---|" * len(self.levels)
        rows = [head, sep]
        n_cases = collections.Counter(t for c in self.cases.values() for t in c.tags)
        n_cases["all"] = len(self.cases)
        for tag in tags:
            cells = [_cell(counts.get((tag, lv), collections.Counter())) for lv in self.levels]
            name = f"**{tag}**" if tag == "all" else tag
            rows.append(f"| {name} | {n_cases[tag]} | " + " | ".join(cells) + " |")
        return "\n".join(rows)

    def totals_line(self) -> str:
        c = collections.Counter(r.status for r in self.results)
        return ", ".join(f"{c[s]} {s}" for s in STATUSES) + f" ({self.seconds:.1f} s)"

    # -- outputs

    def to_markdown(self) -> str:
        lines = [
            f"# Pallas conformance report: `{self.backend}`"
            + (self.label[len(self.backend):] if self.label != self.backend else ""),
            "",
            f"- backend: `{self.backend}` {self.backend_version} "
            f"(platforms: {', '.join(self.platforms) or '-'}; levels: "
            f"{', '.join(self.backend_levels) or '-'})",
            *([f"- platform: {self.platform}"
               + (f"; target: {self.target}" if self.target else "")]
              if self.label != self.backend else []),
            f"- claimed tags: {', '.join(self.claimed) or '-'}",
            f"- pallas-conformance {__version__}, pallas-core {pallas.__version__}, "
            f"jax {jax.__version__}, python {_platform.python_version()}",
            f"- run: {self.created}, {self.seconds:.1f} s",
            *([f"- compile level: compiled for {', '.join(self.compile_targets) or '-'}"
               + (" (options: " + ", ".join(f"{k}={v}" for k, v in
                                            sorted(self.compile_options.items())) + ")"
                  if self.compile_options else "")] if "compile" in self.levels else []),
            f"- result: **{'PASS' if self.ok else 'FAIL'}** — {self.totals_line()}",
            "",
            "Statuses: `pass`; `fail` (a claimed case failed at a reachable level); "
            "`unsupported` (a tag of the case or the level is not claimed); `skipped` "
            "(the machine cannot reach the level, e.g. no device).",
            "",
            "## Summary by tag and level",
            "",
            self.summary_table(),
            "",
        ]
        if self.failed:
            lines += ["## Failures", "", "| case | level | detail |", "|---|---|---|"]
            for r in self.failed:
                lines.append(f"| `{r.case}` | {r.level} | {_md(r.detail)} |")
            lines.append("")
        lines += ["## Every case", "", "| case | tags | " + " | ".join(self.levels) + " |",
                  "|---|---|" + "---|" * len(self.levels)]
        by_case = collections.defaultdict(dict)
        for r in self.results:
            by_case[r.case][r.level] = r.status
        for name in sorted(by_case):
            tags = ", ".join(sorted(self.cases[name].tags))
            cells = [_status_cell(by_case[name].get(lv)) for lv in self.levels]
            lines.append(f"| `{name}` | {tags} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict:
        counts = self.counts()
        return {
            "schema": "pallas-conformance-report/1",
            "backend": self.backend,
            "backend_version": self.backend_version,
            "platforms": list(self.platforms),
            "platform": self.platform,
            "target": self.target,
            "claimed": list(self.claimed),
            "backend_levels": list(self.backend_levels),
            "levels": list(self.levels),
            "versions": {"pallas_conformance": __version__, "pallas_core": pallas.__version__,
                         "jax": jax.__version__, "python": _platform.python_version()},
            "created": self.created,
            "seconds": round(self.seconds, 3),
            "compile_options": dict(self.compile_options),
            "compile_targets": list(self.compile_targets),
            "ok": self.ok,
            "totals": dict(collections.Counter(r.status for r in self.results)),
            "summary": {f"{tag}/{lv}": dict(c) for (tag, lv), c in sorted(counts.items())},
            "cases": {name: {"tags": sorted(c.tags), "description": c.description}
                      for name, c in sorted(self.cases.items())},
            "results": [r.to_json() for r in self.results],
        }

    def write(self, path: str) -> None:
        """Writes JSON when ``path`` ends in ``.json``, Markdown otherwise."""
        with open(path, "w", encoding="utf-8") as f:
            if str(path).endswith(".json"):
                json.dump(self.to_json(), f, indent=2)
                f.write("\n")
            else:
                f.write(self.to_markdown())


def _cell(c: collections.Counter) -> str:
    if not c:
        return "-"
    parts = [f"{c[PASS]} pass"] if c[PASS] or not (c[FAIL] or c[UNSUPPORTED] or c[SKIPPED]) \
        else []
    if c[FAIL]:
        parts.append(f"**{c[FAIL]} FAIL**")
    if c[UNSUPPORTED]:
        parts.append(f"{c[UNSUPPORTED]} unsupported")
    if c[SKIPPED]:
        parts.append(f"{c[SKIPPED]} skipped")
    return ", ".join(parts)


def _status_cell(s: str | None) -> str:
    return {PASS: "pass", FAIL: "**FAIL**", UNSUPPORTED: "unsupported", SKIPPED: "skipped",
            None: "-"}[s]


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def run_suite(backend: str | None, *, levels: Iterable[str] | None = None,
              cases: Iterable[Case] | None = None,
              progress: Callable[[Result], None] | None = None,
              platform: str | None = None, target: str | None = None,
              compile_options: dict | None = None) -> Report:
    """Runs ``cases`` (default: the whole catalogue) for ``backend`` at ``levels``
    (default: ``interpret`` plus every backend level), for ``platform`` (default: the
    backend's first) and ``target`` (default: the backend's); ``compile_options`` go to
    the compile level's requests (see :class:`~pallas_conformance.levels.CaseRunner`)."""
    b = resolve_backend(backend)
    runner = CaseRunner(b, platform=platform, target=target,
                        compile_options=compile_options)
    levels = tuple(levels) if levels else runner.levels()
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad:
        raise ValueError(f"unknown levels {bad}; expected some of {', '.join(LEVELS)}")
    cases = list(all_cases() if cases is None else cases)
    t0 = time.perf_counter()
    results = []
    for c in cases:
        for lv in levels:
            r = runner.run(c, lv)
            results.append(r)
            if progress:
                progress(r)
    return Report(
        backend=b.name if b else "interpret",
        backend_version=b.version if b else pallas.__version__,
        platforms=tuple(b.platforms) if b else ("cpu",),
        claimed=tuple(sorted(claimed_tags(b if b else "interpret"))),
        backend_levels=tuple(b.levels) if b else (),
        levels=levels,
        results=results,
        cases={c.name: c for c in cases},
        seconds=time.perf_counter() - t0,
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        platform=runner.platform if b else "cpu", target=target,
        compile_options=dict(compile_options or {}),
        compile_targets=tuple(sorted(runner.compile_targets)),
    )
