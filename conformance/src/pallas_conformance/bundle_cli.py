"""``pallas-conformance bundle``: export the catalogue and the benchmarks for a backend
into one folder that ``python DIR/run_bundle.py`` runs where only jax is installed.

    pallas-conformance bundle --backend triton bundles/triton-sm_90a
    pallas-conformance bundle --backend mosaic_gpu --target sm_100a bundles/mgpu-sm_100a
    pallas-conformance bundle --backend interpret -k kernels/ --benchmarks small /tmp/b

Exit status: 0 when every claimed case was exported and the bundle is within
``--max-mib``; 1 otherwise (the bundle is still written); 2 on usage errors.
"""

from __future__ import annotations

import argparse
import collections
import sys

import pallas.plugins
from pallas_conformance.bundle import DEFAULT_TARGET, MAX_MIB, TARGETS, build_bundle, bundle_size


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pallas-conformance bundle",
        description="Export the conformance cases and benchmarks a backend claims, with "
                    "inputs, expected outputs and a stand-alone runner, into DIR.")
    p.add_argument("dir", metavar="DIR", help="the bundle folder (replaced)")
    p.add_argument("--backend", "-b", required=True,
                   help="triton, mosaic_gpu, interpret, or another installed backend")
    p.add_argument("-k", dest="keyword", help="only cases and benchmarks whose name "
                                              "contains this")
    p.add_argument("--tag", "-t", action="append", dest="tags",
                   help="only cases with this tag (repeatable)")
    p.add_argument("--target", choices=TARGETS, default=None,
                   help=f"the GPU the kernels are built for (default {DEFAULT_TARGET}; "
                        "sm_100a for Blackwell); ignored for CPU backends")
    p.add_argument("--benchmarks", choices=("auto", "full", "small", "none"), default="auto",
                   help="benchmark kernels: full size (default for GPU backends), small "
                        "(interpreter-sized, to test a bundle on CPU) or none (default for "
                        "interpret)")
    p.add_argument("--examples", metavar="DIR", default=None,
                   help="the examples/ folder whose kernels are benchmarked (default: the "
                        "checkout's, when there is one)")
    p.add_argument("--reuse-expected", metavar="BUNDLE", default=None,
                   help="take the expected outputs of cases with the same inputs from a "
                        "bundle made before (of any backend) instead of running the "
                        "interpreter again")
    p.add_argument("--max-mib", type=float, default=MAX_MIB,
                   help=f"fail when the bundle is larger (default {MAX_MIB})")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-item lines")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        pallas.plugins.get_backend(args.backend)
    except pallas.plugins.BackendNotFoundError as e:
        print(f"pallas-conformance bundle: {e}", file=sys.stderr)
        return 2
    counts: collections.Counter = collections.Counter()

    def progress(name: str, status: str) -> None:
        counts[status] += 1
        if not args.quiet and status == "fail":
            print(f"NOT EXPORTED {name}", file=sys.stderr)

    try:
        m = build_bundle(args.backend, args.dir, keyword=args.keyword, tags=args.tags,
                         target=args.target, benchmarks=args.benchmarks,
                         examples_dir=args.examples,
                         reuse_expected=args.reuse_expected, progress=progress)
    except (ValueError, RuntimeError) as e:
        print(f"pallas-conformance bundle: {e}", file=sys.stderr)
        return 2
    size = bundle_size(args.dir)
    by_status = collections.Counter(e["status"] for e in m["not_bundled"])
    print(f"bundle {args.dir}: {m['backend']} {m['backend_version']} for {m['platform']}"
          f"{' ' + m['target'] if m['target'] else ''}; {len(m['cases'])} cases exported, "
          f"{by_status['unsupported']} unsupported, {by_status['skipped']} skipped, "
          f"{by_status['fail']} failed to export; {len(m['benchmarks'])} benchmarks "
          f"({len(m['benchmarks_left_out'])} left out); {size / 2**20:.1f} MiB")
    if m["disabled_checks"]["custom_call"]:
        print("jax.export safety checks disabled for custom calls: "
              + ", ".join(m["disabled_checks"]["custom_call"]))
    for name, why in sorted(m["benchmarks_left_out"].items()):
        print(f"  left out {name}: {why}")
    ok = True
    if by_status["fail"]:
        ok = False
        for e in m["not_bundled"]:
            if e["status"] == "fail":
                print(f"  FAIL {e['name']}: {e['detail']}", file=sys.stderr)
    if size > args.max_mib * 2**20:
        ok = False
        print(f"pallas-conformance bundle: {size / 2**20:.1f} MiB is over --max-mib "
              f"{args.max_mib}", file=sys.stderr)
    return 0 if ok else 1
