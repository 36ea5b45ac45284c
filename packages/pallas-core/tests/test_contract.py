"""The backend contract: typed hooks checked at load, typed requests, rule tables.

- A plugin whose ``@hookimpl`` names no Pallas hook (a misspelling) fails to load, and
  the failure names the plugin and the hook it meant; ``BackendLoadError`` is raised
  when a backend of a plugin that failed to load is asked for.
- Backend methods take one request; a backend written against the old keyword
  signatures is refused when its class is defined. What else a backend may offer
  (race kit, tuning figures, title) is declared on ``Backend`` with defaults.
- Rules live in ``RuleTable``s keyed by primitive objects; a second base rule from
  another package is an error; overrides apply in a fixed order, whatever the import
  order; gaps are declared with a reason.
"""

from __future__ import annotations

import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas.plugins as plugins

SDS = jax.ShapeDtypeStruct


def _install(tmp_path, monkeypatch, dist: str, entry_points: dict[str, str],
             modules: dict[str, str]) -> None:
    """A throwaway distribution with ``pallas.backends`` entry points, on sys.path."""
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[pallas.backends]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for name, src in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(src))
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.reset()


_MISSPELT = """
    from pallas.plugins import Backend, hookimpl

    @hookimpl
    def pallas_backend():  # misspelt: the hook is pallas_backends
        return [Backend(name="misspelt", version="0.1", platforms=("cpu",))]
"""


@pytest.fixture
def misspelt_plugin(tmp_path, monkeypatch, clean_registry):
    _install(tmp_path, monkeypatch, "misspelt-backend", {"misspelt": "misspelt_plugin"},
             {"misspelt_plugin": _MISSPELT})
    yield
    plugins.reset()


def test_a_misspelt_hook_is_a_load_error_naming_the_plugin(misspelt_plugin):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = {b.name for b in plugins.list_backends()}
    assert "misspelt" not in names and "interpret" in names
    err = plugins.load_failures()["misspelt"]
    assert isinstance(err, plugins.BackendLoadError)
    assert err.plugin == "misspelt"
    msg = str(err)
    assert "'misspelt'" in msg and "'pallas_backend'" in msg
    assert "did you mean 'pallas_backends'?" in msg
    assert any(issubclass(w.category, plugins.PluginLoadWarning)
               and "'pallas_backend'" in str(w.message) for w in caught)


def test_asking_for_the_backend_of_a_plugin_that_failed_raises_backend_load_error(
        misspelt_plugin):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", plugins.PluginLoadWarning)
        with pytest.raises(plugins.BackendLoadError, match="'misspelt' failed to load") as e:
            plugins.get_backend("misspelt")
    assert isinstance(e.value, plugins.BackendNotFoundError)  # still what callers catch
    assert isinstance(e.value.__cause__, plugins.BackendLoadError)


_HIJACKER = """
    from pallas.plugins import hookimpl, program_id_p

    @hookimpl
    def pallas_interpret_rules():  # replaces a core rule instead of overriding it
        return {program_id_p: lambda ctx, eqn, invals: [0]}
"""


def test_a_plugin_replacing_a_core_interpreter_rule_is_a_failure_named_by_plugin(
        tmp_path, monkeypatch, clean_registry):
    _install(tmp_path, monkeypatch, "hijack-backend", {"hijack": "hijack_plugin"},
             {"hijack_plugin": _HIJACKER})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", plugins.PluginLoadWarning)
        err = plugins.load_failures()["hijack"]
    assert isinstance(err, plugins.RuleConflictError)
    assert "'program_id'" in str(err) and "override" in str(err)
    assert plugins.interpret_rules.owners(plugins.program_id_p) == ["pallas"]
    plugins.reset()


