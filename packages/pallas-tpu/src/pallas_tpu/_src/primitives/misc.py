"""PRNG (``prng_seed``, ``prng_random_bits``, ``stateful_*``), ``trace_value``, ``touch``
and ``with_memory_space_constraint``.

The TPU core has a hardware PRNG seeded by ``prng_seed``. In the interpreter its state is
the model of ``pallas_tpu._src.prng_model`` (which the Mosaic TPU executor implements
too): a threefry key derived from the seeds; the ``n``-th ``prng_random_bits`` after the
seed draws from ``fold_in(key, n)``. The state is declared kernel state (a uint32
vector: the key's two words, a seeded flag, ``n``), so the interpreter threads it
through loops and conditions and carries it from grid step to grid step, as the core
does: a draw in a loop is fresh each iteration.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas.plugins import Cell, declare_kernel_state, effect_primitive
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src import prng_model
from pallas_tpu._src.memory import SemaphoreType, canonical_space
from pallas_tpu._src.primitives import refs as R
from pallas_tpu._src.primitives.effects import tpu_kernel_effect

prng_seed_p = effect_primitive("tpu_prng_seed", {tpu_kernel_effect})
prng_random_bits_p = jc.Primitive("tpu_prng_random_bits")
trace_value_p = effect_primitive("tpu_trace_value", {tpu_kernel_effect})
touch_p = effect_primitive("tpu_touch", {jc.ReadEffect(0)})


def prng_seed(*seeds) -> None:
    """Seeds the kernel's PRNG with one or more int32 scalars."""
    if not seeds:
        raise ValueError("prng_seed needs at least one seed")
    flat = []
    for s in seeds:
        s = jnp.asarray(s) if not isinstance(s, jax.Array) else s
        if jnp.issubdtype(s.dtype, jax.dtypes.prng_key):  # a key seeds with its words
            flat += [w.astype(jnp.int32) for w in _key_words(s)]
            continue
        flat += list(s.reshape(-1)) if s.ndim else [s]
    prng_seed_p.bind(*[jnp.asarray(s).astype(jnp.int32) for s in flat])


def _key_words(key) -> list:
    """A typed key's uint32 words: scalars for a (1, N) key (Pallas TPU keys), else its data."""
    shape = tuple(key.dtype._impl.key_shape)
    if key.ndim == 0 and len(shape) == 2 and shape[0] == 1:
        return list(unwrap_pallas_seed(key))
    return list(jax.random.key_data(key).reshape(-1))


def prng_random_bits(shape):
    """Random int32 bits of ``shape`` from the kernel's PRNG (seed it first)."""
    return prng_random_bits_p.bind(shape=tuple(int(d) for d in shape))


prng_random_bits_p.def_effectful_abstract_eval(
    lambda *, shape: (jc.ShapedArray(shape, jnp.int32), {tpu_kernel_effect}))

_STATE = "mosaic_tpu.prng"
_SEEDED = "mosaic_tpu.prng.seeded"  # a seed was traced in this evaluation (static)
_KEY, _FLAG, _COUNT = slice(0, 2), 2, 3  # the state vector's parts


def _seed_rule(ctx, eqn, invals):
    words = jax.random.key_data(prng_model.seeded_key(invals))
    ctx.kernel_state(_STATE).value = jnp.concatenate(
        [words, jnp.array([1, 0], jnp.uint32)])
    ctx.backend_state[_SEEDED] = True
    return []


def _bits_rule(ctx, eqn, invals):
    if not ctx.backend_state.get(_SEEDED):
        raise ValueError(
            "prng_random_bits before prng_seed: seed the kernel's PRNG with "
            "pltpu.prng_seed(...) first"
        )
    cell = ctx.kernel_state(_STATE)
    state = cell.value
    # Seeded on some path only (e.g. under pl.when): a run that reaches the draw unseeded
    # draws from the zero state, as the chip draws from whatever its PRNG holds.
    ctx.report(state[_FLAG] == 1, "prng_random_bits before prng_seed on this path")
    cell.value = state.at[_COUNT].add(jnp.uint32(1))
    key = jax.random.wrap_key_data(state[_KEY], impl="threefry2x32")
    return [prng_model.draw(key, state[_COUNT], eqn.params["shape"])]


declare_kernel_state(_STATE, lambda: jnp.zeros((4,), jnp.uint32),
                     reads=(prng_random_bits_p,), resets=(prng_seed_p,))


