#!/usr/bin/env python3
"""Runs a Pallas conformance bundle on this machine's device: the ``execute`` level.

    python run_bundle.py [--report out.json] [--budget SECONDS] [-k PATTERN]
    python run_bundle.py --shard 0/4 --report r0.json ...   # one of 4 processes
    python run_bundle.py --merge r0.json r1.json r2.json r3.json --report all.json

Stand-alone: needs only ``jax`` (>= 0.10.2) and ``numpy`` (``flatbuffers``, which
``jax.export`` needs to deserialise, comes with the bundle in ``_vendor/``); it is copied to the top of
every bundle made by ``pallas-conformance bundle`` and reads ``manifest.json`` beside it
(or ``--bundle DIR``). Each case's exported function (``jax.export``) is deserialised,
run on the local default device and compared with the interpreter's outputs stored in
the bundle, within the case's tolerances. Each benchmark's kernel and plain-JAX
reference are run on inputs made on the device from a seed, checked against each other,
and timed (warm-up, then the median of several device-synchronised runs).

The report is the conformance JSON report (schema ``pallas-conformance-report/1``, level
``execute``) with a ``benchmarks`` section. Exit status: 0 when everything ran and passed,
1 when a case or benchmark failed, 3 when the budget stopped the run before the end with
no failure, 2 on usage errors. An error is the case's, never the run's: it is reported
and the next case runs. The report file is rewritten as the run goes, so a run that is
killed still leaves what it did.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

PASS, FAIL, UNSUPPORTED, SKIPPED = "pass", "fail", "unsupported", "skipped"
STATUSES = (PASS, FAIL, UNSUPPORTED, SKIPPED)
REPORT_SCHEMA = "pallas-conformance-report/1"
BUNDLE_SCHEMA = "pallas-bundle/1"


def _parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", default=os.path.dirname(os.path.abspath(__file__)),
                   help="the bundle folder (default: the folder of this file)")
    p.add_argument("--report", "-o", help="write the JSON report here")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds; stop cleanly (and report what ran) once spent")
    p.add_argument("-k", dest="keyword", help="only cases and benchmarks whose name "
                                              "contains this")
    p.add_argument("--no-benchmarks", action="store_true", help="run the cases only")
    p.add_argument("--benchmarks-only", action="store_true", help="run the benchmarks only")
    p.add_argument("--iters", type=int, default=10,
                   help="timed runs per benchmark function (fewer when one run is slow)")
    p.add_argument("--shard", metavar="K/N", default=None,
                   help="run only the cases k, k+N, k+2N, ... (0 <= K < N): N processes "
                        "share the work (one GPU compiles kernels on many CPU cores)")
    p.add_argument("--merge", nargs="+", metavar="REPORT",
                   help="merge these reports (of shards) into --report and exit")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-case lines")
    return p


# --- data --------------------------------------------------------------------------

def _describe(e):
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
    msg = str(e).strip().split("\n")[0][:500]
    return f"{type(e).__name__}: {msg}{where}"


def _np_dtype(name):
    import jax.numpy as jnp

    return np.dtype(jnp.dtype(name))


def _restore(a, spec):
    """An array as stored (bf16 and friends as unsigned ints) back in its dtype."""
    dt = _np_dtype(spec["dtype"])
    a = np.asarray(a)
    if a.dtype != dt:
        a = a.view(dt)
    if list(a.shape) != list(spec["shape"]):
        raise ValueError(f"stored array has shape {a.shape}, manifest says {spec['shape']}")
    return a


def _need_flatbuffers(bundle):
    """jax.export.deserialize needs flatbuffers, which jax does not depend on: fall back
    to the copy the bundle carries (``_vendor/``) when it is not installed."""
    try:
        import flatbuffers  # noqa: F401
    except ImportError:
        vendor = os.path.join(bundle, "_vendor")
        if os.path.isdir(os.path.join(vendor, "flatbuffers")):
            sys.path.append(vendor)


def _load_exported(bundle, rel):
    import jax

    with open(os.path.join(bundle, rel), "rb") as f:
        return jax.export.deserialize(bytearray(f.read()))


def _block(x):
    import jax

    return jax.tree_util.tree_map(
        lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


# --- comparison ----------------------------------------------------------------------

class Mismatch(AssertionError):
    pass


def _as_f64(a):
    a = np.asarray(a)
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


def compare_case(got_leaves, want_leaves, specs):
    """Raises Mismatch unless each output matches (shape, dtype, values within atol/rtol;
    exact, NaN equal to NaN, when both are 0), as the conformance suite compares."""
    if len(got_leaves) != len(want_leaves):
        raise Mismatch(f"{len(got_leaves)} outputs, expected {len(want_leaves)}")
    many = len(want_leaves) > 1
    for i, (g, w, spec) in enumerate(zip(got_leaves, want_leaves, specs)):
        where = f"output {i}" if many else "output"
        g = np.asarray(g)
        if list(g.shape) != list(w.shape):
            raise Mismatch(f"{where}: shape {tuple(g.shape)} differs from the expected "
                           f"{tuple(w.shape)}")
        if g.dtype != w.dtype:
            raise Mismatch(f"{where}: dtype {g.dtype} differs from the expected {w.dtype}")
        atol, rtol = spec["atol"], spec["rtol"]
        if w.dtype.kind not in "biufc":  # bfloat16, float8...: compare as float32
            g, w = g.astype(np.float32), w.astype(np.float32)
        if atol == 0 and rtol == 0:
            nan = (np.isnan(g) & np.isnan(w)) if g.dtype.kind in "fc" else False
            bad = ~((g == w) | nan)
        else:
            bad = ~np.isclose(_as_f64(g), _as_f64(w), atol=atol, rtol=rtol, equal_nan=True)
        if np.any(bad):
            idx = tuple(int(j) for j in np.argwhere(bad)[0]) if np.ndim(bad) else ()
            raise Mismatch(f"{where}: {int(np.sum(bad))} of {np.size(bad)} elements differ "
                           f"from the expected (atol={atol}, rtol={rtol}); first at {idx}: "
                           f"got {g[idx].item()!r}, expected {w[idx].item()!r}")


# --- cases -----------------------------------------------------------------------------

def run_case(bundle, entry):
    """``(status, detail)`` of one bundled case on the local device."""
    import jax

    exp = _load_exported(bundle, entry["exported"])
    data = np.load(os.path.join(bundle, entry["data"]))
    flat_in = [_restore(data[f"in{i}"], s) for i, s in enumerate(entry["inputs"])]
    want = [_restore(data[f"out{i}"], s) for i, s in enumerate(entry["outputs"])]
    args, kwargs = jax.tree_util.tree_unflatten(exp.in_tree, flat_in)
    got = _block(jax.jit(exp.call)(*args, **kwargs))
    compare_case([np.asarray(x) for x in jax.tree_util.tree_leaves(got)], want,
                 entry["outputs"])
    return PASS, ""


# --- benchmarks --------------------------------------------------------------------------

def make_inputs(specs, seed=0):
    """The benchmark's operands, made on the default device (nothing is stored)."""
    import jax
    import jax.numpy as jnp

    out = []
    for i, s in enumerate(specs):
        x = jax.random.normal(jax.random.key(seed + i), tuple(s["shape"]), jnp.float32)
        x = x * s.get("scale", 1.0) + s.get("shift", 0.0)
        out.append(x.astype(jnp.dtype(s["dtype"])))
    return _block(out)


