"""Writes docs/reports/<backend>.json for every installed backend (or those named).

    hatch run status-reports                 # every installed backend
    hatch run status-reports triton          # one (and its VARIANTS)
    hatch run status-reports triton:rocm:gfx942   # one platform and target of it

A backend's runs on its other platforms (:data:`VARIANTS`) are written beside it, as
``<backend>-<platform>.json`` (the AMD run of the Triton backend: ``triton-rocm.json``).

Each file is the full ``pallas-conformance --report`` of that backend's release; the
docs' "Backend status" page is generated from them (tools/docs_status_hook.py).
"""

from __future__ import annotations

import os
import sys

import pallas.plugins
from pallas_conformance.cli import main as conformance

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                   "reports")


# Other (platform, target) runs published per backend: the Triton backend on AMD GPUs.
VARIANTS = {"triton": [("rocm", "gfx942")]}


def _runs(names: list[str]) -> list[tuple[str, str | None, str | None]]:
    runs = []
    for name in names:
        backend, _, rest = name.partition(":")
        if rest:
            platform, _, target = rest.partition(":")
            runs.append((backend, platform, target or None))
            continue
        runs.append((backend, None, None))
        runs += [(backend, p, t) for p, t in VARIANTS.get(backend, [])]
    return runs


def main(names: list[str]) -> int:
    os.makedirs(OUT, exist_ok=True)
    names = names or [b.name for b in pallas.plugins.list_backends()]
    worst = 0
    for backend, platform, target in _runs(names):
        print(f"== {backend} {platform or ''} {target or ''}", flush=True)
        args = ["--backend", backend, "--quiet"]
        stem = backend
        if platform:
            args += ["--platform", platform]
            stem += f"-{platform}"
        if target:
            args += ["--target", target]
        code = conformance([*args, "--report", os.path.join(OUT, stem + ".json")])
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
