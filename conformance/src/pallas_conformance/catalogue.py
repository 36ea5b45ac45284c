"""The case catalogue: every case of :mod:`pallas_conformance.cases`, loaded on first use.

The case type, the tags and the helpers for writing cases live in
:mod:`pallas_conformance.registry` (re-exported here), which the case modules import;
this module sits above them and imports them only when the catalogue is first asked
for, so that ``import pallas_conformance`` (which pytest does for the plugin in every
run) does not load every case and the backend packages that some of them use.
"""

from __future__ import annotations

from pallas_conformance.registry import (
    DEFAULT_TOLERANCE,
    TAG_ALIASES,
    TAGS,
    Case,
    call_options,
    case,
    dtype_tags,
    randn,
    register,
    registered_case,
    registered_cases,
    sds,
    sds_like,
    short,
    uniform,
)

__all__ = [
    "DEFAULT_TOLERANCE", "TAGS", "TAG_ALIASES", "Case", "all_cases", "call_options", "case",
    "dtype_tags", "get_case", "randn", "register", "sds", "sds_like", "short", "uniform",
]


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