def time_fn(fn, args, iters, deadline):
    """Median, min and count of device-synchronised wall times (ms), after warm-up."""
    _block(fn(*args))  # compile and first run
    t0 = time.perf_counter()
    _block(fn(*args))
    one = time.perf_counter() - t0
    n = max(3, min(iters, int(2.0 / max(one, 1e-6))))  # ~2 s per function at most
    times = []
    for _ in range(n):
        if deadline is not None and time.perf_counter() > deadline and len(times) >= 3:
            break
        t0 = time.perf_counter()
        _block(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), len(times)


def check_close(got, want, atol, rtol):
    """``(ok, max abs error, bad count)`` of kernel against reference, on the device."""
    import jax
    import jax.numpy as jnp

    gl, wl = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    if len(gl) != len(wl):
        return False, float("nan"), -1
    worst, bad = 0.0, 0
    for g, w in zip(gl, wl):
        if g.shape != w.shape:
            return False, float("nan"), -1
        g32, w32 = g.astype(jnp.float32), w.astype(jnp.float32)
        err = jnp.abs(g32 - w32)
        nbad = jnp.sum(~(err <= atol + rtol * jnp.abs(w32)))
        worst = max(worst, float(jnp.max(err)) if err.size else 0.0)
        bad += int(nbad)
    return bad == 0, worst, bad


