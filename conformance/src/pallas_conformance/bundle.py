"""Bundles: the catalogue and the benchmarks exported with ``jax.export`` for a backend's
platform, to run where only ``jax`` is installed (a GPU host without this project).

    pallas-conformance bundle --backend triton bundles/triton-sm_90a
    python bundles/triton-sm_90a/run_bundle.py --report triton-execute.json

A bundle is one folder: ``manifest.json`` (schema ``pallas-bundle/1``), ``run_bundle.py``
(the stand-alone runner, :mod:`pallas_conformance.run_bundle`), and per case a
serialised ``Exported`` (``cases/NAME.jax``) with its inputs and expected outputs
(``cases/NAME.npz``; the interpreter's outputs, as the ``execute`` level compares with).
Benchmarks carry an exported kernel and an exported plain-JAX reference
(``bench/NAME.kernel.jax``, ``bench/NAME.reference.jax``) and only the shapes of their
inputs, which the runner makes on the device from a seed.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.resources
import json
import os
import platform as _platform
import re
import shutil
from collections.abc import Callable, Iterable

import jax
import numpy as np

import pallas
import pallas.plugins
from pallas_conformance import bench_examples, bench_kernels
from pallas_conformance.__about__ import __version__
from pallas_conformance.levels import (
    FAIL,
    SKIPPED,
    UNSUPPORTED,
    CaseRunner,
    _describe,
    bound,
    can_lower_for,
    claimed_tags,
    unclaimed,
)
from pallas_conformance.registry import Case
from pallas_conformance.suite import select_cases

SCHEMA = "pallas-bundle/1"
TARGETS = ("sm_90a", "sm_100a")
DEFAULT_TARGET = "sm_90a"
MAX_MIB = 48

# Kernel custom calls that jax.export does not guarantee (not on its list of stable
# targets): exporting them needs DisabledSafetyCheck.custom_call, which the manifest
# records. jaxlib's Triton kernel call carries PTX and a serialised launch description
# whose format jaxlib may change between releases.
UNGUARANTEED_KERNEL_CALLS = ("triton_kernel_call",)

_CUSTOM_CALL = re.compile(r"custom_call @([\w$.\-]+)")


def file_stem(name: str) -> str:
    """A case or benchmark name as a file name (``a/b`` -> ``a__b``)."""
    return re.sub(r"[^\w.\-]", "_", name.replace("/", "__"))


def export(fn: Callable, args: Iterable, platform: str):
    """``(exported, custom call targets, disabled checks)`` for ``fn`` at ``args``."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in UNGUARANTEED_KERNEL_CALLS]
    exp = jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(*args)
    targets = sorted(set(_CUSTOM_CALL.findall(exp.mlir_module())))
    disabled = sorted(t for t in targets if t in UNGUARANTEED_KERNEL_CALLS)
    return exp, targets, disabled


def _leaf_specs(leaves) -> list[dict]:
    return [{"shape": list(np.shape(x)), "dtype": np.asarray(x).dtype.name} for x in leaves]


def _storable(x) -> np.ndarray:
    """``x`` as an array ``np.savez`` keeps exactly: dtypes numpy does not know natively
    (bfloat16, ...) are stored as unsigned integers of their width (the manifest names
    the real dtype)."""
    a = np.asarray(x)
    if a.dtype.kind not in "biufc" or a.dtype.name not in np.sctypeDict:
        a = a.view(f"u{a.dtype.itemsize}")
    return a


def _export_status(e: BaseException, backend: str, target: str | None) -> str:
    """How a case that could not be exported is reported: ``unsupported`` when the
    backend declines the kernel (LevelUnsupportedError) or it needs another GPU
    generation than the target; ``skipped`` when jax.export cannot serialise the
    interpreter's host callbacks; otherwise ``fail`` (a claimed case must lower)."""
    msg = str(e)
    if isinstance(e, pallas.plugins.LevelUnsupportedError):
        return UNSUPPORTED
    if target and "-only" in msg and f"compiled for {target}" in msg:
        return UNSUPPORTED
    if backend == "interpret" and isinstance(e, NotImplementedError) and \
            "host_callbacks" in msg:
        return SKIPPED
    return FAIL


def _reused(reuse: dict | None, stem: str, flat_in: list) -> tuple[list, str] | None:
    """The expected outputs another bundle stored for the same case and the same inputs
    (the interpreter's results do not depend on the backend), or None."""
    if not reuse or stem not in reuse:
        return None
    path, what = reuse[stem]
    with np.load(path) as old:
        stored = [old[f"in{i}"] for i in range(len(flat_in)) if f"in{i}" in old]
        if len(stored) != len(flat_in) or any(
                not np.array_equal(a, _storable(b)) for a, b in zip(stored, flat_in)):
            return None
        outs = sorted((k for k in old.files if k.startswith("out")), key=lambda k: int(k[3:]))
        return [old[k] for k in outs], what


