"""MkDocs hook: fills docs/backend-status.md with the published conformance reports.

Every ``docs/reports/*.json`` (written by ``pallas-conformance --report``, see
``hatch run status-reports``) becomes one table per backend and level, at build time, so
the page never disagrees with the reports it shows.
"""

from __future__ import annotations

import os

from pallas_conformance.status import render_status

MARKER = "<!-- backend-status-tables -->"


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri != "backend-status.md":
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/backend-status.md lost its marker {MARKER}")
    reports = os.path.join(config["docs_dir"], "reports")
    return markdown.replace(MARKER, render_status([reports]))