def run_benchmark(bundle, entry, iters, deadline):
    import jax

    kernel = jax.jit(_load_exported(bundle, entry["kernel"]["exported"]).call)
    reference = jax.jit(_load_exported(bundle, entry["reference"]["exported"]).call)
    args = make_inputs(entry["inputs"])
    res = {"name": entry["name"], "description": entry.get("description", "")}
    got = _block(kernel(*args))
    want = _block(reference(*args))
    ok, err, bad = check_close(got, want, entry["atol"], entry["rtol"])
    res.update(max_abs_error=err, mismatched=bad, atol=entry["atol"], rtol=entry["rtol"])
    del got, want
    k_ms, k_min, k_n = time_fn(kernel, args, iters, deadline)
    r_ms, r_min, r_n = time_fn(reference, args, iters, deadline)
    res.update(kernel_ms=k_ms, kernel_min_ms=k_min, kernel_runs=k_n,
               reference_ms=r_ms, reference_min_ms=r_min, reference_runs=r_n,
               kernel_vs_reference=r_ms / k_ms if k_ms else None)
    if entry.get("flops"):
        res["kernel_tflops"] = entry["flops"] / (k_ms * 1e-3) / 1e12
        res["reference_tflops"] = entry["flops"] / (r_ms * 1e-3) / 1e12
    if entry.get("bytes"):
        res["kernel_gbps"] = entry["bytes"] / (k_ms * 1e-3) / 1e9
        res["reference_gbps"] = entry["bytes"] / (r_ms * 1e-3) / 1e9
    status = PASS if ok else FAIL
    detail = "" if ok else (f"kernel differs from the reference: {bad} elements beyond "
                            f"atol={entry['atol']}, rtol={entry['rtol']} (max abs error {err:.3g})")
    return status, detail, res


# --- the report ------------------------------------------------------------------------

class Report:
    def __init__(self, manifest, path):
        self.manifest, self.path = manifest, path
        self.results, self.benchmarks, self.cases = [], [], {}
        self.t0 = time.perf_counter()
        self.created = datetime.datetime.now(datetime.UTC).strftime(
            "%Y-%m-%d %H:%M UTC")
        self.stopped, self.not_run = False, []
        self._last_write = 0.0

    def add(self, name, tags, description, status, detail, seconds):
        self.cases[name] = {"tags": sorted(tags), "description": description}
        self.results.append({"case": name, "level": "execute", "status": status,
                             "detail": detail, "seconds": seconds})

    def to_json(self):
        import jax

        totals = collections.Counter(r["status"] for r in self.results)
        summary = collections.defaultdict(collections.Counter)
        for r in self.results:
            for tag in self.cases[r["case"]]["tags"]:
                summary[f"{tag}/execute"][r["status"]] += 1
            summary["all/execute"][r["status"]] += 1
        m = self.manifest
        try:
            dev = jax.devices()[0]
            device = {"platform": dev.platform, "kind": getattr(dev, "device_kind", "?"),
                      "count": jax.device_count()}
        except Exception as e:  # noqa: BLE001
            device = {"error": _describe(e)}
        bench_failed = any(b.get("status") == FAIL for b in self.benchmarks)
        return {
            "schema": REPORT_SCHEMA,
            "backend": m["backend"],
            "backend_version": m["backend_version"],
            "platforms": [m["platform"]],
            "claimed": m.get("claimed", []),
            "backend_levels": ["execute"],
            "levels": ["execute"],
            "versions": {"pallas_conformance": m["built_with"].get("pallas_conformance", "?"),
                         "pallas_core": m["built_with"].get("pallas_core", "?"),
                         "jax": jax.__version__, "python": platform.python_version(),
                         "bundle_jax": m["built_with"].get("jax", "?")},
            "created": self.created,
            "seconds": round(time.perf_counter() - self.t0, 3),
            "ok": not totals.get(FAIL) and not bench_failed and not self.stopped,
            "totals": dict(totals),
            "summary": {k: dict(v) for k, v in sorted(summary.items())},
            "cases": dict(sorted(self.cases.items())),
            "results": self.results,
            "device": device,
            "bundle": {"target": m.get("target"), "created": m.get("created"),
                       "disabled_checks": m.get("disabled_checks", {}),
                       "custom_calls": m.get("custom_calls", [])},
            "benchmarks": self.benchmarks,
            "budget": {"stopped": self.stopped, "not_run": self.not_run},
        }

    def write(self, force=False):
        if not self.path or (not force and time.perf_counter() - self._last_write < 5):
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")
        os.replace(tmp, self.path)
        self._last_write = time.perf_counter()


