"""Deliberately wrong variants of the toy backend: each plants one fault that the
conformance suite must report, for exactly the cases the fault affects.

- ``toy_off_by_one``: every int32 output is one too large (lower and emulate);
- ``toy_wrong_dtype``: bfloat16 outputs are emulated as float32 (emulate);
- ``toy_cant_lower``: claims ``dot`` but raises in ``lower`` and ``compile`` on kernels
  with a ``dot_general``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.interpreters import mlir

from pallas.plugins import hookimpl, interpret_pallas_call
from toy_pallas_backend.plugin import TOY, ToyBackend, primitives_of


def _bump_int32(outs):
    return [o + 1 if o.dtype == jnp.int32 else o for o in outs]


class OffByOne(ToyBackend):
    def lower(self, ctx, *in_nodes, jaxpr, grid_mapping, **kw):
        def run(*args):
            return _bump_int32(interpret_pallas_call(*args, jaxpr=jaxpr,
                                                     grid_mapping=grid_mapping))

        return mlir.lower_fun(run, multiple_results=True)(ctx, *in_nodes)

    def emulate(self, jaxpr, grid_mapping, compiler_params, *args, **kw):
        return _bump_int32(super().emulate(jaxpr, grid_mapping, compiler_params, *args, **kw))


class WrongDtype(ToyBackend):
    def emulate(self, jaxpr, grid_mapping, compiler_params, *args, **kw):
        outs = super().emulate(jaxpr, grid_mapping, compiler_params, *args, **kw)
        return [o.astype(jnp.float32) if o.dtype == jnp.bfloat16 else o for o in outs]


class CantLower(ToyBackend):
    def _check(self, jaxpr):
        if "dot_general" in primitives_of(jaxpr):
            raise NotImplementedError("toy_cant_lower: dot_general is not implemented")

    def lower(self, ctx, *in_nodes, jaxpr, grid_mapping, **kw):
        self._check(jaxpr)
        return super().lower(ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping, **kw)

    def compile(self, jaxpr, grid_mapping, compiler_params, **kw):
        self._check(jaxpr)
        return super().compile(jaxpr, grid_mapping, compiler_params, **kw)


def _variant(cls, name):
    return cls(**{f.name: getattr(TOY, f.name) for f in dataclasses.fields(TOY)} | {
        "name": name, "compiler_params_type": None, "priority": -20})


OFF_BY_ONE = _variant(OffByOne, "toy_off_by_one")
WRONG_DTYPE = _variant(WrongDtype, "toy_wrong_dtype")
CANT_LOWER = _variant(CantLower, "toy_cant_lower")


@hookimpl
def pallas_backends():
    return [OFF_BY_ONE, WRONG_DTYPE, CANT_LOWER]


