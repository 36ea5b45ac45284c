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

from pallas.plugins import (
    KernelRequest,
    LoweringRequest,
    hookimpl,
    interpret_pallas_call,
    primitive_names,
)
from toy_pallas_backend.plugin import TOY, ToyBackend


def _bump_int32(outs):
    return [o + 1 if o.dtype == jnp.int32 else o for o in outs]


class OffByOne(ToyBackend):
    def lower(self, request: LoweringRequest):
        def run(*args):
            return _bump_int32(interpret_pallas_call(*args, jaxpr=request.jaxpr,
                                                     grid_mapping=request.grid_mapping))

        return mlir.lower_fun(run, multiple_results=True)(request.ctx, *request.in_nodes)

    def emulate(self, request: KernelRequest, *args):
        return _bump_int32(super().emulate(request, *args))


class WrongDtype(ToyBackend):
    def emulate(self, request: KernelRequest, *args):
        outs = super().emulate(request, *args)
        return [o.astype(jnp.float32) if o.dtype == jnp.bfloat16 else o for o in outs]


class CantLower(ToyBackend):
    def _check(self, jaxpr):
        if "dot_general" in primitive_names(jaxpr):
            raise NotImplementedError("toy_cant_lower: dot_general is not implemented")

    def lower(self, request: LoweringRequest):
        self._check(request.jaxpr)
        return super().lower(request)

    def compile(self, request: KernelRequest):
        self._check(request.jaxpr)
        return super().compile(request)


def _variant(cls, name):
    return cls(**{f.name: getattr(TOY, f.name) for f in dataclasses.fields(TOY)} | {
        "name": name, "compiler_params_type": None, "priority": -20})


OFF_BY_ONE = _variant(OffByOne, "toy_off_by_one")
WRONG_DTYPE = _variant(WrongDtype, "toy_wrong_dtype")
CANT_LOWER = _variant(CantLower, "toy_cant_lower")


@hookimpl
def pallas_backends():
    return [OFF_BY_ONE, WRONG_DTYPE, CANT_LOWER]


