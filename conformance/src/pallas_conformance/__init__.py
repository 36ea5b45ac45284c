"""The Pallas conformance suite: a catalogue of cases, levels, a pytest plugin and a CLI.

    from pallas_conformance import run_suite
    report = run_suite("triton")            # interpret + every level triton provides
    report.write("report.md"); assert report.ok

See ``docs/backend-authors.md`` for the backend contract and how to read the report.
"""

from pallas_conformance.__about__ import __version__
from pallas_conformance.catalogue import all_cases, get_case
from pallas_conformance.levels import (
    BACKEND_LEVELS,
    FAIL,
    INTERPRET_CAPABILITIES,
    LEVELS,
    PASS,
    SKIPPED,
    STATUSES,
    UNSUPPORTED,
    CaseRunner,
    Result,
    claimed_tags,
    interpreter_claims,
    pallas_call_eqns,
)
from pallas_conformance.registry import DEFAULT_TOLERANCE, TAGS, Case, case, register
from pallas_conformance.suite import Report, run_suite, select_cases

__all__ = [
    "BACKEND_LEVELS", "DEFAULT_TOLERANCE", "FAIL", "INTERPRET_CAPABILITIES", "LEVELS",
    "PASS", "SKIPPED", "STATUSES", "TAGS", "UNSUPPORTED", "Case", "CaseRunner", "Report",
    "Result", "__version__", "all_cases", "case", "claimed_tags", "get_case",
    "interpreter_claims", "pallas_call_eqns", "register", "run_suite", "select_cases",
]