def merge_reports(paths, out):
    """One report of several (shards of one bundle's run): results, cases and
    benchmarks concatenated, totals and summaries recomputed."""
    parts = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            parts.append(json.load(f))
    first = dict(parts[0])
    seen = set()
    results, cases, benches, not_run = [], {}, [], []
    for d in parts:
        for r in d["results"]:
            if (r["case"], r["level"]) not in seen:
                seen.add((r["case"], r["level"]))
                results.append(r)
        cases.update(d["cases"])
        benches += d.get("benchmarks", [])
        not_run += d.get("budget", {}).get("not_run", [])
    totals = collections.Counter(r["status"] for r in results)
    summary = collections.defaultdict(collections.Counter)
    for r in results:
        for tag in cases[r["case"]]["tags"]:
            summary[f"{tag}/{r['level']}"][r["status"]] += 1
        summary[f"all/{r['level']}"][r["status"]] += 1
    stopped = any(d.get("budget", {}).get("stopped") for d in parts)
    first.update(
        results=sorted(results, key=lambda r: r["case"]), cases=dict(sorted(cases.items())),
        benchmarks=benches, totals=dict(totals),
        summary={k: dict(v) for k, v in sorted(summary.items())},
        seconds=max(d.get("seconds", 0) for d in parts),
        budget={"stopped": stopped, "not_run": not_run},
        ok=not totals.get(FAIL) and not stopped
        and not any(b.get("status") == FAIL for b in benches))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(first, f, indent=2)
        f.write("\n")
    return first