def _reuse_index(folder: str | None) -> dict | None:
    if not folder:
        return None
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    return {file_stem(e["name"]): (os.path.join(folder, e["data"]), e["expected_from"])
            for e in m["cases"]}


def _bundle_case(runner: CaseRunner, case: Case, platform: str, out_dir: str,
                 reuse: dict | None = None) -> dict:
    args = runner.args(case)
    exp, targets, disabled = export(bound(case, backend=runner.backend.name), args, platform)
    flat_in = jax.tree_util.tree_leaves(args)
    stem = file_stem(case.name)
    hit = _reused(reuse, stem, flat_in)
    if hit is None:
        want, what = runner._expected(case, args)
        flat_out = jax.tree_util.tree_leaves(want)
    else:
        stored, what = hit
        specs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in exp.out_avals]
        flat_out = [np.asarray(a).view(s.dtype) if a.dtype != s.dtype else np.asarray(a)
                    for a, s in zip(stored, specs)]
    with open(os.path.join(out_dir, "cases", stem + ".jax"), "wb") as f:
        f.write(exp.serialize())
    arrays = {f"in{i}": _storable(x) for i, x in enumerate(flat_in)}
    arrays.update({f"out{i}": _storable(x) for i, x in enumerate(flat_out)})
    np.savez_compressed(os.path.join(out_dir, "cases", stem + ".npz"), **arrays)
    outputs = _leaf_specs(flat_out)
    for spec, leaf in zip(outputs, flat_out):
        spec["atol"], spec["rtol"] = (float(t) for t in case.tolerance_for(leaf.dtype))
    return {"name": case.name, "tags": sorted(case.tags), "description": case.description,
            "exported": f"cases/{stem}.jax", "data": f"cases/{stem}.npz",
            "inputs": _leaf_specs(flat_in), "outputs": outputs, "expected_from": what,
            "custom_calls": targets, "disabled_checks": disabled}


def _bundle_benchmark(bench, platform: str, out_dir: str) -> dict:
    stem = file_stem(bench.name)
    sds = [x.sds() for x in bench.inputs]
    entry = {"name": bench.name, "description": bench.description,
             "inputs": [x.to_json() for x in bench.inputs], "flops": bench.flops,
             "bytes": bench.bytes, "atol": bench.tolerance[0], "rtol": bench.tolerance[1]}
    for role, fn in (("kernel", bench.kernel), ("reference", bench.reference)):
        exp, targets, disabled = export(fn, sds, platform)
        path = f"bench/{stem}.{role}.jax"
        with open(os.path.join(out_dir, path), "wb") as f:
            f.write(exp.serialize())
        entry[role] = {"exported": path, "custom_calls": targets, "disabled_checks": disabled}
    return entry


