"""jax.export of functions that call pallas_call: round trips (serialised too), several
outputs, pytree arguments, export of vmap and of grad, scratch and grids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_conformance.cases import _programs as shared
from pallas_conformance.registry import case, randn, sds

C = shared.C


def _export(pallas_call, f):
    """``jax.export.export(f)`` for the platform the case's backend lowers for (the
    default platform when ``pallas_call`` names no backend): a backend for another
    platform (``cuda`` on a CPU machine) exports, and the caller embeds, its own kernel."""
    import pallas.plugins

    name = getattr(pallas_call, "keywords", {}).get("backend")
    platforms = pallas.plugins.get_backend(name).platforms[:1] if name else None
    return jax.export.export(f, platforms=platforms)


@case("export/export_and_call", tags={"export"},
      inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: jnp.sin(x) * x)
def export_round_trip(pallas_call, x):
    """jax.export.export, then call the Exported (serialisation needs flatbuffers)."""
    exp = _export(pallas_call, jax.jit(lambda a: shared.tiled_sin(pallas_call, a)))(x)
    assert "func.func public @main" in exp.mlir_module()
    return exp.call(x)


@case("export/two_outputs", tags={"export", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: (x * 2.0 + y, x * 2.0 + y))
def export_two(pallas_call, x, y):
    """An exported function with two pallas_call results."""
    def f(a, b):
        r = shared.scale_add(pallas_call, a, b)
        return r, r

    exp = _export(pallas_call, jax.jit(f))(x, y)
    return exp.call(x, y)


@case("export/serialize_round_trip", tags={"export"},
      inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: jnp.sin(x) * x)
def export_serialize(pallas_call, x):
    """jax.export, serialize to bytes, deserialize and call the deserialized Exported."""
    exp = _export(pallas_call, jax.jit(lambda a: shared.tiled_sin(pallas_call, a)))(x)
    blob = exp.serialize()
    assert isinstance(blob, (bytes, bytearray)) and len(blob) > 0
    return jax.export.deserialize(blob).call(x)


@case("export/pytree_args", tags={"export", "pytrees", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: {"sum": x + y, "prod": (x * y, x - y)})
def export_pytree(pallas_call, x, y):
    """Export of a function with a dict argument and a nested dict/tuple result, after a
    serialize/deserialize round trip."""
    def f(d):
        def kernel(a_ref, b_ref, s_ref, p_ref, m_ref):
            a, b = a_ref[...], b_ref[...]
            s_ref[...] = a + b
            p_ref[...] = a * b
            m_ref[...] = a - b

        s = sds(d["a"].shape, d["a"].dtype)
        total, prod, diff = pallas_call(kernel, out_shape=(s, s, s))(d["a"], d["b"])
        return {"sum": total, "prod": (prod, diff)}

    args = {"a": x, "b": y}
    exp = jax.export.deserialize(_export(pallas_call, jax.jit(f))(args).serialize())
    return exp.call(args)


@case("export/of_vmap", tags={"export", "vmap"},
      inputs=lambda rng: (randn(rng, (3, 16, C)),), reference=lambda x: jnp.sin(x) * x)
def export_vmap(pallas_call, x):
    """Export of a vmapped grid kernel, serialized and deserialized."""
    f = jax.jit(jax.vmap(lambda a: shared.tiled_sin(pallas_call, a)))
    return jax.export.deserialize(_export(pallas_call, f)(x).serialize()).call(x)


@case("export/of_grad", tags={"export", "grad"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jax.grad(lambda a: jnp.sum(jnp.sin(a) * a))(x))
def export_grad(pallas_call, x):
    """Export of the gradient of a tiled elementwise kernel."""
    f = jax.jit(jax.grad(lambda a: jnp.sum(shared.tiled_sin(pallas_call, a))))
    return _export(pallas_call, f)(x).call(x)


@case("export/scratch_and_grid",
      tags={"export", "scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (32, C)),), reference=shared.ref_running_sum,
      tolerance={"float32": (1e-5, 1e-5)})
def export_scratch(pallas_call, x):
    """Export of a grid kernel with persistent scratch, serialized and deserialized."""
    f = jax.jit(lambda a: shared.running_sum(pallas_call, a))
    return jax.export.deserialize(_export(pallas_call, f)(x).serialize()).call(x)