# -- Pallas TPU keys as scalars (upstream's prng_split / prng_join) ----------------------
# JAX's key_data/wrap_key_data make vectors; a TPU kernel keeps a key as SMEM scalars.

split_key_p = jc.Primitive("prng_split")
split_key_p.multiple_results = True
join_key_p = jc.Primitive("prng_join")


def _pallas_key_shape(impl) -> tuple[int, ...]:
    shape = tuple(impl.key_shape)
    if len(shape) != 2 or shape[0] != 1:
        raise ValueError(f"Key shape must be (1, N), got {shape} (PRNG impl {impl.name!r}); "
                         f"Pallas TPU keys are a row of uint32 scalars")
    return shape


def _split_abstract_eval(key):
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        raise TypeError(f"unwrap_pallas_seed: expected a typed PRNG key, got {key.dtype}")
    n = _pallas_key_shape(key.dtype._impl)[1]
    return [jc.ShapedArray(key.shape, jnp.dtype("uint32"))] * n


def _join_abstract_eval(*seeds, impl):
    n = _pallas_key_shape(impl)[1]
    if len(seeds) != n:
        raise ValueError(f"Number of seeds must match key shape, got {len(seeds)} != {n}.")
    shapes = {tuple(s.shape) for s in seeds}
    if len(shapes) != 1:
        raise ValueError(f"wrap_pallas_seed: the seeds must have one shape, got {shapes}")
    return jc.ShapedArray(shapes.pop(), jc.KeyTy(impl))


split_key_p.def_abstract_eval(_split_abstract_eval)
join_key_p.def_abstract_eval(_join_abstract_eval)


def unwrap_pallas_seed(seed):
    """The uint32 scalars of a Pallas TPU key (``key_shape == (1, N)``), as a list."""
    return split_key_p.bind(seed)


def wrap_pallas_seed(*seeds, impl):
    """Joins uint32 scalars into one key of ``impl`` (a name or a ``PRNGImpl``)."""
    if isinstance(impl, str):
        if impl not in jc.prng_impls:
            raise ValueError(f"wrap_pallas_seed: unknown PRNG impl {impl!r}; registered: "
                             f"{sorted(jc.prng_impls)}")
        impl = jc.prng_impls[impl]
    return join_key_p.bind(*[jnp.asarray(s, jnp.uint32) for s in seeds], impl=impl)


def _split_rule(ctx, eqn, invals):
    data = jax.random.key_data(invals[0])
    return [data[..., 0, i] for i in range(data.shape[-1])]


def _join_rule(ctx, eqn, invals):
    impl = eqn.params["impl"]
    data = jnp.stack([jnp.asarray(s, jnp.uint32) for s in invals], axis=-1)[..., None, :]
    return [jax.random.wrap_key_data(data, impl=impl.name)]


# -- stateful samplers built on the kernel PRNG ----------------------------------------------


def stateful_bits(shape, dtype=jnp.uint32):
    """Random bits of ``shape`` as an unsigned integer ``dtype`` (kernel PRNG)."""
    bits = lax.bitcast_convert_type(prng_random_bits(shape), jnp.uint32)
    return bits.astype(dtype)


def stateful_uniform(shape, dtype=jnp.float32, minval=0.0, maxval=1.0):
    """Uniform floats in ``[minval, maxval)`` from the kernel PRNG."""
    bits = lax.bitcast_convert_type(prng_random_bits(shape), jnp.uint32)
    mant = (bits >> jnp.uint32(9)) | jnp.uint32(0x3F800000)
    u = lax.bitcast_convert_type(mant, jnp.float32) - 1.0
    return (minval + (maxval - minval) * u).astype(dtype)


def stateful_normal(shape, dtype=jnp.float32):
    """Standard normal samples from the kernel PRNG (inverse-CDF method)."""
    u = stateful_uniform(shape, jnp.float32, minval=-1.0 + 1e-7, maxval=1.0)
    return (jnp.sqrt(2.0) * lax.erf_inv(u)).astype(dtype)


def stateful_bernoulli(shape, p=0.5):
    """Booleans that are true with probability ``p`` (kernel PRNG)."""
    return stateful_uniform(shape) < p


# -- trace_value, touch ------------------------------------------------------------------------