def _table(benchmarks):
    lines = [f"{'benchmark':58s} {'kernel ms':>10s} {'ref ms':>10s} {'kernel':>12s} "
             f"{'reference':>12s} {'k/ref':>6s}"]
    for b in benchmarks:
        if "kernel_ms" not in b:
            lines.append(f"{b['name']:58s} {b.get('status', '?').upper()}: {b.get('detail', '')}")
            continue
        unit, k, r = (("TFLOP/s", b["kernel_tflops"], b["reference_tflops"])
                      if "kernel_tflops" in b else ("GB/s", b["kernel_gbps"], b["reference_gbps"]))
        mark = "" if b["status"] == PASS else "  MISMATCH"
        lines.append(f"{b['name']:58s} {b['kernel_ms']:10.3f} {b['reference_ms']:10.3f} "
                     f"{k:8.1f} {unit:>3s} {r:8.1f} {unit:>3s} {b['kernel_vs_reference']:6.2f}"
                     f"{mark}")
    return "\n".join(lines)


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.merge:
        if not args.report:
            print("run_bundle: --merge needs --report OUT", file=sys.stderr)
            return 2
        data = merge_reports(args.merge, args.report)
        totals = ", ".join(f"{data['totals'].get(s, 0)} {s}" for s in STATUSES)
        print(f"merged {len(args.merge)} reports into {args.report}: {totals}")
        return 0 if data["ok"] else 1
    shard, shards = 0, 1
    if args.shard:
        try:
            shard, shards = (int(v) for v in args.shard.split("/"))
            assert 0 <= shard < shards
        except (ValueError, AssertionError):
            print(f"run_bundle: --shard {args.shard!r}: expected K/N with 0 <= K < N",
                  file=sys.stderr)
            return 2
    path = os.path.join(args.bundle, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except OSError as e:
        print(f"run_bundle: cannot read {path}: {e}", file=sys.stderr)
        return 2
    if manifest.get("schema") != BUNDLE_SCHEMA:
        print(f"run_bundle: {path} is not a bundle manifest ({BUNDLE_SCHEMA})", file=sys.stderr)
        return 2
    _need_flatbuffers(args.bundle)
    import jax

    deadline = time.perf_counter() + args.budget if args.budget else None
    report = Report(manifest, args.report)
    say = (lambda *a: None) if args.quiet else print
    try:
        dev = jax.devices()[0]
        where = f"{dev.platform} ({getattr(dev, 'device_kind', '?')})"
    except Exception as e:  # noqa: BLE001
        where = f"no device: {_describe(e)}"
    print(f"bundle: {manifest['backend']} {manifest['backend_version']} for "
          f"{manifest['platform']} {manifest.get('target') or ''}, built with jax "
          f"{manifest['built_with'].get('jax')}; running with jax {jax.__version__} on {where}")

    def wanted(name):
        return not args.keyword or args.keyword in name

    def out_of_time():
        return deadline is not None and time.perf_counter() > deadline

    if not args.benchmarks_only:
        for e in manifest.get("not_bundled", []) if shard == 0 else []:
            if wanted(e["name"]):
                report.add(e["name"], e["tags"], e.get("description", ""), e["status"],
                           e["detail"], 0.0)
                if e["status"] == FAIL:
                    say(f"FAIL {e['name']}: {e['detail']}")
        for i, e in enumerate(manifest["cases"]):
            if i % shards != shard or not wanted(e["name"]):
                continue
            if out_of_time():
                report.stopped = True
                report.not_run.append(e["name"])
                continue
            t0 = time.perf_counter()
            try:
                status, detail = run_case(args.bundle, e)
            except Exception as exc:  # noqa: BLE001 - the case's error, not the run's
                status, detail = FAIL, (str(exc) if isinstance(exc, Mismatch)
                                        else _describe(exc))
            report.add(e["name"], e["tags"], e.get("description", ""), status, detail,
                       time.perf_counter() - t0)
            if status == FAIL:
                say(f"FAIL {e['name']}: {detail}")
            report.write()
    if not args.no_benchmarks and shard == 0:
        for e in manifest.get("benchmarks", []):
            if not wanted(e["name"]):
                continue
            if out_of_time():
                report.stopped = True
                report.not_run.append(e["name"])
                continue
            try:
                status, detail, res = run_benchmark(args.bundle, e, args.iters, deadline)
            except Exception as exc:  # noqa: BLE001
                status, detail, res = FAIL, _describe(exc), {"name": e["name"]}
            res.update(status=status, detail=detail)
            report.benchmarks.append(res)
            say(_table([res]).splitlines()[-1])
            report.write()
    report.write(force=True)
    data = report.to_json()
    totals = ", ".join(f"{data['totals'].get(s, 0)} {s}" for s in STATUSES)
    nb = len(report.benchmarks)
    bad_b = sum(b["status"] == FAIL for b in report.benchmarks)
    print(f"execute: {totals}; benchmarks: {nb - bad_b} pass, {bad_b} fail"
          f"{'; STOPPED by --budget, not run: ' + str(len(report.not_run)) if report.stopped else ''}"
          f" ({data['seconds']:.1f} s)")
    if report.benchmarks:
        print(_table(report.benchmarks))
    if data["totals"].get(FAIL) or bad_b:
        return 1
    return 3 if report.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
