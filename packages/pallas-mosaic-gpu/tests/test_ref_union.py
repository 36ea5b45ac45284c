"""A ``plgpu.RefUnion`` scratch reaches the kernel as a union of its members' refs: it
unpacks (``a, [b, [c]] = union``) and indexes (``union[1][1][0]``) into them, keeping
the nesting it was declared with; the union itself is not a ref and cannot be assigned
to."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu

F32 = jnp.float32


def _union_kernel(interpret):
    union = plgpu.RefUnion(plgpu.SMEM((2, 128), F32),
                           [plgpu.SMEM((128,), jnp.bfloat16), [plgpu.SMEM((128,), F32)]])

    def body(x_ref, o_ref, aliased):
        first, [_, [last]] = aliased
        assert aliased[1][1][0] is last and aliased[0] is first and len(aliased) == 2
        first[...] = x_ref[...] + 1.0
        last[...] = first[1] * 2.0
        o_ref[...] = last[...]

    kw = dict(interpret=interpret) if interpret else dict(backend="mosaic_gpu")
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((128,), F32),
                          scratch_shapes=[union], **kw)


X = jnp.arange(256, dtype=F32).reshape(2, 128)


def test_a_ref_union_unpacks_into_its_members_in_gpu_interpret_mode():
    got = _union_kernel(plgpu.InterpretParams())(X)
    np.testing.assert_array_equal(got, (X[1] + 1) * 2)


def test_a_ref_union_unpacks_into_its_members_in_the_lowering(emulate):
    pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering needs jax-cuda13-plugin")
    (got,) = emulate(_union_kernel(None), X)
    np.testing.assert_array_equal(np.asarray(got), (X[1] + 1) * 2)


def test_assigning_to_a_ref_union_is_an_error():
    def body(x_ref, o_ref, aliased):
        aliased[...] = x_ref[...]

    f = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((128,), F32),
                       scratch_shapes=[plgpu.RefUnion(plgpu.SMEM((128,), F32))],
                       interpret=plgpu.InterpretParams())
    with pytest.raises(ValueError, match="can't be assigned to"):
        f(X[0])


def test_a_ref_union_is_indexed_by_member_position_only():
    u = plgpu.RefUnion("a", ["b", "c"])
    assert list(u) == ["a", ["b", "c"]] and u[1] == ["b", "c"]
    with pytest.raises(ValueError, match="member's position"):
        u[...]
