"""``pallas-conformance``: run the catalogue for a backend and write a report.

    pallas-conformance --backend triton --report report.md
    pallas-conformance --backend triton --platform rocm --target gfx942 -o triton-rocm.json
    pallas-conformance --backend interpret --level interpret --level lower -k matmul
    pallas-conformance --list-backends
    pallas-conformance --list-cases --tag dot
    pallas-conformance bundle --backend triton DIR   # exported cases for a GPU host

The exit status is 1 when any claimed case fails at a reachable level, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import pallas.plugins
from pallas_conformance import bundle_cli
from pallas_conformance.__about__ import __version__
from pallas_conformance.levels import FAIL, LEVELS, CaseRunner
from pallas_conformance.registry import TAGS
from pallas_conformance.suite import resolve_backend, run_suite, select_cases


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pallas-conformance",
        description="Run the Pallas conformance catalogue for a backend. "
                    "`pallas-conformance bundle --help`: export it for a GPU host.",
    )
    p.add_argument("--backend", "-b", default="interpret",
                   help="installed backend name (default: interpret)")
    p.add_argument("--platform", "-p",
                   help="which of the backend's platforms to lower for (default: its "
                        "first; e.g. rocm for triton)")
    p.add_argument("--target",
                   help="the device the levels target, as the backend names it (e.g. "
                        "gfx942 or gfx1100 for triton on rocm, 90 for triton on cuda); "
                        "default: the backend's")
    p.add_argument("--level", "-l", action="append", choices=LEVELS, dest="levels",
                   help="level to run (repeatable); default: interpret and every level "
                        "the backend provides")
    p.add_argument("--report", "-o", action="append", default=[],
                   help="write the full report; .json for JSON, anything else Markdown "
                        "(repeatable)")
    p.add_argument("--chip", default=None,
                   help="the chip the compile level compiles for (TPU backends: v4, v5e, "
                        "v5p, v6e, 7x; default: the backend's, v5e for mosaic_tpu and "
                        "v5p for mosaic_sparsecore; a backend whose targets are chips, "
                        "as mosaic_sparsecore, also traces the cases for it); recorded in "
                        "the report")
    p.add_argument("-k", dest="keyword", help="only cases whose name contains this")
    p.add_argument("--tag", "-t", action="append", dest="tags",
                   help="only cases with this tag (repeatable)")
    p.add_argument("--list-backends", action="store_true",
                   help="list installed backends and exit")
    p.add_argument("--list-cases", action="store_true", help="list the cases and exit")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no per-failure lines and no progress bar")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bundle"]:
        return bundle_cli.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.list_backends:
        for b in pallas.plugins.list_backends():
            print(f"{b.name:20s} {b.version:10s} platforms={','.join(b.platforms)} "
                  f"levels={','.join(b.levels)} package={b.package or '?'}")
        for name, e in sorted(pallas.plugins.load_failures().items()):
            print(f"{name:20s} FAILED TO LOAD: {type(e).__name__}: {e}")
        return 0
    try:
        cases = select_cases(keyword=args.keyword, tags=args.tags)
    except ValueError as e:
        print(f"pallas-conformance: {e}", file=sys.stderr)
        return 2
    if args.list_cases:
        for c in cases:
            print(f"{c.name:55s} {','.join(sorted(c.tags))}")
        print(f"{len(cases)} cases; tags: {', '.join(TAGS)}")
        return 0
    try:
        backend = resolve_backend(args.backend)
        if backend is not None:
            platform = args.platform or backend.platforms[0]
            with backend.targeting(platform, args.target):
                pass
            if args.chip and args.target is None:
                # A backend whose targets are chips (mosaic_sparsecore: lanes per vector
                # depend on it) also traces the cases for the chip compiled for.
                try:
                    with backend.targeting(platform, args.chip):
                        args.target = args.chip
                except ValueError:
                    pass
    except (pallas.plugins.BackendNotFoundError, ValueError) as e:
        print(f"pallas-conformance: {e}", file=sys.stderr)
        return 2

    levels = args.levels or CaseRunner(backend).levels()
    with _progress_bar(len(cases) * len(levels), args.quiet) as bar:
        def progress(r):
            if r.status == FAIL and not args.quiet:
                (bar.write if bar else print)(f"FAIL {r.case} [{r.level}]: {r.detail}",
                                              file=sys.stderr)
            if bar:
                bar.set_postfix_str(f"{r.case} [{r.level}]", refresh=False)
                bar.update()

        options = {"chip": args.chip} if args.chip else {}
        report = run_suite(args.backend, levels=levels, cases=cases, progress=progress,
                           platform=args.platform, target=args.target,
                           compile_options=options)
    print(f"Pallas conformance: backend {report.label} {report.backend_version} "
          f"({len(cases)} cases, levels: {', '.join(report.levels)})")
    if "compile" in report.levels:
        print(f"compile level: compiled for {', '.join(report.compile_targets) or '-'}")
    print()
    print(report.summary_table())
    print()
    print(f"{'PASS' if report.ok else 'FAIL'}: {report.totals_line()}")
    for path in args.report:
        report.write(path)
        print(f"report written to {path}")
    return 0 if report.ok else 1


@contextlib.contextmanager
def _progress_bar(total: int, quiet: bool):
    """A tqdm bar on stderr when it is a terminal (and not ``--quiet``); else ``None``."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="result", file=sys.stderr, dynamic_ncols=True,
              leave=False) as bar:
        yield bar
        bar.refresh()  # tqdm rate-limits redraws: draw the final count before clearing


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
