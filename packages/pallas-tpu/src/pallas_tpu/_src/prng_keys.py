"""Pallas TPU PRNG keys: the ``"pallas_tpu"`` key implementation and ``to_pallas_key``
(upstream's ``pltpu`` random API; ``wrap_pallas_seed``/``unwrap_pallas_seed`` live beside
``prng_seed`` in ``primitives/misc.py``).

A ``pallas_tpu`` key is a typed JAX key whose data is two uint32 words, shape ``(1, 2)``
(a row of scalars, as the TPU core keeps them in SMEM). Inside a kernel,
``jax.random.bits``/``uniform``/... on such a key seed the core's hardware PRNG with the
key's words (``pltpu.prng_seed``) and draw from it (``pltpu.prng_random_bits``), so they
only work inside a kernel; outside one, JAX finds no lowering of the PRNG primitives and
says so. ``fold_in`` mixes the data into the second word with one threefry round;
``split`` is refused (fold in instead), as upstream.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from jax import lax

from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.primitives.misc import prng_random_bits, prng_seed

KEY_SHAPE = (1, 2)

# -- the "pallas_tpu" key implementation ---------------------------------------------------

def seed_words(seed) -> list:
    """The words of the key ``jax.random.key(seed, impl="pallas_tpu")``: the seed twice."""
    w = lax.convert_element_type(jnp.asarray(seed).astype(jnp.int32), jnp.uint32)
    return [w, w]


def random_bits_words(words, bit_width, shape):
    """32-bit draws of ``shape`` from the core's PRNG seeded with a key's words."""
    if bit_width != 32:
        raise ValueError(f"Bit width must be 32 (Pallas TPU keys draw 32-bit words from the "
                         f"core's PRNG), got {bit_width}")
    prng_seed(*words)
    return jax.lax.bitcast_convert_type(prng_random_bits(shape), jnp.uint32)


def fold_in_words(words, data) -> list:
    """The words of ``fold_in(key, data)``: ``data`` mixed into the second word with one
    threefry round (elementwise over batched keys)."""
    k0, k1 = words
    return jc.threefry_apply_round([k0, k1 + jnp.asarray(data, jnp.uint32)], 13)


def _seed(seed):
    return jnp.stack(seed_words(seed), axis=-1).reshape((*jnp.shape(seed), *KEY_SHAPE))


def _random_bits(key_data, bit_width, shape):
    return random_bits_words([key_data[..., 0, 0], key_data[..., 0, 1]], bit_width, shape)


def _fold_in(key_data, data):
    k0, k1 = fold_in_words([key_data[..., 0, 0], key_data[..., 0, 1]], data)
    return jnp.stack([k0, k1], axis=-1)[..., None, :]


def _split(key_data, shape):
    raise NotImplementedError(
        "Cannot split a Pallas key. Use fold_in instead to generate new keys.")


tpu_key_impl = jc.PRNGImpl(key_shape=KEY_SHAPE, seed=_seed, split=_split,
                           random_bits=_random_bits, fold_in=_fold_in,
                           name="pallas_tpu", tag="pl")


def _register() -> None:
    existing = jc.prng_impls.get(tpu_key_impl.name)
    if existing is None:
        jc.register_prng(tpu_key_impl)
    elif existing is not tpu_key_impl:
        warnings.warn(
            "a PRNG implementation named 'pallas_tpu' is already registered (upstream "
            "jax.experimental.pallas imported in this process?); keys made with "
            "impl='pallas_tpu' use that one, not pallas-tpu's", RuntimeWarning, stacklevel=2)


_register()


def is_pallas_impl(impl) -> bool:
    """Whether ``impl`` is the Pallas TPU key implementation."""
    return impl == tpu_key_impl


def to_pallas_key(key: jax.Array) -> jax.Array:
    """A Pallas TPU key (``impl="pallas_tpu"``) drawn from any JAX key.

    ``key`` is a typed key (a batch of keys if it has dimensions) or legacy uint32 key
    data (a batch if it has more than one dimension); each key gives the two words of a
    new key by ``jax.random.bits``.
    """
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    batched = key.ndim > (0 if typed else 1)

    def words(k):
        return jax.random.bits(k, shape=KEY_SHAPE, dtype=jnp.uint32)

    data = jax.vmap(words)(key) if batched else words(key)
    return jax.random.wrap_key_data(data, impl=tpu_key_impl.name)
