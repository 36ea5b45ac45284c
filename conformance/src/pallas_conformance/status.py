"""The "Backend status" page: one table per backend and level, from published reports.

A backend release publishes its report with ``pallas-conformance --backend NAME --report
NAME.json``; :func:`render_status` turns a folder of such JSON reports into Markdown (the
docs site runs it at build time, see ``tools/docs_status_hook.py``). Where a folder holds
several reports of one backend, the newest version (then the newest run) is shown; its
runs on a device, and for another platform or target (``--platform rocm --target
gfx942``), are shown beside it.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable

SCHEMA = "pallas-conformance-report/1"
_ORDER = ("pass", "fail", "unsupported", "skipped")


def _variant(data: dict) -> tuple[str, str, str]:
    """(backend, platform, target): a backend's runs for other platforms or targets
    (``--platform rocm --target gfx942``) are shown beside its main report."""
    platforms = data.get("platforms") or [""]
    return (data["backend"], data.get("platform") or platforms[0], data.get("target") or "")


def label(data: dict) -> str:
    """``triton``, or ``triton (rocm, gfx942)`` for a run on another platform or for a
    chosen target."""
    backend, platform, target = _variant(data)
    extra = [platform] if platform != (data.get("platforms") or [platform])[0] else []
    extra += [target] if target else []
    return f"{backend} ({', '.join(extra)})" if extra else backend


def _suffix(data: dict) -> str:
    """`` (rocm, gfx942)`` for a run on another platform or target, else nothing."""
    text = label(data)
    return text[len(data["backend"]):] if text != data["backend"] else ""


def load_reports(paths: Iterable[str]) -> list[dict]:
    """The newest report per backend among ``paths`` (JSON files or folders of them),
    and the newest run of it on a device (level ``execute`` alone), sorted by backend
    name. Files of another schema raise ``ValueError`` naming them."""
    files: list[str] = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*.json"))) if os.path.isdir(p) else [p]
    newest: dict[tuple, dict] = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            data = json.load(fh)
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{f}: not a pallas-conformance report (schema "
                             f"{data.get('schema')!r}, expected {SCHEMA!r})")
        key = (_version_key(data["backend_version"]), data.get("created", ""))
        # A run on a device (a bundle's run_bundle.py: level execute only) is shown
        # beside the backend's CPU levels, not instead of them.
        # So is a run for another platform or target (triton on rocm, gfx942).
        slot = (*_variant(data), _on_device(data))
        old = newest.get(slot)
        if old is None or key > (_version_key(old["backend_version"]), old.get("created", "")):
            newest[slot] = data
    return sorted(newest.values(), key=lambda d: (d["backend"], bool(_suffix(d)),
                                                  label(d), _on_device(d)))


def _on_device(data: dict) -> bool:
    return list(data.get("levels", [])) == ["execute"]


def _title(data: dict) -> str:
    device = data.get("device", {}).get("kind") if _on_device(data) else None
    where = f" on {device}" if device else (" on a device" if _on_device(data) else "")
    return f"{data['backend']} {data['backend_version']}{_suffix(data)}{where}"


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in v.replace("-", ".").split("."))


def _cell(counts: dict) -> str:
    if not counts:
        return "-"
    parts = []
    for status in _ORDER:
        n = counts.get(status, 0)
        if n:
            parts.append(f"**{n} FAIL**" if status == "fail" else f"{n} {status}")
    return ", ".join(parts)


def render_report(data: dict) -> str:
    """One backend's section: what was run, then a tag x level table."""
    levels = data["levels"]
    summary = data["summary"]
    tags = sorted({k.rsplit("/", 1)[0] for k in summary} - {"all"}) + ["all"]
    n_cases: dict[str, int] = {"all": len(data["cases"])}
    for case in data["cases"].values():
        for t in case["tags"]:
            n_cases[t] = n_cases.get(t, 0) + 1
    totals = ", ".join(f"{data['totals'].get(s, 0)} {s}" for s in _ORDER)
    lines = [
        f"## `{data['backend']}` {_title(data)[len(data['backend']) + 1:]}",
        "",
        f"- platforms: {', '.join(data['platforms']) or '-'}"
        + (f"; this run: {_variant(data)[1]}"
           + (f", target {data['target']}" if data.get("target") else "")
           if _suffix(data) else "")
        + f"; levels run: {', '.join(levels)}",
        f"- claimed tags: {', '.join(data['claimed']) or '-'}",
        f"- run {data.get('created', '?')} with pallas-core "
        f"{data['versions'].get('pallas_core', '?')}, jax {data['versions'].get('jax', '?')}"
        f" ({data.get('seconds', 0):.0f} s)",
        f"- result: **{'PASS' if data['ok'] else 'FAIL'}**: {totals}",
        "",
        "| tag | cases | " + " | ".join(levels) + " |",
        "|---|---:|" + "---|" * len(levels),
    ]
    for tag in tags:
        cells = [_cell(summary.get(f"{tag}/{lv}", {})) for lv in levels]
        name = "**all**" if tag == "all" else tag
        lines.append(f"| {name} | {n_cases.get(tag, 0)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_status(paths: Iterable[str]) -> str:
    """The whole status section for the reports found in ``paths``."""
    reports = load_reports(paths)
    if not reports:
        return "_No reports have been published yet._\n"
    index = ["| backend | version | result | run |", "|---|---|---|---|"]
    for d in reports:
        index.append(f"| [`{d['backend']}`](#{_anchor(d)}) | "
                     f"{_title(d)[len(d['backend']) + 1:]} | "
                     f"{'PASS' if d['ok'] else '**FAIL**'} | {d.get('created', '?')} |")
    return "\n".join(index) + "\n\n" + "\n".join(render_report(d) for d in reports)


def _anchor(d: dict) -> str:
    """The anchor MkDocs' toc extension gives the backend's heading."""
    text = _title(d).lower()
    return "".join(c if c.isalnum() or c in "-_" else "-" if c == " " else ""
                   for c in text)
