"""pallas.tuning: configs searched by timing (or by the model), pruned with reasons, and
the winner reused under jit."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
from pallas import tuning


class ScriptedTimer(tuning.Timer):
    """Runs each config for real, but reports the seconds the test scripted for it."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.timed = seconds, []

    def time_once(self, call, config=None):
        jax.block_until_ready(call())
        self.timed.append(dict(config))
        return self.seconds(config)


def _scale(x, *, block, seen=None):
    """x * 2 in row blocks of ``block`` (records each config it is traced with)."""
    if seen is not None:
        seen.append(block)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    spec = pl.BlockSpec((block, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // block,), in_specs=[spec], out_specs=spec)(x)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path / "tuning.sqlite3"))
    monkeypatch.delenv(tuning.ENV_MODE, raising=False)
    monkeypatch.delenv(tuning.ENV_EMULATE, raising=False)
    return tuning.TuningCache()


CONFIGS = [{"block": 8}, {"block": 16}, {"block": 32}]


def test_the_config_timed_fastest_wins_and_is_cached(cache):
    timer = ScriptedTimer(lambda c: {8: 3.0, 16: 1.0, 32: 2.0}[c["block"]])
    f = tuning.autotune(CONFIGS, timer=timer)(_scale)
    x = jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128)
    np.testing.assert_array_equal(f(x), x * 2)
    report = f.last_report
    # Timed in rounds, one run of each config per round, so load changes fall on all.
    assert [t["block"] for t in timer.timed[:6]] == [8, 16, 32, 8, 16, 32]
    assert report.method == "measured" and report.chosen == {"block": 16}
    assert [r.status for r in report.results] == ["ranked", "chosen", "ranked"]
    assert [r.median for r in report.results] == [3.0, 1.0, 2.0]
    (entry,) = cache.entries()
    assert entry["config"] == {"block": 16} and entry["method"] == "measured"
    assert entry["device"] == jax.devices()[0].device_kind
    assert "interpret" in entry["backend"] and "float32[64, 128]" in entry["signature"]
    # A second call with the same shapes reuses the winner without timing anything.
    f(x)
    assert f.last_report.method == "cache" and len(timer.timed) == 3 * 5


def test_ties_break_by_config_order(cache):
    f = tuning.autotune(CONFIGS, timer=ScriptedTimer(lambda c: 1.0))(_scale)
    f(jnp.ones((64, 128)))
    assert f.last_report.chosen == {"block": 8}


def test_same_measurements_same_choice(cache, tmp_path):
    times = {8: 2.0, 16: 2.0, 32: 1.5}
    chosen = []
    for i in range(2):
        c = tuning.TuningCache(tmp_path / f"c{i}.sqlite3")
        f = tuning.autotune(CONFIGS, timer=ScriptedTimer(lambda c: times[c["block"]]),
                            cache=c)(_scale)
        f(jnp.ones((64, 128)))
        chosen.append(f.last_report.chosen)
    assert chosen == [{"block": 32}] * 2


def _repeat_matmul(x, *, reps):
    """x @ x as the sum over ``reps`` grid steps of (i + 1) / T * x @ x, T = sum(i + 1):
    the same result for every config, but ``reps`` times the work. Each step's product
    depends on its grid index, so XLA cannot hoist it out of the grid loop (a
    loop-invariant x @ x was hoisted, and 256 steps cost no more than one)."""

    def kernel(x_ref, o_ref):
        i = pl.program_id(0)

        @pl.when(i == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        w = (i + 1).astype(jnp.float32) / (reps * (reps + 1) / 2)
        o_ref[...] += jnp.dot(x_ref[...] * w, x_ref[...])

    spec = pl.BlockSpec(x.shape, lambda i: (0, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(reps,), in_specs=[spec], out_specs=spec)(x)


def test_real_timing_picks_the_config_that_is_not_slow_on_purpose(cache):
    # 512 times the work (1 step or 512 of a 128x128x128 matmul each): the medians
    # differ by about two orders of magnitude, far beyond a loaded machine's noise.
    f = tuning.autotune([{"reps": 512}, {"reps": 1}], warmup=1, repeats=3)(_repeat_matmul)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((128, 128)), jnp.float32)
    np.testing.assert_allclose(f(x), x @ x, rtol=1e-4, atol=1e-3)
    slow, fast = f.last_report.results
    assert f.last_report.chosen == {"reps": 1}, str(f.last_report)
    assert fast.status == "chosen" and slow.median > fast.median


def test_jit_uses_the_tuned_entry(cache):
    seen = []
    f = tuning.autotune(CONFIGS, timer=ScriptedTimer(lambda c: 1.0 / c["block"]))(
        lambda x, *, block: _scale(x, block=block, seen=seen))
    report = tuning.tune(f, jax.ShapeDtypeStruct((64, 128), jnp.float32))
    assert report.chosen == {"block": 32} and report.method == "measured"
    seen.clear()
    x = jnp.ones((64, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jax.jit(f)(x)
    np.testing.assert_array_equal(out, x * 2)
    assert seen[-1] == 32 and f.last_report.method == "cache"


def test_jit_without_a_tuned_entry_warns_once_and_runs_the_first_config(cache):
    seen = []
    f = tuning.autotune(CONFIGS, timer=ScriptedTimer(lambda c: 1.0))(
        lambda x, *, block: _scale(x, block=block, seen=seen))
    with pytest.warns(tuning.AutotuneWarning, match=r"pallas\.tuning\.tune\(f, \*example_args\)"):
        jax.jit(f)(jnp.ones((64, 128)))
    assert seen[-1] == 8 and f.last_report.method == "default"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.jit(f)(jnp.ones((32, 128)))  # one warning per function, not per shape
    assert cache.entries() == []


def test_pruned_configs_carry_their_reasons(cache):
    def bad_trace(x, *, block):
        if block == 16:
            raise ValueError("block 16 is not supported by this kernel")
        return _scale(x, block=block)

    f = tuning.autotune([{"block": 24}, {"block": 16}, {"block": 32}, {"block": 8}],
                        timer=ScriptedTimer(lambda c: 1.0),
                        prune=lambda c, x: "too small" if c["block"] < 16 else None)(bad_trace)
    f(jnp.ones((64, 128)))
    reasons = {r.config["block"]: r.reason for r in f.last_report.pruned}
    assert set(reasons) == {24, 16, 8}
    assert "block (24, 128) of args[0] does not tile its array (64, 128)" in reasons[24]
    assert reasons[16] == "does not trace: ValueError: block 16 is not supported by this kernel"
    assert reasons[8] == "too small"
    assert f.last_report.chosen == {"block": 32}


def test_a_config_that_cannot_lower_is_pruned_with_its_reason(cache):
    # Mosaic TPU takes blocks whose last two dims are multiples of (8, 128): (8, 64) does
    # not lower for TPU. The host has no TPU, so the model ranks the rest and says so.
    f = tuning.autotune([{"cols": 64}, {"cols": 128}])(
        lambda x, *, cols: _cols(x, cols))
    report = tuning.tune(f, jax.ShapeDtypeStruct((16, 256), jnp.float32),
                         platform="tpu", kind="v5e")
    bad, good = report.results
    assert bad.status == "pruned"
    assert bad.reason.startswith("does not lower for tpu:") and "(8, 128)" in bad.reason
    assert good.status == "chosen" and report.method == "model"
    assert "without that device" in report.why_model and "static model" in str(report)
    (entry,) = cache.entries()
    assert entry["device"] == "tpu:v5e" and entry["method"] == "model"


def _cols(x, cols):
    spec = pl.BlockSpec((8, cols), lambda i, j: (i, j))
    return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // 8, x.shape[1] // cols),
                          in_specs=[spec], out_specs=spec)(x)


def test_an_emulated_device_is_ranked_by_the_model_with_backend_figures(cache, monkeypatch):
    monkeypatch.setenv(tuning.ENV_EMULATE, "tpu:v5e")
    calls = []

    def provider(request, target):  # a backend's compile figures: block 32 is too big
        calls.append(request.options["target"])
        block = request.grid_mapping.block_mappings[0].block_shape[0]
        return {"vmem_bytes": 64 << 20 if block == 32 else block * 1024}

    tuning.register_figures("mosaic_tpu", provider)
    try:
        f = tuning.autotune(CONFIGS)(_scale)
        f(jnp.ones((64, 128)))
    finally:
        tuning.unregister_figures("mosaic_tpu")
    report = f.last_report
    assert report.method == "model" and "PALLAS_EMULATE_DEVICE=tpu:v5e" in report.why_model
    assert calls == ["v5e"] * 3
    (pruned,) = report.pruned
    assert pruned.config == {"block": 32}
    assert "needs 67108864 bytes of VMEM (compiler); tpu:v5e allows 16777216" in pruned.reason
    # Fewer, larger steps cost less in the model: the larger block that fits wins.
    assert report.chosen == {"block": 16}
    assert cache.entries()[0]["device"] == "emulated tpu:v5e"


def test_modes(cache, monkeypatch):
    timer = ScriptedTimer(lambda c: 1.0 / c["block"])
    f = tuning.autotune(CONFIGS, timer=timer)(_scale)
    x = jnp.ones((64, 128))
    monkeypatch.setenv(tuning.ENV_MODE, "off")
    f(x)
    assert f.last_report.chosen == {"block": 8} and timer.timed == []
    monkeypatch.setenv(tuning.ENV_MODE, "cached")
    f(x)
    assert f.last_report.method == "default" and timer.timed == []
    monkeypatch.setenv(tuning.ENV_MODE, "on")
    f(x)
    assert f.last_report.chosen == {"block": 32}
    monkeypatch.setenv(tuning.ENV_MODE, "cached")
    f(x)
    assert f.last_report.method == "cache" and f.last_report.chosen == {"block": 32}
    monkeypatch.setenv(tuning.ENV_MODE, "sometimes")
    with pytest.raises(ValueError, match="PALLAS_AUTOTUNE='sometimes': expected one of off, cached, on"):
        f(x)


def test_no_config_survives(cache):
    f = tuning.autotune([{"block": 24}, {"block": 40}], timer=ScriptedTimer(lambda c: 1.0))(_scale)
    with pytest.raises(tuning.TuningError, match="no config of .* can run") as e:
        f(jnp.ones((64, 128)))
    assert len(e.value.report.pruned) == 2


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="configs is empty"):
        tuning.autotune([])
    with pytest.raises(TypeError, match=r"configs\[1\] must be a dict"):
        tuning.autotune([{"block": 8}, 16])
    with pytest.raises(TypeError, match="sequence of dicts"):
        tuning.autotune({"block": 8})
    with pytest.raises(ValueError, match="repeats=0"):
        tuning.autotune(CONFIGS, repeats=0)(_scale)
    with pytest.raises(TypeError, match="decorated with pallas.tuning.autotune"):
        tuning.tune(_scale, jnp.ones((8, 8)))


def test_key_replaces_the_shapes(cache):
    f = tuning.autotune(CONFIGS, timer=ScriptedTimer(lambda c: 1.0 / c["block"]),
                        key=lambda x: {"rows": "any"})(_scale)
    f(jnp.ones((64, 128)))
    assert cache.entries()[0]["signature"] == 'key:{"rows": "any"}'


def test_progress_bar_appears_only_after_a_couple_of_seconds(monkeypatch):
    import io

    from pallas._src.tuning.progress import Progress

    monkeypatch.setenv("PALLAS_TUNING_PROGRESS", "1")
    now = [0.0]
    out = io.StringIO()
    bar = Progress("f", 4, stream=out, clock=lambda: now[0])
    bar.step("a")
    assert out.getvalue() == ""
    now[0] = 3.0
    bar.step("b")
    bar.close()
    assert "tuning f [############............] 2/4 b" in out.getvalue()
    assert "4 configs in 3.0 s" in out.getvalue()


def test_kendall_tau():
    assert tuning.kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert tuning.kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert tuning.kendall_tau([1], [1]) is None


def test_a_config_that_raises_while_running_is_failed_with_its_error(cache):
    class Failing(ScriptedTimer):
        def time_once(self, call, config=None):
            if config["block"] == 16:
                raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
            return super().time_once(call, config)

    f = tuning.autotune(CONFIGS, timer=Failing(lambda c: 1.0 / c["block"]))(_scale)
    f(jnp.ones((64, 128)))
    failed = f.last_report.results[1]
    assert failed.status == "failed" and failed.times == [] and failed.median is None
    assert failed.reason == "raised while running: RuntimeError: RESOURCE_EXHAUSTED: out of memory"
    assert f.last_report.chosen == {"block": 32}


@pytest.mark.parametrize("platform, kind, options", [
    ("cuda", "NVIDIA H100 80GB HBM3", {"target": "sm_90a", "compute_capability": 90}),
    ("cuda", "NVIDIA B200", {"target": "sm_100a", "compute_capability": 100}),
    ("cuda", "NVIDIA A100-SXM4-40GB", {"target": "sm_80", "compute_capability": 80}),
    ("cuda", "sm_90a", {"target": "sm_90a", "compute_capability": 90}),
    ("tpu", "TPU v5 lite", {"target": "v5e"}),
    ("tpu", "TPU v6 lite", {"target": "v6e"}),
    ("tpu", "TPU7x", {"target": "7x"}),
])
def test_a_device_kind_names_its_compiler_target(platform, kind, options):
    # A measured search on a real device asks the backend's compiler for figures: it
    # must name the target as the compiler does, not as jax.Device.device_kind does.
    assert tuning.Target(platform, kind, measured=True).compile_options() == options
