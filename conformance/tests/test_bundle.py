"""Bundles: ``pallas-conformance bundle`` exports cases and benchmarks, and the bundle's
stand-alone ``run_bundle.py`` runs them where only jax and numpy are installed."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys

import jax
import jaxlib
import numpy as np
import pytest

from pallas_conformance import run_bundle
from pallas_conformance.bundle import build_bundle, bundle_size
from pallas_conformance.bundle_cli import main as bundle_main
from pallas_conformance.levels import can_lower_for
from pallas_conformance.suite import run_suite, select_cases

KEYWORD = "softmax"  # four cases (grad, bf16, sequential grids) and two benchmarks


@pytest.fixture(scope="module")
def interpret_bundle(tmp_path_factory):
    """An interpret bundle, built once per test run (shared by pytest-xdist's workers,
    which take turns on a lock: the first builds it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    out = root / "interpret-bundle"
    with open(root / "interpret-bundle.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "run_bundle.py").exists():
            build_bundle("interpret", str(out), keyword=KEYWORD, benchmarks="small")
    with open(out / "manifest.json") as f:
        return str(out), json.load(f)


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "HATCH_", "PYTHONHOME"))}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _fresh_python(tmp_path) -> str:
    """A new virtual environment holding jax, jaxlib and numpy (and their own
    dependencies) only: no pallas package, no flatbuffers, no site-packages of this
    environment. ``uv`` installs them ``--offline`` from its cache, which ``hatch env
    create`` (uv is hatch's installer here) filled with these very wheels: no network,
    and about a second, as uv links files from its cache instead of unpacking wheels."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (hatch's installer; it makes the fresh venv)")
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True,
                   env=_clean_env())
    py = str(venv / "bin" / "python")
    r = subprocess.run([uv, "pip", "install", "-q", "--offline", "--python", py,
                        f"jax=={jax.__version__}", f"jaxlib=={jaxlib.__version__}",
                        f"numpy=={np.__version__}"], capture_output=True, text=True,
                       env=_clean_env())
    if r.returncode:
        pytest.skip(f"jax {jax.__version__} is not in uv's cache: {r.stderr.strip()[:300]}")
    probe = ("import importlib.util as u, sys; "
             "sys.exit(any(u.find_spec(m) for m in ('pallas', 'pallas_conformance', "
             "'flatbuffers')))")
    subprocess.run([py, "-c", probe], check=True, env=_clean_env())
    return py


def test_interpret_bundle_runs_in_a_fresh_venv_and_matches_the_conformance_run(
        interpret_bundle, tmp_path):
    out, manifest = interpret_bundle
    assert manifest["platform"] == "cpu" and manifest["schema"] == "pallas-bundle/1"
    assert len(manifest["cases"]) == 4 and len(manifest["benchmarks"]) == 2
    assert os.path.isfile(os.path.join(out, "run_bundle.py"))
    py = _fresh_python(tmp_path)
    report_path = str(tmp_path / "report.json")
    r = subprocess.run([py, os.path.join(out, "run_bundle.py"), "--report", report_path,
                        "--iters", "3"], capture_output=True, text=True, env=_clean_env(),
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "execute: 4 pass, 0 fail" in r.stdout
    with open(report_path) as f:
        report = json.load(f)
    assert report["schema"] == "pallas-conformance-report/1" and report["ok"]
    assert report["levels"] == ["execute"] and report["device"]["platform"] == "cpu"
    got = {r["case"]: r["status"] for r in report["results"]}
    suite = run_suite("interpret", levels=["execute"], cases=select_cases(keyword=KEYWORD))
    want = {r.case: r.status for r in suite.results}
    assert got == want
    assert {k: v["tags"] for k, v in report["cases"].items()} == \
        {k: v["tags"] for k, v in suite.to_json()["cases"].items()}
    benches = {b["name"]: b for b in report["benchmarks"]}
    assert len(benches) == 2 and all(b["status"] == "pass" for b in benches.values())
    for b in benches.values():
        assert b["kernel_ms"] > 0 and b["reference_ms"] > 0 and b["kernel_gbps"] > 0
        assert b["kernel_vs_reference"] == pytest.approx(b["reference_ms"] / b["kernel_ms"])


def test_an_edited_expected_output_fails_that_case_only_in_sharded_runs(interpret_bundle, tmp_path, capsys):
    src, manifest = interpret_bundle
    out = str(tmp_path / "edited")
    shutil.copytree(src, out)
    entry = next(e for e in manifest["cases"] if e["name"] == "kernels/softmax_f32")
    path = os.path.join(out, entry["data"])
    data = dict(np.load(path))
    data["out0"] = data["out0"].copy()
    data["out0"][3, 5] += 0.5
    np.savez_compressed(path, **data)
    # Two processes' shares of the cases (--shard), merged into one report (--merge).
    shards = [str(tmp_path / f"r{k}.json") for k in range(2)]
    rcs = [run_bundle.main(["--bundle", out, "--report", shards[k], "--no-benchmarks",
                            "--shard", f"{k}/2"]) for k in range(2)]
    assert sorted(rcs) == [0, 1]
    report_path = str(tmp_path / "r.json")
    assert run_bundle.main(["--merge", *shards, "--report", report_path]) == 1
    with open(report_path) as f:
        merged = json.load(f)
    assert merged["totals"] == {"pass": 3, "fail": 1} and not merged["ok"]
    results = {r["case"]: r for r in merged["results"]}
    bad = results.pop("kernels/softmax_f32")
    assert bad["status"] == "fail"
    assert "1 of 8192 elements differ" in bad["detail"] and "(3, 5)" in bad["detail"]
    assert all(r["status"] == "pass" for r in results.values())
    assert "FAIL kernels/softmax_f32" in capsys.readouterr().out


def test_the_budget_stops_cleanly_and_reports_what_ran(interpret_bundle, tmp_path):
    out, manifest = interpret_bundle
    report_path = str(tmp_path / "r.json")
    assert run_bundle.main(["--bundle", out, "--report", report_path, "--budget", "1e-9",
                            "-q"]) == 3
    with open(report_path) as f:
        report = json.load(f)
    assert report["budget"]["stopped"] and not report["ok"]
    assert len(report["budget"]["not_run"]) == 6  # every case and benchmark
    assert report["results"] == []


def test_a_bundle_of_another_schema_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "something-else"}))
    assert run_bundle.main(["--bundle", str(tmp_path)]) == 2
    assert "not a bundle manifest" in capsys.readouterr().err


@pytest.mark.skipif(can_lower_for("cuda") is not None,
                    reason="lowering for cuda needs jax-cuda13-plugin")
@pytest.mark.parametrize("backend,keyword,call", [
    ("triton", "kernels/softmax_f32", "triton_kernel_call"),
    # TMA copies and wgmma: effects of pallas-mosaic-gpu stay inside the kernel, so the
    # artifact serialises and loads where that package is not installed.
    ("mosaic_gpu", "gpu/wgmma_matmul_f16_swizzle128", "mosaic_gpu_v2"),
])
def test_gpu_bundles_export_for_cuda_and_stay_small(interpret_bundle, tmp_path, capsys,
                                                    backend, keyword, call):
    out = str(tmp_path / backend)
    # The interpreter's outputs of a case already bundled are reused, not recomputed.
    rc = bundle_main(["--backend", backend, "-k", keyword, "--benchmarks", "none",
                      "--reuse-expected", interpret_bundle[0], out])
    assert rc == 0, capsys.readouterr()
    with open(os.path.join(out, "manifest.json")) as f:
        m = json.load(f)
    assert m["platform"] == "cuda" and m["target"] == "sm_90a"
    assert [e["name"] for e in m["cases"]] == [keyword] and not m["not_bundled"]
    assert m["custom_calls"] == [call]
    # Only Triton's custom call lacks jax.export's compatibility guarantee.
    assert m["disabled_checks"]["custom_call"] == (
        ["triton_kernel_call"] if backend == "triton" else [])
    with open(os.path.join(out, m["cases"][0]["exported"]), "rb") as f:
        exp = jax.export.deserialize(bytearray(f.read()))
    assert exp.platforms == ("cuda",) and not exp.ordered_effects
    assert not exp.unordered_effects
    assert bundle_size(out) < 1 << 20
    assert "1 cases exported" in capsys.readouterr().out
    reused = {e["name"]: e for e in interpret_bundle[1]["cases"]}.get(keyword)
    if reused:
        with np.load(os.path.join(interpret_bundle[0], reused["data"])) as a, \
                np.load(os.path.join(out, m["cases"][0]["data"])) as b:
            assert sorted(a.files) == sorted(b.files)
            assert all(np.array_equal(a[k], b[k]) for k in a.files)
