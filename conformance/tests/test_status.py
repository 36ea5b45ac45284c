"""The "Backend status" page: rendered from published JSON reports."""

from __future__ import annotations

import json

import pytest

from pallas_conformance.status import load_reports, render_status
from pallas_conformance.suite import run_suite, select_cases


@pytest.fixture(scope="module")
def report():
    cases = select_cases(keyword="kernels/softmax")
    return run_suite("interpret", levels=["interpret", "lower"], cases=cases).to_json()


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_table_per_backend_with_a_row_per_tag_and_a_column_per_level(tmp_path, report):
    write(tmp_path, "interpret.json", report)
    page = render_status([str(tmp_path)])
    assert "## `interpret` " in page
    assert "| tag | cases | interpret | lower |" in page
    assert "| kernels | 2 | 2 pass | 2 pass |" in page
    assert "| **all** | 2 | 2 pass | 2 pass |" in page
    assert "result: **PASS**" in page


def test_the_newest_release_of_a_backend_is_shown(tmp_path, report):
    old = dict(report, backend_version="0.1.0", ok=False)
    new = dict(report, backend_version="0.10.0")
    write(tmp_path, "a.json", new)
    write(tmp_path, "b.json", old)
    (shown,) = load_reports([str(tmp_path)])
    assert shown["backend_version"] == "0.10.0"


def test_a_run_on_a_device_is_shown_beside_the_cpu_levels(tmp_path, report):
    write(tmp_path, "interpret.json", report)
    on_gpu = dict(report, levels=["execute"], created="2099-01-01 00:00 UTC",
                  device={"platform": "gpu", "kind": "NVIDIA H100 80GB HBM3"})
    write(tmp_path, "interpret-execute-h100.json", on_gpu)
    assert len(load_reports([str(tmp_path)])) == 2
    page = render_status([str(tmp_path)])
    assert "## `interpret` 0.1.0 on NVIDIA H100 80GB HBM3" in page
    assert "(#interpret-010-on-nvidia-h100-80gb-hbm3)" in page
    assert "| tag | cases | interpret | lower |" in page


def test_failures_are_marked(tmp_path, report):
    bad = json.loads(json.dumps(report))
    bad["ok"] = False
    bad["summary"]["kernels/lower"] = {"pass": 1, "fail": 1}
    write(tmp_path, "interpret.json", bad)
    page = render_status([str(tmp_path)])
    assert "| kernels | 2 | 2 pass | 1 pass, **1 FAIL** |" in page
    assert "**FAIL**" in page.split("\n\n")[0]  # the index row too


def test_no_reports_and_foreign_files(tmp_path):
    assert "No reports" in render_status([str(tmp_path)])
    write(tmp_path, "x.json", {"schema": "something-else"})
    with pytest.raises(ValueError, match="not a pallas-conformance report"):
        render_status([str(tmp_path)])


def test_a_run_for_another_platform_and_target_is_a_section_of_its_own(tmp_path, report):
    main = dict(report, backend="triton", platforms=["cuda", "rocm"], platform="cuda")
    amd = dict(main, platform="rocm", target="gfx942")
    write(tmp_path, "triton.json", main)
    write(tmp_path, "triton-rocm.json", amd)
    shown = load_reports([str(tmp_path)])
    assert [(d["platform"], d.get("target")) for d in shown] == [("cuda", None),
                                                                  ("rocm", "gfx942")]
    page = render_status([str(tmp_path)])
    assert "## `triton` 0.1.0 (rocm, gfx942)" in page
    assert "this run: rocm, target gfx942" in page
    assert "(#triton-010-rocm-gfx942)" in page
