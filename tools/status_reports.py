"""Writes docs/reports/<backend>.json for every installed backend (or those named).

    hatch run status-reports                 # every installed backend
    hatch run status-reports triton          # one

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


def main(names: list[str]) -> int:
    os.makedirs(OUT, exist_ok=True)
    names = names or [b.name for b in pallas.plugins.list_backends()]
    worst = 0
    for name in names:
        print(f"== {name}", flush=True)
        code = conformance(["--backend", name, "--quiet", "--report",
                            os.path.join(OUT, f"{name}.json")])
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
