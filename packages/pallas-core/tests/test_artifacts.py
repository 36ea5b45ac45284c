"""The staged backend contract: a backend builds a kernel artifact once from a typed
request; the core keeps it with the ``pallas_call`` equation (weakly, by the jaxpr
object) and hands the same artifact to the later stages. Compiler params are coerced
once, by ``resolve_compiler_params``. Caches are keyed by the objects themselves, never
by an ``id()`` a later object may reuse."""

from __future__ import annotations

import dataclasses
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins as plugins
from pallas._src.registry import artifacts

SDS = jax.ShapeDtypeStruct


@dataclasses.dataclass(frozen=True)
class StagedParams(pl.CompilerParams):
    BACKEND = "staged"

    unroll: int = 1


@dataclasses.dataclass(frozen=True)
class MoreParams(StagedParams):
    extra: int = 0


class _Staged(plugins.Backend):
    """Counts its builds; records the artifact each lowering receives."""

    def build(self, request):
        self.built.append(request.name)
        return plugins.KernelArtifact(backend=self.name,
                                      compiler_params=self.compiler_params_of(request),
                                      payload=f"listing of {request.name}")

    def lower(self, request):
        self.lowered.append(request.artifact)
        assert self.artifact(request) is request.artifact
        return plugins.lower_with_interpreter(request.ctx, *request.in_nodes,
                                              jaxpr=request.jaxpr,
                                              grid_mapping=request.grid_mapping)


@pytest.fixture
def staged(clean_registry):
    b = _Staged(name="staged", version="1", platforms=("cpu",),
                compiler_params_type=StagedParams)
    b.built, b.lowered = [], []
    plugins.register_backend(b)
    return b


def _add_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


def test_the_artifact_is_built_once_and_handed_to_the_lowering(staged):
    x = jnp.arange(8, dtype=jnp.float32)
    f = pl.pallas_call(_add_one, SDS((8,), jnp.float32), name="add_one",
                       compiler_params=StagedParams(unroll=2))
    np.testing.assert_array_equal(jax.jit(f)(x), x + 1)
    assert staged.built == ["add_one"]  # at trace time; the lowering reused it
    (artifact,) = staged.lowered
    assert artifact.payload == "listing of add_one"
    assert artifact.compiler_params == StagedParams(unroll=2)
    jax.jit(lambda x: f(x) * 2)(x)  # the same kernel in another function: same artifact
    assert staged.built == ["add_one"] and staged.lowered[-1] is artifact


def test_an_artifact_lives_as_long_as_its_kernel_jaxpr(staged):
    before = len(artifacts._artifacts)

    def once():
        f = pl.pallas_call(_add_one, SDS((8,), jnp.float32), name="short_lived",
                           backend="staged")
        jax.make_jaxpr(f)(jnp.zeros(8, jnp.float32))

    once()
    jax.clear_caches()
    gc.collect()
    assert len(artifacts._artifacts) == before


def test_a_stage_without_a_handed_artifact_builds_it_once(staged):
    f = pl.pallas_call(_add_one, SDS((8,), jnp.float32), name="k")
    closed = jax.make_jaxpr(f)(jnp.zeros(8, jnp.float32))
    (eqn,) = [e for e in closed.eqns if e.primitive is plugins.pallas_call_p]
    request = plugins.KernelRequest.for_backend(staged, eqn.params, target="x")
    assert request.compiler_params == StagedParams()  # None, coerced once
    first = staged.artifact(request)
    assert staged.artifact(request) is first and staged.built == ["k"]
    assert staged.artifact(dataclasses.replace(request, artifact=first)) is first


def test_compiler_params_are_coerced_in_one_place(staged):
    resolve = plugins.resolve_compiler_params
    p = StagedParams(unroll=3)
    assert resolve(staged, p) is p
    assert resolve(staged, None) == StagedParams()
    assert resolve(staged, {"staged": {"unroll": 4}}) == StagedParams(unroll=4)
    assert resolve(staged, {"mosaic_tpu": {}}) == StagedParams()  # no entry: defaults
    more = _Staged(name="more", version="1", platforms=("cpu",),
                   compiler_params_type=MoreParams)
    assert resolve(more, StagedParams(unroll=5)) == MoreParams(unroll=5)  # a base class
    with pytest.raises(TypeError, match=r"the staged backend \('staged'\) takes "
                       r".*StagedParams compiler params; got .*int"):
        resolve(staged, 7)


def test_error_tables_are_not_found_by_a_dead_kernels_id():
    # The interpreter's table of check messages is kept per kernel jaxpr. Keyed by
    # id(jaxpr) alone, a new kernel allocated where a dead one was would decode its
    # errors with the dead kernel's messages.
    from pallas._src.interpreter import grid_runner

    f = pl.pallas_call(_add_one, SDS((8,), jnp.float32), name="k")
    closed = jax.make_jaxpr(f)(jnp.zeros(8, jnp.float32))
    (eqn,) = [e for e in closed.eqns if e.primitive is plugins.pallas_call_p]
    gm = eqn.params["grid_mapping"]

    class Kernel:  # stands for a kernel jaxpr: the table only needs its identity
        pass

    fresh = Kernel

    dead = fresh()
    grid_runner.error_table_for(dead, gm).code_for("the dead kernel's message")
    dead_id = id(dead)
    del dead
    gc.collect()
    alive = []
    for _ in range(10000):  # CPython soon hands the dead object's memory out again
        new = fresh()
        if id(new) == dead_id:
            break
        alive.append(new)
    else:
        pytest.skip("no new jaxpr reused the dead one's id")
    assert grid_runner.error_table_for(new, gm).messages == []
