"""The ``pallas-conformance`` CLI and the reports it writes."""

from __future__ import annotations

import json
import subprocess
import sys

from pallas_conformance import all_cases
from pallas_conformance.cli import main


def test_cli_interpret_subset_writes_both_reports(tmp_path, capsys):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    code = main(["--backend", "interpret", "-k", "kernels/softmax", "--tag", "kernels",
                 "--report", str(md), "--report", str(js)])
    out = capsys.readouterr().out
    assert code == 0
    assert "| tag | cases | interpret | lower | execute |" in out
    assert "| kernels | 2 | 2 pass | 2 pass | 2 pass |" in out
    text = md.read_text()
    assert "## Summary by tag and level" in text and "`kernels/softmax_f32`" in text
    data = json.loads(js.read_text())
    assert data["ok"] is True and data["backend"] == "interpret"
    assert {(r["case"], r["level"]) for r in data["results"]} == {
        (c, lv) for c in ("kernels/softmax_f32", "kernels/softmax_bf16")
        for lv in ("interpret", "lower", "execute")}
    assert data["summary"]["kernels/lower"] == {"pass": 2}


def test_cli_reports_unsupported_cases(toy_backend, capsys):
    # The example backend does not claim vmap: unsupported, and not a failure.
    n = sum("vmap" in c.tags for c in all_cases())
    assert main(["--backend", "toy", "--tag", "vmap", "-l", "lower"]) == 0
    assert f"| vmap | {n} | {n} unsupported |" in capsys.readouterr().out


def test_cli_usage_errors(capsys):
    assert main(["--backend", "no_such_backend", "-k", "add_f32"]) == 2
    assert "not installed" in capsys.readouterr().err
    assert main(["--tag", "teleport"]) == 2


def test_cli_lists(capsys):
    assert main(["--list-backends"]) == 0
    assert "interpret" in capsys.readouterr().out
    assert main(["--list-cases", "--tag", "semaphores"]) == 0
    assert "semaphores/signal_wait_read" in capsys.readouterr().out


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "pallas_conformance", "--backend",
                           "interpret", "-k", "elementwise/add_f32", "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "PASS:" in proc.stdout


class _Terminal:
    """A stand-in for a terminal's stderr: ``isatty()`` is true and writes are kept."""

    def __init__(self):
        self.text = []

    def isatty(self):
        return True

    def write(self, s):
        self.text.append(s)

    def flush(self):
        pass


def test_cli_shows_a_progress_bar_on_a_terminal_only(monkeypatch, capsys):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["--backend", "interpret", "-k", "kernels/softmax", "-l", "interpret"]) == 0
    drawn = "".join(term.text)
    assert "2/2" in drawn and "result" in drawn  # the bar reached its total

    term.text.clear()
    assert main(["--backend", "interpret", "-k", "kernels/softmax", "-l", "interpret",
                 "--quiet"]) == 0
    assert "".join(term.text) == ""  # --quiet: no bar

    monkeypatch.undo()
    assert main(["--backend", "interpret", "-k", "kernels/softmax", "-l", "interpret"]) == 0
    assert "result/s" not in capsys.readouterr().err  # not a terminal: no bar


def test_cli_platform_and_target(tmp_path, capsys):
    js = tmp_path / "r.json"
    code = main(["--backend", "triton", "--platform", "rocm", "--target", "gfx90a",
                 "-k", "elementwise/add_f32", "-l", "compile", "--report", str(js)])
    out = capsys.readouterr().out
    assert code == 0 and "backend triton (rocm, gfx90a)" in out
    data = json.loads(js.read_text())
    assert (data["platform"], data["target"], data["ok"]) == ("rocm", "gfx90a", True)
    assert main(["--backend", "triton", "--platform", "tpu"]) == 2
    assert "not for 'tpu'" in capsys.readouterr().err
    assert main(["--backend", "triton", "--platform", "rocm", "--target", "gfx1"]) == 2
    assert "unknown AMD target 'gfx1'" in capsys.readouterr().err
