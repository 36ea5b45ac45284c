"""pallas.tuning's cache: one SQLite file shared by processes, exported, merged, and the
``pallas-tune`` CLI over it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pallas import tuning
from pallas._src.tuning import cli


def _key(i: int, device: str = "cpu") -> tuning.CacheKey:
    return tuning.CacheKey(f"mod.f{i % 3}", f"float32[{i}, 128]", "abc", "interpret 0.1.0",
                           device)


def _run(code: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def env(tmp_path):
    e = {**os.environ, tuning.ENV_CACHE: str(tmp_path / "shared.sqlite3"),
         "JAX_PLATFORMS": "cpu"}
    e.pop(tuning.ENV_MODE, None)
    e.pop(tuning.ENV_EMULATE, None)
    return e


def test_cache_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path / "x.sqlite3"))
    assert tuning.default_path() == tmp_path / "x.sqlite3"
    monkeypatch.delenv(tuning.ENV_CACHE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert tuning.default_path() == tmp_path / "xdg" / "pallas" / "tuning.sqlite3"


def test_put_get_replace_and_clear(tmp_path):
    c = tuning.TuningCache(tmp_path / "c.sqlite3")
    assert c.get(_key(1)) is None and c.entries() == [] and c.clear() == 0
    c.put(_key(1), {"block": 8}, method="measured", score=1e-3)
    c.put(_key(1), {"block": 16}, method="measured", score=5e-4)
    c.put(_key(2), {"block": 32}, method="model", score=2.0)
    assert c.get(_key(1))["config"] == {"block": 16}
    assert len(c.entries()) == 2
    assert c.clear("f2") == 1 and [e["function"] for e in c.entries()] == ["mod.f1"]


def test_export_import_and_merge(tmp_path):
    a = tuning.TuningCache(tmp_path / "a.sqlite3")
    b = tuning.TuningCache(tmp_path / "b.sqlite3")
    a.put(_key(1), {"block": 8}, method="measured", score=1.0, created=100.0)
    a.put(_key(2), {"block": 8}, method="measured", score=1.0, created=100.0)
    b.put(_key(1), {"block": 64}, method="measured", score=0.5, created=200.0)  # newer
    b.put(_key(2), {"block": 64}, method="measured", score=0.5, created=50.0)   # older
    b.put(_key(4), {"block": 128}, method="model", score=3.0, created=50.0)
    doc = json.loads(json.dumps(b.export()))
    assert a.import_(doc) == {"added": 1, "replaced": 1, "kept": 1}
    assert a.get(_key(1))["config"] == {"block": 64} and a.get(_key(2))["config"] == {"block": 8}
    assert a.merge(b.path, on_conflict="replace") == {"added": 0, "replaced": 3, "kept": 0}
    assert a.get(_key(2))["config"] == {"block": 64}
    with pytest.raises(ValueError, match="not a pallas tuning cache export"):
        a.import_({"entries": []})
    with pytest.raises(ValueError, match="on_conflict must be"):
        a.import_(doc, on_conflict="sometimes")


def test_cli_show_export_import_clear(tmp_path, capsys):
    path = str(tmp_path / "c.sqlite3")
    tuning.TuningCache(path).put(_key(1), {"block": 8}, method="measured", score=2e-3)
    assert cli.main(["--cache", path, "show"]) == 0
    out = capsys.readouterr().out
    assert "1 entry" in out and 'chosen  {"block": 8}  (measured 2.000 ms' in out
    export = str(tmp_path / "e.json")
    assert cli.main(["--cache", path, "export", export]) == 0
    assert cli.main(["--cache", path, "clear"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert cli.main(["--cache", path, "import", export]) == 0
    assert "1 added, 0 replaced, 0 kept" in capsys.readouterr().out
    assert cli.main(["--cache", path, "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["config"] == {"block": 8}
    assert cli.main(["--cache", path, "import", str(tmp_path / "missing.json")]) == 1
    assert "pallas-tune:" in capsys.readouterr().err


def test_two_processes_writing_at_once_lose_nothing(env, tmp_path):
    writer = """
        import os, sys, time
        from pallas._src.tuning.cache import TuningCache
        from pallas._src.tuning.keys import CacheKey
        c, who, ready = TuningCache(), sys.argv[1], sys.argv[2]
        open(os.path.join(ready, who), "w").close()
        while len(os.listdir(ready)) < 2:  # both imported: start together
            time.sleep(0.005)
        for i in range(60):
            c.put(CacheKey("f", f"{who}-{i}", "x", "b", "cpu"), {"i": i, "who": who},
                  method="measured", score=float(i))
            c.put(CacheKey("f", "shared", "x", "b", "cpu"), {"i": i}, method="measured",
                  score=float(i))
    """
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(writer), who, str(ready)],
                              env=env, stderr=subprocess.PIPE, text=True)
             for who in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=240) == 0, p.stderr.read()
    entries = tuning.TuningCache(env[tuning.ENV_CACHE]).entries()
    sigs = {e["signature"] for e in entries}
    assert len(entries) == 121
    assert sigs == {"shared"} | {f"{w}-{i}" for w in "ab" for i in range(60)}


def test_a_second_process_reuses_the_winner(env, monkeypatch):
    program = """
        import jax, jax.numpy as jnp, pallas as pl
        from pallas import tuning

        class Scripted(tuning.Timer):
            def time_once(self, call, config=None):
                call()
                return {8: 3.0, 16: 1.0, 32: 2.0}[config["block"]]

        @tuning.autotune([{"block": 8}, {"block": 16}, {"block": 32}], timer=Scripted())
        def scale(x, *, block):
            spec = pl.BlockSpec((block, 128), lambda i: (i, 0))
            return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  grid=(x.shape[0] // block,), in_specs=[spec],
                                  out_specs=spec)(x)

        scale(jnp.ones((64, 128)))
        print(scale.last_report.method, scale.last_report.chosen)
    """
    # This process searches (as a module "__main__", the name the child files it under).
    monkeypatch.setenv(tuning.ENV_CACHE, env[tuning.ENV_CACHE])
    namespace = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(program), "<first process>", "exec"), namespace)
    assert namespace["scale"].last_report.method == "measured"
    assert tuning.TuningCache().entries()[0]["config"] == {"block": 16}
    second = _run(program, {**env, tuning.ENV_MODE: "cached"})
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "cache {'block': 16}"
