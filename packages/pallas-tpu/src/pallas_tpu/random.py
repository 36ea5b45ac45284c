"""Pallas TPU random numbers (upstream's ``jax._src.pallas.mosaic.random`` names).

- Keys: ``to_pallas_key`` turns any JAX key into a ``"pallas_tpu"`` key (two uint32 words
  seeding the core's hardware PRNG); ``jax.random.key(seed, impl="pallas_tpu")`` makes one
  from a seed. Inside a kernel, ``jax.random.bits``/``uniform``/``normal``/... on such a
  key draw from the core's PRNG and ``jax.random.fold_in`` derives new keys (``split`` is
  refused). ``unwrap_pallas_seed``/``wrap_pallas_seed`` move between a key and its scalar
  words.
- Stateful sampling: ``set_seed`` (``prng_seed``) then ``stateful_uniform`` and friends.
- ``sample_block``: block-invariant sampling over a grid.
"""

from pallas_tpu._src.primitives.misc import (
    prng_random_bits,
    prng_seed,
    stateful_bernoulli,
    stateful_bits,
    stateful_normal,
    stateful_uniform,
    unwrap_pallas_seed,
    wrap_pallas_seed,
)
from pallas_tpu._src.prng_keys import is_pallas_impl, to_pallas_key, tpu_key_impl
from pallas_tpu._src.sampling import sample_block

set_seed = prng_seed

__all__ = [
    "is_pallas_impl", "prng_random_bits", "prng_seed", "sample_block", "set_seed",
    "stateful_bernoulli", "stateful_bits", "stateful_normal", "stateful_uniform",
    "to_pallas_key", "tpu_key_impl", "unwrap_pallas_seed", "wrap_pallas_seed",
]
