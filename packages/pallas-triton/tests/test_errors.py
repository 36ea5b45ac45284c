"""What the Triton backend cannot lower fails at lowering time, and says so.

Each error is a ``TritonLoweringError`` (a ``NotImplementedError``) naming what is not
supported (the primitive or construct), the backend, and, where there is one, what to
do instead.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_triton as pltriton
from pallas import atomics
from pallas.plugins import SemaphoreSpace

SDS = jax.ShapeDtypeStruct
X = jnp.zeros((16, 128), jnp.float32)
SCRATCH = {"scratch_shapes": [pl.ANY((16, 128), jnp.float32)]}


def _gather(x_ref, o_ref):
    # A 2-D index array next to a slice (1-D index vectors, and index tensors of one
    # shape on every dimension, are supported: see test_backend).
    picked = x_ref[(jnp.arange(16) % 3).reshape(4, 4), :]
    o_ref[...] = picked.reshape(16, 128)


def _pad(x_ref, o_ref):
    o_ref[...] = jnp.pad(x_ref[:8, :], ((0, 8), (0, 0)))


def _sort(x_ref, o_ref):
    o_ref[...] = jnp.sort(x_ref[...], axis=1)


def _cumprod(x_ref, o_ref):
    o_ref[...] = jnp.cumprod(x_ref[...], axis=1)


def _atomic_on_scratch(x_ref, o_ref, s_ref):
    s_ref[...] = x_ref[...]
    atomics.atomic_add(s_ref, (slice(None), slice(None)), x_ref[...])
    o_ref[...] = s_ref[...]


def _scratch_slice(x_ref, o_ref, s_ref):
    s_ref[...] = x_ref[...]
    o_ref[pl.ds(0, 8), :] = s_ref[pl.ds(8, 8), :]
    o_ref[pl.ds(8, 8), :] = s_ref[pl.ds(0, 8), :]


def _semaphore(x_ref, o_ref, sem):
    pl.semaphore_signal(sem, 1)
    o_ref[...] = x_ref[...]


CASES = {
    "gather": (_gather, {}, r"array of indices \(gather/scatter\)", r"pl\.ds"),
    "pad": (_pad, {}, r"primitive 'pad'", r"larger BlockSpec"),
    "sort": (_sort, {}, r"primitive 'sort'", r"outside the kernel"),
    "cumprod": (_cumprod, {}, r"primitive 'cumprod'", r"fori_loop"),
    "atomic on scratch": (_atomic_on_scratch, SCRATCH, r"atomic_add on the scratch buffer",
                          r"output refs"),
    "scratch slice": (_scratch_slice, SCRATCH, r"partial slice of the scratch buffer",
                      r"whole \(ref\[\.\.\.\]\)"),
    "semaphore": (_semaphore, {"scratch_shapes": [SemaphoreSpace.REGULAR(())]}, r"semaphore",
                  r"Mosaic backends"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unsupported_constructs_name_themselves_the_backend_and_an_alternative(name):
    kernel, kw, what, alternative = CASES[name]
    f = pl.pallas_call(kernel, out_shape=SDS(X.shape, X.dtype), **kw)
    with pytest.raises(pltriton.TritonLoweringError) as info:
        pltriton.inspect(f, X)
    msg = str(info.value)
    assert isinstance(info.value, NotImplementedError)
    assert "Pallas Triton backend (pallas-triton)" in msg
    assert re.search(what, msg), msg
    assert re.search(alternative, msg), msg


def test_the_error_is_raised_when_lowering_for_cuda_not_later():
    f = pl.pallas_call(_sort, out_shape=SDS(X.shape, X.dtype), backend="triton")
    with pytest.raises(NotImplementedError, match=r"'sort'.*pallas-triton"):
        jax.jit(f).trace(X).lower(lowering_platforms=("cuda",))


def test_a_dynamic_grid_is_refused_naming_the_backend_as_upstream():
    """Upstream's Triton backend has no dynamic grid bounds; neither does this one (the
    launch grid of XLA's Triton custom call is static)."""
    def f(n, x):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                              out_shape=SDS(X.shape, X.dtype), grid=(n,), in_specs=[spec],
                              out_specs=spec, backend="triton")(x)

    with pytest.raises(NotImplementedError, match=r"dynamic grid bounds not supported in "
                                                  r"the Triton backend: .*grid \(dynamic,\)"):
        jax.jit(f).trace(jnp.int32(2), X).lower(lowering_platforms=("cuda",))


def _float8_e4m3fn_round_trip(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(jnp.float8_e4m3fn).astype(jnp.float32)


def test_float8_e4m3fn_is_refused_before_sm89_naming_the_dtype_and_target(monkeypatch):
    """Triton has float8_e4m3fn (fp8e4nv) from sm_89 on: for sm_80 the lowering refuses it
    as a target limit (a conformance case is then unsupported there, not failed)."""
    from pallas_triton._src.targets import TargetLacksError

    f = pl.pallas_call(_float8_e4m3fn_round_trip, out_shape=SDS((16, 128), jnp.float32),
                       backend="triton")
    monkeypatch.setenv("PALLAS_TRITON_COMPUTE_CAPABILITY", "80")
    with pytest.raises(TargetLacksError, match="float8_e4m3fn.*sm_89.*sm_80"):
        jax.jit(f).trace(X).lower(lowering_platforms=("cuda",))
    monkeypatch.setenv("PALLAS_TRITON_COMPUTE_CAPABILITY", "90")
    jax.jit(f).trace(X).lower(lowering_platforms=("cuda",))


def test_a_compute_capability_given_as_a_string_is_an_nvidia_target():
    """``--target 90`` reaches the compile level as the string "90" (not an AMD name)."""
    from pallas_triton._src.compile import compile_lowered
    from pallas_triton._src.lowering import lower_kernel

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    f = pl.pallas_call(kernel, out_shape=SDS((16, 128), jnp.float32), backend="triton")
    jaxpr = jax.make_jaxpr(f)(X)
    call = next(e for e in jaxpr.eqns if e.primitive.name == "pallas_call")
    lowered = lower_kernel(call.params["jaxpr"], call.params["grid_mapping"], None)
    for target in ("90", "sm_90a", 90):
        assert compile_lowered(lowered, target).arch == "sm_90"