def trace_value(label: str, value) -> None:
    """Records a scalar ``value`` under ``label`` in the TPU profiler trace."""
    trace_value_p.bind(jnp.asarray(value), label=str(label))


def touch(ref) -> None:
    """Marks ``ref`` as used (keeps it alive), without reading or writing it."""
    base, flat, tree = R.flatten_ref(ref)
    touch_p.bind(base, *flat, tree=tree)


def with_memory_space_constraint(x, memory_space):
    """Asks that the ``pallas_call`` operand ``x`` be placed in ``memory_space``.

    Returns ``x`` unchanged; the placement is a hint that the TPU backend honours when
    ``x`` feeds a kernel directly. Only ``ANY``/``HBM``, ``VMEM``, ``SMEM`` and
    ``SEMAPHORE`` are meaningful.
    """
    space = canonical_space(memory_space)
    if space is None:
        raise ValueError("with_memory_space_constraint needs a memory space, not None")
    return x


# -- the barrier semaphore ---------------------------------------------------------------------

get_barrier_semaphore_p = jc.Primitive("tpu_get_barrier_semaphore")
# The semaphore is created inside the kernel: marking the primitive as allocating a ref
# lets JAX accept the semaphore primitives' effects on it (they name no jaxpr input).
jc.mark_ref_allocating(get_barrier_semaphore_p)


def get_barrier_semaphore():
    """The kernel's barrier semaphore, for handshakes between devices.

    Signal it on neighbours with ``pl.semaphore_signal(sem, device_id=...)`` and wait on
    it locally. Kernels using it must pass ``collective_id`` in ``pltpu.CompilerParams``
    (Mosaic allocates the semaphore from it). In the interpreter it is one int32 count
    per device, shared by every use in the kernel; remote signals reach it when the
    kernel runs under ``jax.shard_map``.
    """
    return get_barrier_semaphore_p.bind()


def _get_barrier_semaphore():
    return get_barrier_semaphore_p.bind()


def _barrier_aval():
    return jc.AbstractRef(jc.ShapedArray((), jnp.int32), memory_space=SemaphoreType.BARRIER)


get_barrier_semaphore_p.def_effectful_abstract_eval(
    lambda: (_barrier_aval(), {tpu_kernel_effect}))

_BARRIER = "mosaic_tpu.barrier_semaphore"


def _barrier_rule(ctx, eqn, invals):
    cell = ctx.backend_state.get(_BARRIER)
    if cell is None:
        cell = Cell(jnp.zeros((), jnp.int32), "the barrier semaphore", None,
                    SemaphoreType.BARRIER)
        ctx.backend_state[_BARRIER] = cell
    return [cell]


# -- core_barrier ---------------------------------------------------------------------------

core_barrier_p = effect_primitive("tpu_core_barrier", {jc.WriteEffect(0)})


def core_barrier(sem, *, core_axis_name: str) -> None:
    """Synchronizes the TensorCores of ``core_axis_name`` (a ``create_tensorcore_mesh``
    axis): each core signals ``sem`` on every other core, then waits for the
    ``num_cores - 1`` signals it receives. A no-op on a single core.

    ``sem`` is a regular semaphore (e.g. ``pltpu.SemaphoreType.REGULAR`` scratch).
    """
    num_cores = lax.axis_size(core_axis_name)
    base, flat, tree = R.flatten_ref(sem)
    core_barrier_p.bind(base, *flat, tree=tree, axis_name=core_axis_name,
                        num_cores=int(num_cores))


def _core_barrier_rule(ctx, eqn, invals):
    n = eqn.params["num_cores"]
    if n > 1:
        raise NotImplementedError(
            f"pltpu.core_barrier over {n} cores of axis {eqn.params['axis_name']!r} in the "
            f"Pallas interpreter (backend 'mosaic_tpu'): the interpreter runs the cores one "
            f"after another, so no core can wait for a later one; it lowers for TPU"
        )
    return []  # one core: nothing to synchronize


INTERPRET_RULES = {
    core_barrier_p: _core_barrier_rule,
    get_barrier_semaphore_p: _barrier_rule,
    prng_seed_p: _seed_rule,
    split_key_p: _split_rule,
    join_key_p: _join_rule,
    prng_random_bits_p: _bits_rule,
    trace_value_p: lambda ctx, eqn, invals: [],
    touch_p: lambda ctx, eqn, invals: [],
}