def test_an_import_failure_is_raised_as_backend_load_error_with_its_cause(broken_backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", plugins.PluginLoadWarning)
        with pytest.raises(plugins.BackendLoadError) as e:
            plugins.get_backend("broken")
    assert isinstance(e.value.__cause__, ImportError)
    assert e.value.plugin == "broken"


def test_the_hookspecs_are_documented_and_typed():
    import inspect

    from pallas._src.registry import hookspecs

    for name in ("pallas_backends", "pallas_interpret_rules"):
        fn = getattr(hookspecs, name)
        assert ":return:" in fn.__doc__
        assert inspect.signature(fn).return_annotation != inspect.Signature.empty


# --------------------------------------------------------------------------------------
# Typed requests


class _RequestBackend(plugins.Backend):
    def lower(self, request: plugins.LoweringRequest):
        self.seen = request
        return plugins.lower_with_interpreter(request.ctx, *request.in_nodes,
                                              jaxpr=request.jaxpr,
                                              grid_mapping=request.grid_mapping)


def _add_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def test_lower_receives_one_typed_request(clean_registry):
    b = _RequestBackend(name="req", version="1", platforms=("cpu",))
    plugins.register_backend(b)
    x = jnp.arange(8, dtype=jnp.float32)
    f = pl.pallas_call(_add_one, SDS((8,), jnp.float32), name="add_one", backend=b.name)
    np.testing.assert_array_equal(jax.jit(f)(x), x + 1)
    assert b.seen.name == "add_one"
    assert b.seen.out_avals[0].shape == (8,) and len(b.seen.in_nodes) == 1
    assert b.seen.kernel.grid_mapping is b.seen.grid_mapping


def test_a_backend_written_the_old_way_is_refused_when_defined():
    with pytest.raises(TypeError, match=r"_Old\.emulate has the keyword signature of the "
                       r"old backend contract.*emulate\(request"):
        class _Old(plugins.Backend):
            def emulate(self, jaxpr, grid_mapping, compiler_params, *args, **kw):
                return []


def test_what_a_backend_may_offer_is_declared_with_defaults():
    # The conformance suite, the autotuner and the errors ask the contract, never
    # hasattr/getattr: a backend offering nothing answers with the defaults.
    b = _RequestBackend(name="plain", version="1", platforms=("cpu",))
    assert b.race_kit() is None
    assert b.tuning_figures(None, None) is None
    assert b.title == "plain"
    assert _RequestBackend(name="p", version="1", platforms=("cpu",),
                           display_name="Plain").title == "Plain"
    from pallas._src.tuning.figures import provider_for

    assert provider_for(b)(None, None) is None  # no compile level: no figures


def test_a_request_carries_debug():
    # pallas_call(debug=True): the backend prints what it generates (mosaic_tpu, its
    # Mosaic module, as upstream).
    f = pl.pallas_call(_add_one, SDS((8,), jnp.float32), name="k", debug=True)
    jaxpr = jax.make_jaxpr(f)(jnp.arange(8, dtype=jnp.float32))
    (eqn,) = [e for e in jaxpr.eqns if e.primitive is plugins.pallas_call_p]
    assert plugins.KernelRequest.from_params(eqn.params).debug is True


# --------------------------------------------------------------------------------------
# Rule tables


def _table():
    return plugins.RuleTable("test_rules", "rule(x) -> y")


def test_rules_are_keyed_by_primitive_objects():
    t = _table()
    with pytest.raises(TypeError, match="keyed by primitive objects"):
        t.register("add")
    t.register(lax.add_p, owner="a")(lambda x: x + 1)
    assert t[lax.add_p](1) == 2 and lax.add_p in t and lax.sub_p not in t
    assert t.owners(lax.add_p) == ["a"]


def test_a_second_base_rule_from_another_package_is_a_conflict():
    t = _table()
    t.register(lax.add_p, owner="a")(lambda x: x)
    t.register(lax.add_p, owner="a")(lambda x: 2 * x)  # the owner replaces its own rule
    assert t[lax.add_p](3) == 6
    with pytest.raises(plugins.RuleConflictError, match="'add'.*from a.*override"):
        t.register(lax.add_p, owner="b")(lambda x: x)


@pytest.mark.parametrize("first", ["b", "c"])
def test_overrides_apply_in_a_fixed_order_whatever_the_registration_order(first):
    t = _table()
    t.register(lax.add_p, owner="core")(lambda x: [x])
    wraps = {"b": lambda rule: lambda x: [*rule(x), "b"],
             "c": lambda rule: lambda x: [*rule(x), "c"]}
    for owner in (first, "c" if first == "b" else "b"):
        t.override(lax.add_p, owner=owner)(wraps[owner])
    assert t[lax.add_p](0) == [0, "b", "c"]  # same order, by owner name
    t.override(lax.add_p, owner="a", order=5)(lambda rule: lambda x: [*rule(x), "a"])
    assert t[lax.add_p](0) == [0, "b", "c", "a"]  # a higher order applies later
    assert t.owners(lax.add_p) == ["core", "b", "c", "a"]


def test_an_override_can_be_planted_for_a_test_and_removed():
    t = _table()
    t.register(lax.add_p, owner="core")(lambda x: x)
    with t.overridden(lax.add_p, lambda rule: lambda x: rule(x) + 100):
        assert t[lax.add_p](1) == 101
    assert t[lax.add_p](1) == 1


def test_unsupported_primitives_are_declared_with_a_reason():
    t = _table()
    t.register(lax.add_p, owner="core")(lambda x: x)
    t.unsupported(lax.sort_p, reason="sort outside the kernel")
    assert t.unsupported_reason(lax.sort_p) == "sort outside the kernel"
    assert t.missing([lax.add_p, lax.sort_p, lax.sub_p]) == [lax.sub_p]
    with pytest.raises(plugins.RuleConflictError):
        t.unsupported(lax.add_p, reason="no")


def test_require_gives_the_rule_or_raises_the_walkers_error_with_the_reason():
    t = _table()
    t.register(lax.add_p, owner="core")(lambda x: x + 1)
    t.unsupported(lax.sort_p, reason="sort outside the kernel")
    assert t.require(lax.add_p, LookupError)(1) == 2
    with pytest.raises(LookupError, match="sort outside the kernel"):
        t.require(lax.sort_p, LookupError)
    with pytest.raises(LookupError) as info:
        t.require(lax.sub_p, LookupError)
    assert info.value.args == (None,)  # no rule and no reason declared


def test_walk_jaxpr_binds_consts_args_literals_and_each_equations_results():
    closed = jax.make_jaxpr(lambda x, y: (x * 2.0 + y, y))(1.0, 2.0)
    seen = []

    def eval_eqn(eqn, invals):
        seen.append((eqn.primitive.name, invals))
        return [eqn.primitive.bind(*invals, **eqn.params)]

    out = plugins.walk_jaxpr(closed.jaxpr, closed.consts, [3.0, 4.0], eval_eqn)
    assert [float(o) for o in out] == [10.0, 4.0]
    assert seen[0] == ("mul", [3.0, 2.0])  # the literal 2.0 through the default literal
    tagged = plugins.walk_jaxpr(closed.jaxpr, closed.consts, [3.0, 4.0], eval_eqn,
                                literal=lambda lit: lit.val + 1)
    assert float(tagged[0]) == 13.0


def test_the_interpreter_has_a_rule_for_every_core_primitive():
    assert plugins.interpret_rules.missing(plugins.PRIMITIVES) == []


def test_a_table_built_on_another_answers_from_its_own_rules_first():
    base = _table()
    base.register(lax.add_p, lax.sub_p, owner="tpu")(lambda x: "tpu")
    base.unsupported(lax.sort_p, reason="not on TPU")
    child = plugins.RuleTable("child", "rule(x) -> y", parent=base)
    child.register(lax.sub_p, owner="sc")(lambda x: "sc")
    child.unsupported(lax.add_p, reason="not on SparseCore")
    assert child[lax.sub_p](0) == "sc" and base[lax.sub_p](0) == "tpu"
    assert child.get(lax.add_p) is None and lax.add_p not in child
    assert child.unsupported_reason(lax.add_p) == "not on SparseCore"
    assert child.unsupported_reason(lax.sort_p) == "not on TPU"
    assert set(child) == {lax.sub_p} and child.owners(lax.sub_p) == ["sc"]
    base.register(lax.mul_p, owner="tpu")(lambda x: "tpu")  # later additions show through
    assert child[lax.mul_p](0) == "tpu" and child.missing([lax.mul_p, lax.max_p]) == [lax.max_p]


def test_targeting_helpers_are_shared_by_the_backends(monkeypatch):
    # Backends whose lowerings read their target from the environment (Mosaic GPU,
    # Triton) build targeting() from Backend.check_platform and Backend.environ.
    b = _RequestBackend(name="envy", version="1", platforms=("cuda",))
    with pytest.raises(ValueError, match=r"backend 'envy' lowers for cuda, not for 'tpu'"):
        b.check_platform("tpu")
    monkeypatch.delenv("PALLAS_TEST_TARGET", raising=False)
    import os

    with b.environ("PALLAS_TEST_TARGET", "sm_90a"):
        assert os.environ["PALLAS_TEST_TARGET"] == "sm_90a"
    assert "PALLAS_TEST_TARGET" not in os.environ
    monkeypatch.setenv("PALLAS_TEST_TARGET", "old")
    with b.environ("PALLAS_TEST_TARGET", "new"):
        assert os.environ["PALLAS_TEST_TARGET"] == "new"
    assert os.environ["PALLAS_TEST_TARGET"] == "old"


def test_pallas_state_holds_the_ref_machinery_kernels_are_traced_with():
    import pallas.state as st

    ref = jax.ShapeDtypeStruct((8, 4), jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[1:3] = x_ref[2:4] * 2

    jaxpr = jax.make_jaxpr(
        lambda x: pl.pallas_call(kernel, out_shape=ref, interpret=True)(x))(
            jnp.zeros((8, 4), jnp.float32))
    (call,) = plugins.pallas_call_eqns(jaxpr)
    body = call.params["jaxpr"]
    assert all(isinstance(v.aval, st.AbstractRef) for v in body.invars)
    prims = {e.primitive for e in body.eqns}
    assert st.get_p in prims and st.swap_p in prims
    get = next(e for e in body.eqns if e.primitive is st.get_p)
    view = st.transform_type(
        jax.tree_util.tree_unflatten(get.params["tree"], get.invars[1:]), body.invars[0].aval)
    assert view.shape == (2, 4)
    assert sorted(st.__all__) == sorted(n for n in dir(st) if not n.startswith("_"))