def build_bundle(backend: str, out_dir: str, *, keyword: str | None = None,
                 tags: Iterable[str] | None = None, target: str | None = None,
                 benchmarks: str = "auto", examples_dir: str | None = None,
                 reuse_expected: str | None = None,
                 progress: Callable[[str, str], None] | None = None) -> dict:
    """Writes the bundle for ``backend`` into ``out_dir`` (emptied first) and returns its
    manifest.

    ``target``: the GPU (``sm_90a`` by default for triton/mosaic_gpu; ``sm_100a``).
    ``benchmarks``: ``"full"``, ``"small"`` (interpreter-sized), ``"none"``, or
    ``"auto"`` (full for a GPU backend, none for ``interpret``); ``-k`` (``keyword``)
    selects benchmarks by name too. ``reuse_expected``: a bundle made before (of any
    backend) whose expected outputs are taken for cases with the same inputs instead of
    running the interpreter again. ``progress(name, status)`` is called per item.
    """
    b = pallas.plugins.get_backend(backend)
    platform = b.platforms[0] if b.platforms else "cpu"
    reason = can_lower_for(platform)
    if reason:
        raise RuntimeError(f"cannot bundle for {backend}: {reason}")
    gpu = platform in ("cuda", "rocm")
    if platform == "cuda":
        target = target or DEFAULT_TARGET
    if benchmarks == "auto":
        benchmarks = "full" if gpu else "none"
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    for sub in ("cases", "bench"):
        os.makedirs(os.path.join(out_dir, sub))
    claims = claimed_tags(b)
    runner = CaseRunner(b)
    reuse = _reuse_index(reuse_expected)
    entries, not_bundled = [], []
    note = progress or (lambda name, status: None)
    with b.targeting(platform, target):
        for case in select_cases(keyword=keyword, tags=tags):
            missing = unclaimed(case, claims)
            if missing:
                not_bundled.append({"name": case.name, "tags": sorted(case.tags),
                                    "description": case.description, "status": UNSUPPORTED,
                                    "detail": f"{backend} does not claim {', '.join(missing)}"})
                note(case.name, UNSUPPORTED)
                continue
            try:
                entries.append(_bundle_case(runner, case, platform, out_dir, reuse))
                note(case.name, "bundled")
            except Exception as e:  # noqa: BLE001 - recorded in the manifest
                status = _export_status(e, backend, target)
                not_bundled.append({"name": case.name, "tags": sorted(case.tags),
                                    "description": case.description, "status": status,
                                    "detail": f"not exported: {_describe(e)}"})
                note(case.name, status)
        bench_entries, bench_left_out = _benchmarks(backend, platform, target, benchmarks,
                                                    keyword, examples_dir, out_dir, note)
    versions = {"jax": jax.__version__, "jaxlib": _dist_version("jaxlib"),
                "pallas_core": pallas.__version__, "pallas_conformance": __version__,
                "python": _platform.python_version()}
    for dist in (b.package, "triton", "jax-cuda13-plugin"):
        if dist and dist not in ("pallas-core",) and _dist_version(dist) != "?":
            versions[dist] = _dist_version(dist)
    disabled = sorted({t for e in entries for t in e["disabled_checks"]}
                      | {t for e in bench_entries for r in ("kernel", "reference")
                         for t in e[r]["disabled_checks"]})
    manifest = {
        "schema": SCHEMA,
        "backend": b.name,
        "backend_version": b.version,
        "backend_package": b.package,
        "platform": platform,
        "target": target,
        "claimed": sorted(claims),
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "built_with": versions,
        "selection": {"keyword": keyword, "tags": sorted(tags or []), "benchmarks": benchmarks},
        "disabled_checks": {"custom_call": disabled},
        "custom_calls": sorted({t for e in entries for t in e["custom_calls"]}
                               | {t for e in bench_entries for r in ("kernel", "reference")
                                  for t in e[r]["custom_calls"]}),
        "cases": entries,
        "not_bundled": not_bundled,
        "benchmarks": bench_entries,
        "benchmarks_left_out": bench_left_out,
    }
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    runner_src = importlib.resources.files("pallas_conformance").joinpath("run_bundle.py")
    with open(os.path.join(out_dir, "run_bundle.py"), "w", encoding="utf-8") as f:
        f.write(runner_src.read_text(encoding="utf-8"))
    vendor_flatbuffers(out_dir)
    return manifest


def vendor_flatbuffers(out_dir: str) -> None:
    """Copies the pure-Python ``flatbuffers`` package (Apache 2.0, ~100 KB) into
    ``_vendor/``: ``jax.export.deserialize`` needs it and jax does not depend on it, so
    a GPU host with only jax may lack it; the runner falls back to this copy."""
    try:
        import flatbuffers
    except ImportError:  # jax.export could not have serialised anything either
        return
    src = os.path.dirname(flatbuffers.__file__)
    dst = os.path.join(out_dir, "_vendor", "flatbuffers")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(out_dir, "_vendor", "README"), "w", encoding="utf-8") as f:
        f.write(f"flatbuffers {getattr(flatbuffers, '__version__', '?')} (Apache License "
                "2.0, https://github.com/google/flatbuffers), copied unchanged from the "
                "machine that built this bundle; run_bundle.py uses it only when "
                "`import flatbuffers` fails.\n")


def _benchmarks(backend, platform, target, size, keyword, examples_dir, out_dir, note):
    if size == "none":
        return [], {}
    if size not in ("full", "small"):
        raise ValueError(f"benchmarks={size!r}: expected full, small, none or auto")
    benches = bench_kernels.benchmarks(backend, size)
    left_out: dict[str, str] = {}
    folder = examples_dir or bench_examples.default_examples_dir()
    if folder:
        more, left_out = bench_examples.example_benchmarks(folder, backend, target, size)
        benches += more
    else:
        left_out["examples/*"] = "no examples/ folder found (pass --examples DIR)"
    entries = []
    for bench in benches:
        if keyword and keyword not in bench.name:
            continue
        try:
            entries.append(_bundle_benchmark(bench, platform, out_dir))
            note(bench.name, "bundled")
        except Exception as e:  # noqa: BLE001 - recorded in the manifest
            left_out[bench.name] = f"not exported: {_describe(e)}"
            note(bench.name, FAIL)
    return entries, left_out


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def bundle_size(out_dir: str) -> int:
    """Bytes of every file in the bundle."""
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(out_dir) for f in files)
