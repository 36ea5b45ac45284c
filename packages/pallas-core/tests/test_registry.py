"""The plugin registry: discovery through the ``pallas.backends`` entry-point group,
listing, the selection order, and loud failures.

A throwaway third-party backend (``tests/fixtures/toy_backend``: a module and a real
``toy_backend-0.1.dist-info`` with an ``entry_points.txt``) is put on ``sys.path`` by the
``toy_backend`` fixture, so discovery runs through ``importlib.metadata`` exactly as for
an installed package; nothing in the registry is monkeypatched. Selection order:
``backend=`` > the type of ``compiler_params`` > ``PALLAS_BACKEND_<PLATFORM>`` > the
highest priority for the platform.
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins

SDS = jax.ShapeDtypeStruct


def _toy():
    """The toy plugin module, as the registry loaded it."""
    return importlib.import_module("toy_backend")


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def _call(**kw):
    x = jnp.arange(8, dtype=jnp.float32)
    f = pl.pallas_call(_add_kernel, SDS(x.shape, x.dtype), name="toy_add", **kw)
    out = f(x, x)
    np.testing.assert_array_equal(out, 2 * np.arange(8))
    return out


def _lowered_by(**kw) -> list[str]:
    """Lowers a kernel for platform cpu; returns the toy backends that lowered it."""
    x = jnp.arange(8, dtype=jnp.float32)
    f = pl.pallas_call(_add_kernel, SDS(x.shape, x.dtype), name="toy_add", **kw)
    calls = _toy().CALLS
    start = len(calls)
    jax.jit(f).trace(x, x).lower(lowering_platforms=("cpu",))
    return [name for name, _ in calls[start:]]


@pytest.fixture(autouse=True)
def _no_env_selection(monkeypatch):
    monkeypatch.delenv("PALLAS_BACKEND_CPU", raising=False)


# --------------------------------------------------------------------------------------
# Built-in backend and the contract


def test_the_builtin_interpret_backend_is_always_listed(clean_registry):
    backends = {b.name: b for b in pallas.plugins.list_backends()}
    b = backends["interpret"]
    assert b.version == pl.__version__
    assert "cpu" in b.platforms
    assert b.package == "pallas-core"
    assert isinstance(b, pallas.plugins.Backend)


def test_entry_point_group_name():
    assert pallas.plugins.ENTRY_POINT_GROUP == "pallas.backends"
    assert pallas.plugins.env_var("cpu") == "PALLAS_BACKEND_CPU"
    assert pallas.plugins.env_var("cuda") == "PALLAS_BACKEND_CUDA"


def test_hookspecs_name_the_two_hooks():
    from pallas._src.registry import hookspecs

    assert callable(hookspecs.pallas_backends) and callable(hookspecs.pallas_interpret_rules)
    assert pallas.plugins.hookimpl.project_name == "pallas"


def test_backend_base_class_lower_is_required():
    b = pallas.plugins.Backend(name="x", version="1", platforms=("cpu",))
    with pytest.raises(NotImplementedError, match="'x'.*lower"):
        b.lower(pallas.plugins.LoweringRequest(ctx=None, jaxpr=None, grid_mapping=None,
                                               name="k"))
    assert b.describe() == "x 1 (cpu)"


# --------------------------------------------------------------------------------------
# Discovery and listing


def test_a_third_party_backend_is_discovered_lazily(toy_backend):
    assert "toy_backend" not in sys.modules  # nothing imported before first use
    names = [b.name for b in pallas.plugins.list_backends()]
    assert "toy_backend" in sys.modules
    assert {"interpret", "toy", "toy_low"} <= set(names)
    assert names == sorted(names)  # deterministic order


def test_a_third_party_backend_is_listed_with_version_and_platforms(toy_backend):
    backends = {b.name: b for b in pallas.plugins.list_backends()}
    toy = backends["toy"]
    assert toy.version == "0.1"
    assert toy.platforms == ("cpu",)
    assert toy.package == "toy-backend"
    assert toy.capabilities == frozenset({"elementwise"})
    assert toy.compiler_params_type is _toy().ToyCompilerParams
    assert pallas.plugins.get_backend("toy") is toy
    assert pallas.plugins.load_failures() == {}


def test_reset_forgets_a_backend_that_is_no_longer_installed(toy_backend):
    assert "toy" in {b.name for b in pallas.plugins.list_backends()}
    sys.path.remove(toy_backend)  # "uninstall" (the fixture restores sys.path)
    importlib.invalidate_caches()
    pallas.plugins.reset()
    assert "toy" not in {b.name for b in pallas.plugins.list_backends()}


def test_backend_interpreter_rules_come_from_the_plugin(toy_backend):
    pallas.plugins.list_backends()  # discovery registers the rules
    toy = _toy()
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = toy.toy_double(x_ref[...]) + 1

    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), interpret=True)(x)
    np.testing.assert_array_equal(out, 2 * np.arange(4) + 1)


def test_register_backend_adds_an_in_process_backend(clean_registry):
    b = pallas.plugins.Backend(name="in_process", version="9", platforms=("cpu",))
    pallas.plugins.register_backend(b)
    assert pallas.plugins.get_backend("in_process") is b
    pallas.plugins.reset()
    assert "in_process" not in {x.name for x in pallas.plugins.list_backends()}


# --------------------------------------------------------------------------------------
# Selection


def test_selected_by_priority_for_the_platform(toy_backend):
    # toy has priority 10 for cpu; the built-in interpret backend has 0.
    assert pallas.plugins.select_backend("cpu").name == "toy"
    assert _lowered_by() == ["toy"]
    _call()  # and it runs: eager dispatch lowers for cpu too
    assert _toy().CALLS[-1] == ("toy", "toy_add")


def test_selected_by_backend_argument(toy_backend):
    assert _lowered_by(backend="toy_low") == ["toy_low"]
    _call(backend="toy_low")
    assert _toy().CALLS[-1][0] == "toy_low"


def test_builtin_interpret_backend_selected_by_name_over_a_higher_priority(toy_backend):
    assert _lowered_by(backend="interpret") == []
    _call(backend="interpret")


def test_selected_by_compiler_params_type(toy_backend):
    params = _toy().ToyLowCompilerParams()
    assert pallas.plugins.select_backend("cpu", compiler_params=params).name == "toy_low"
    assert _lowered_by(compiler_params=params) == ["toy_low"]


def test_selected_by_environment_variable(toy_backend, monkeypatch):
    monkeypatch.setenv("PALLAS_BACKEND_CPU", "toy_low")
    assert pallas.plugins.select_backend("cpu").name == "toy_low"
    assert _lowered_by() == ["toy_low"]
    monkeypatch.setenv("PALLAS_BACKEND_CPU", "interpret")
    assert _lowered_by() == []


def test_explicit_choices_beat_the_environment_variable(toy_backend, monkeypatch):
    monkeypatch.setenv("PALLAS_BACKEND_CPU", "toy_low")
    assert _lowered_by(backend="toy") == ["toy"]
    assert _lowered_by(compiler_params=_toy().ToyCompilerParams()) == ["toy"]


def test_backend_argument_beats_compiler_params(toy_backend):
    params = _toy().ToyCompilerParams()
    b = pallas.plugins.select_backend("cpu", backend="toy_low", compiler_params=params)
    assert b.name == "toy_low"


def test_environment_variable_naming_a_missing_backend(toy_backend, monkeypatch):
    monkeypatch.setenv("PALLAS_BACKEND_CPU", "nope")
    with pytest.raises(pallas.plugins.BackendNotFoundError, match="'nope'"):
        pallas.plugins.select_backend("cpu")


def test_explicit_backend_for_a_platform_it_does_not_lower_for(toy_backend):
    with pytest.raises(ValueError, match="'toy' lowers for cpu, not for platform 'tpu'"):
        pallas.plugins.select_backend("tpu", backend="toy")


def test_no_backend_for_a_platform(clean_registry):
    with pytest.raises(pallas.plugins.BackendNotFoundError,
                       match="No installed Pallas backend lowers for platform 'toyplatform'"):
        pallas.plugins.select_backend("toyplatform")


def test_interpret_true_bypasses_backend_selection(toy_backend):
    pallas.plugins.list_backends()
    calls = len(_toy().CALLS)
    _call(interpret=True)
    assert len(_toy().CALLS) == calls


def test_compiler_params_selection_at_trace_time_checks_the_backend_exists(toy_backend):
    # The toy params name "toy"; once the distribution is gone the call fails early.
    params = _toy().ToyCompilerParams()
    sys.path.remove(toy_backend)  # "uninstall" (the fixture restores sys.path)
    importlib.invalidate_caches()
    pallas.plugins.reset()
    with pytest.raises(pallas.plugins.BackendNotFoundError, match="'toy'"):
        pl.pallas_call(_add_kernel, SDS((8,), jnp.float32), compiler_params=params)


# --------------------------------------------------------------------------------------
# The dict form of compiler_params, and errors that say what to do


def _params_received(compiler_params) -> object:
    assert _lowered_by(compiler_params=compiler_params) == ["toy"]  # a dict selects none
    return _toy().PARAMS[-1]


def test_the_dict_form_gives_the_chosen_backend_its_own_entry(toy_backend):
    got = _params_received({"toy": {"flavour": "spicy"}, "mosaic_tpu": {"a": 1}})
    assert got == _toy().ToyCompilerParams(flavour="spicy")
    # Nothing for toy: its type's defaults (coerced once, by the core; it was None).
    assert _params_received({"triton": {"num_warps": 8}}) == _toy().ToyCompilerParams()


def test_the_dict_form_is_checked_at_trace_time(toy_backend):
    with pytest.raises(ValueError, match=r"compiler_params\['tpu'\]: no Pallas backend "
                                         r"is called 'tpu'.*mosaic_tpu"):
        pl.pallas_call(_add_kernel, SDS((8,), jnp.float32),
                       compiler_params={"tpu": {}})(jnp.zeros(8), jnp.zeros(8))
    with pytest.raises(TypeError, match=r"compiler_params\['toy'\] must be a dict"):
        pl.pallas_call(_add_kernel, SDS((8,), jnp.float32),
                       compiler_params={"toy": 3})(jnp.zeros(8), jnp.zeros(8))
    with pytest.raises(TypeError, match=r"compiler_params\['toy'\] does not fit .*"
                                        r"ToyCompilerParams.*options are flavour"):
        _lowered_by(compiler_params={"toy": {"colour": "red"}})


def test_a_backend_for_another_platform_says_how_to_run_here(toy_backend):
    with pytest.raises(ValueError, match=r"pass interpret=True.*lowering_platforms=\('cpu',\)"):
        pallas.plugins.select_backend("tpu", backend="toy")


def test_public_exceptions_print_their_public_path():
    import traceback

    for cls in (pallas.plugins.BackendNotFoundError, pallas.plugins.BackendLoadError,
                pallas.plugins.PluginLoadWarning):
        line = traceback.format_exception_only(cls, cls("x"))[-1]
        assert line.startswith(f"pallas.plugins.{cls.__name__}: x")


# --------------------------------------------------------------------------------------
# Broken plugins


def _discover_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pallas.plugins.PluginLoadWarning)
        return pallas.plugins.list_backends()


def test_a_broken_plugin_is_reported_by_name_with_its_exception(broken_backend):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backends = pallas.plugins.list_backends()
    assert any(
        issubclass(w.category, pallas.plugins.PluginLoadWarning)
        and re.search(r"'broken'.*ImportError.*toy accelerator driver is missing",
                      str(w.message))
        for w in caught
    )
    assert "interpret" in {b.name for b in backends}  # the rest still load
    failures = pallas.plugins.load_failures()
    assert isinstance(failures["broken"], ImportError)
    assert "toy accelerator driver is missing" in str(failures["broken"])


def test_every_kind_of_plugin_failure_is_reported_under_its_entry_point_name(broken_backend):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pallas.plugins.list_backends()
    messages = [str(w.message) for w in caught
                if issubclass(w.category, pallas.plugins.PluginLoadWarning)]
    failures = pallas.plugins.load_failures()
    assert set(failures) == {"broken", "faulty", "bogus"}
    assert isinstance(failures["faulty"], RuntimeError)
    assert "no toy devices found" in str(failures["faulty"])
    assert isinstance(failures["bogus"], (TypeError, ValueError))
    for name in ("broken", "faulty", "bogus"):
        assert any(repr(name) in m for m in messages), (name, messages)
    assert any("no toy devices found" in m for m in messages)
    assert any("not a pallas.plugins.Backend" in m for m in messages)
    assert any("rules table is corrupt" in m for m in messages)


def test_a_broken_plugin_is_named_when_a_missing_backend_is_requested(broken_backend):
    _discover_quietly()
    with pytest.raises(pallas.plugins.BackendNotFoundError) as info:
        pallas.plugins.get_backend("broken")
    msg = str(info.value)
    assert "'broken'" in msg and "failed to load" in msg and "ImportError" in msg


def test_discovery_runs_once_even_with_broken_plugins(broken_backend):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pallas.plugins.list_backends()
    assert caught
    with warnings.catch_warnings():
        warnings.simplefilter("error", pallas.plugins.PluginLoadWarning)
        pallas.plugins.list_backends()  # no second round of warnings
        pallas.plugins.load_failures()


def test_a_broken_plugin_does_not_hide_a_working_one(broken_backend, toy_backend):
    names = {b.name for b in _discover_quietly()}
    assert {"toy", "toy_low", "interpret"} <= names
    assert set(pallas.plugins.load_failures()) == {"broken", "faulty", "bogus"}


# --------------------------------------------------------------------------------------
# A backend asked for by name loads only its own plugin


def test_a_backend_asked_for_by_name_imports_no_other_plugin(broken_backend, toy_backend):
    x = jnp.arange(8, dtype=jnp.float32)
    f = pl.pallas_call(_add_kernel, SDS(x.shape, x.dtype), backend="toy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pallas.plugins.PluginLoadWarning)
        toy = pallas.plugins.get_backend("toy")  # the broken plugins are not loaded yet
        jax.jit(f).trace(x, x)  # nor by tracing a kernel for it
    assert toy.name == "toy" and toy.package == "toy-backend"
    assert "faulty_backends" not in sys.modules and "bogus_backends" not in sys.modules
    # listing loads every plugin, and the broken ones are reported as before
    assert {"toy", "toy_low", "interpret"} <= {b.name for b in _discover_quietly()}
    assert set(pallas.plugins.load_failures()) == {"broken", "faulty", "bogus"}
    assert pallas.plugins.get_backend("toy") is toy


def test_a_backend_no_entry_point_is_named_after_is_found_by_loading_them_all(toy_backend):
    assert pallas.plugins.get_backend("toy_low").name == "toy_low"
    assert "interpret" in {b.name for b in pallas.plugins.list_backends()}


def test_a_missing_backend_is_reported_after_loading_every_plugin(broken_backend):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(pallas.plugins.BackendNotFoundError, match="'nope'.*broken"):
            pallas.plugins.get_backend("nope")
    assert any("'broken'" in str(w.message) for w in caught)


@pytest.mark.parametrize("first", ["get_backend", "list_backends"])
def test_a_backend_name_two_plugins_provide_goes_to_the_entry_point_of_that_name(
        toy_backend, rival_backend, first):
    # a_rival sorts before toy and also provides "toy": toy's own entry point wins,
    # whether the name is asked for first or every plugin is loaded first
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if first == "get_backend":
            pallas.plugins.get_backend("toy")
        pallas.plugins.list_backends()
    assert pallas.plugins.get_backend("toy").package == "toy-backend"
    failures = pallas.plugins.load_failures()
    assert set(failures) == {"a_rival"}
    assert "already provided by toy-backend" in str(failures["a_rival"])
    assert any("'a_rival'" in str(w.message) for w in caught)
