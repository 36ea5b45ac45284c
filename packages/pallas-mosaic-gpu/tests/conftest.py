"""Shared fixtures of pallas-mosaic-gpu's tests."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture
def emulate():
    """``emulate(f, *args)``: runs the one ``pallas_call`` of ``f`` through the
    ``mosaic_gpu`` backend's emulate level (its generated code executed) and returns the
    outputs."""
    import pallas as pl
    import pallas.plugins

    def run(f, *args):
        backend = pallas.plugins.get_backend("mosaic_gpu")
        (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns
                  if e.primitive is pl.pallas_call_p]
        req = pallas.plugins.KernelRequest.from_params(eqn.params,
                                                       eqn.params["compiler_params"])
        return backend.emulate(req, *args)

    return run
