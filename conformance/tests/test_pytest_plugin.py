"""The pytest plugin: one test id per case and level, failures for planted faults.

Each test runs pytest in a subprocess in an empty directory; the plugin is loaded
through its ``pytest11`` entry point, as in a backend's own CI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from pallas_conformance import all_cases


def _pytest(tmp_path, *args, extra_paths=()):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_paths, env.get("PYTHONPATH", "")]).strip(
        os.pathsep)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return proc


def _outcomes(proc) -> dict[str, int]:
    last = proc.stdout.strip().splitlines()[-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected)", last)}


def test_plugin_is_inactive_without_option(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _outcomes(proc) == {"passed": 1}
    assert "pallas-conformance" in proc.stdout  # listed among the plugins


def test_plugin_runs_cases_per_level_and_writes_report(tmp_path):
    report = tmp_path / "report.json"
    proc = _pytest(tmp_path, "--pallas-backend=interpret", "--pallas-tag=kernels",
                   "-k", "softmax_f32 or layer_norm", "--pallas-report", str(report), "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _outcomes(proc)["passed"] == 6
    for level in ("interpret", "lower", "execute"):
        assert f"pallas-conformance::interpret:{level}:kernels/softmax_f32 PASSED" in proc.stdout
    data = json.loads(report.read_text())
    assert data["ok"] and data["totals"] == {"pass": 6}


def test_plugin_reports_unsupported_as_skips(tmp_path, toy_site):
    proc = _pytest(tmp_path, "--pallas-backend=toy", "--pallas-tag=vmap",
                   "--pallas-level=lower", "-rs", extra_paths=toy_site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _outcomes(proc) == {"skipped": sum("vmap" in c.tags for c in all_cases())}
    assert "unsupported: toy does not claim vmap" in proc.stdout


def test_plugin_reports_planted_fault(tmp_path, toy_site):
    proc = _pytest(tmp_path, "--pallas-backend=toy_off_by_one", "--pallas-level=lower",
                   "--pallas-level=emulate", "--pallas-tag=elementwise",
                   "-k", "add_i32 or add_f32", extra_paths=toy_site)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # add_i32 fails at emulate; add_f32 passes; both lower fine.
    outcomes = _outcomes(proc)
    assert (outcomes["passed"], outcomes["failed"]) == (3, 1)
    assert ("elementwise/add_i32 failed at level emulate for backend toy_off_by_one"
            in proc.stdout)
    assert "differ from the interpreter" in proc.stdout
