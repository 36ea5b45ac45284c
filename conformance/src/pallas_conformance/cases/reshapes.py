"""Value reshapes that change the tiled (last two) dims inside kernels: the lane dim split
and merged, trailing dims folded into the last dim and unfolded from it, leading dims
merged into the second-minor dim, small last dims swapped, folds to rank 1, and
``jnp.stack``/``jnp.unstack`` along a tiled dim.

Each is a family Mosaic TPU relayouts on every chip (checked with libtpu for v5e and v6e);
upstream's ``tpu_pallas_test`` and ragged paged attention use them.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_conformance.registry import case, dtype_tags, randn, sds, short

C = 128


def _reshape_case(src, dst, dtype, what, plus_one=False):
    name = f"reshapes/{what}_{short(dtype)}"

    def reference(x):
        y = x.reshape(dst)
        return y + 1 if plus_one else y

    @case(name, tags={"reshapes"} | dtype_tags(dtype),
          inputs=lambda rng: (randn(rng, src, dtype),), reference=reference,
          description=f"x.reshape{tuple(dst)} of a {tuple(src)} {jnp.dtype(dtype).name} "
                      f"block ({what.replace('_', ' ')})")
    def fn(pallas_call, x):
        def kernel(x_ref, o_ref):
            y = x_ref[...].reshape(o_ref.shape)
            o_ref[...] = y + 1 if plus_one else y

        return pallas_call(kernel, out_shape=sds(dst, x.dtype))(x)

    return fn


# The lane dim split in two (issue 27's first step), then merged back across sublanes.
_reshape_case((8, 128), (8, 2, 64), jnp.float32, "split_lane_dim", plus_one=True)
_reshape_case((2, 8, 64), (16, 64), jnp.float32, "merge_leading_into_sublanes",
              plus_one=True)
# Ragged paged attention's fold of the heads into the rows.
_reshape_case((64, 4, 128), (256, 128), jnp.bfloat16, "fold_rows_into_second_minor")
_reshape_case((2, 600), (2, 3, 200), jnp.int8, "unfold_unaligned_minor")
_reshape_case((1, 8, 3, 256), (1, 6144), jnp.uint32, "fold_three_minor_dims")
_reshape_case((16, 64), (64, 16), jnp.float32, "swap_small_last_dims", plus_one=True)
_reshape_case((9, 256), (2304,), jnp.float32, "fold_to_rank1")


@case("reshapes/split_swap_merge_f32", tags={"reshapes"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.swapaxes(x.reshape(8, 2, 64), 0, 1).reshape(16, 64))
def split_swap_merge(pallas_call, x):
    """Issue 27's kernel: the lane dim split, the two major dims swapped, then merged."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.swapaxes(x_ref[...].reshape(8, 2, 64), 0, 1).reshape(16, 64)

    return pallas_call(kernel, out_shape=sds((16, 64), x.dtype))(x)


@case("reshapes/stack_along_second_minor_f32", tags={"reshapes"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: jnp.stack([x, y * 2], axis=1))
def stack_second_minor(pallas_call, x, y):
    """``jnp.stack`` of two (8, 128) blocks along a new second-minor dim: (8, 2, 128)
    (upstream's ``test_float32_stack``)."""
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.stack([x_ref[...], y_ref[...] * 2], axis=1)

    return pallas_call(kernel, out_shape=sds((8, 2, C), x.dtype))(x, y)


@case("reshapes/unstack_second_minor_f32", tags={"reshapes"},
      inputs=lambda rng: (randn(rng, (8, 2, C)),),
      reference=lambda x: x[:, 0] - 2 * x[:, 1])
def unstack_second_minor(pallas_call, x):
    """``jnp.unstack`` of an (8, 2, 128) block along its second-minor dim into two
    (8, 128) values (upstream's ``test_float32_unstack``)."""
    def kernel(x_ref, o_ref):
        a, b = jnp.unstack(x_ref[...], axis=1)
        o_ref[...] = a - 2 * b

    return pallas_call(kernel, out_shape=sds((8, C), x.dtype))(x)


def _stack_pair_case(axis: int):
    @case(f"reshapes/stack_pair_axis{axis}_f32", tags={"stack_pairs"},
          inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
          reference=lambda x, y: (jnp.stack([x, y * 2], axis=axis), x - 2 * y))
    def fn(pallas_call, x, y):
        """``jnp.stack`` of two blocks at a new axis, and ``jnp.unstack`` of it back
        (Triton's ``tl.join``/``tl.split``, moved to the axis)."""
        def kernel(x_ref, y_ref, o_ref, d_ref):
            s = jnp.stack([x_ref[...], y_ref[...] * 2], axis=axis)
            o_ref[...] = s
            a, b = jnp.unstack(s, axis=axis)
            d_ref[...] = a - b

        shape = list(x.shape)
        shape.insert(axis, 2)
        return pallas_call(kernel, out_shape=(sds(shape, x.dtype), sds(x.shape, x.dtype)))(x, y)

    fn.__name__ = f"stack_pair_axis{axis}"
    return fn


for _axis in range(3):
    _stack_pair_case(_axis)
