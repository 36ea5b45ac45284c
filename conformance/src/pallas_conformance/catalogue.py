"""The case catalogue: every case of :mod:`pallas_conformance.cases`, loaded on first use.

The case type, the tags and the helpers for writing cases live in
:mod:`pallas_conformance.registry`, which the case modules import. This module sits
above them and imports them only when the catalogue is first asked for, so that
``import pallas_conformance`` (which pytest does for the plugin in every run) does not
load every case and the backend packages that some of them use.
"""

from __future__ import annotations

from pallas_conformance.registry import Case, registered_case, registered_cases

__all__ = ["all_cases", "get_case"]


def all_cases() -> list[Case]:
    """Every case of the catalogue, sorted by name."""
    # Local: loading the cases imports the backend packages that some cases use (a
    # downward import; the case modules import only pallas_conformance.registry).
    from pallas_conformance import cases  # noqa: F401 - registers the catalogue

    return registered_cases()


def get_case(name: str) -> Case:
    """The catalogue's case called ``name`` (``KeyError`` if there is none)."""
    all_cases()
    return registered_case(name)
