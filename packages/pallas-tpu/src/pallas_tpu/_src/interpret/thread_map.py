"""``thread_map``: run ``f(thread_index, token, *args)`` on several threads at once."""

from __future__ import annotations

import functools
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np

# The token a thread's computation receives: the threads run as separate computations,
# so nothing orders them after the caller's effects (a distinct value makes that plain).
_THREAD_TOKEN = 1


def _run_threads(closed, num_threads, token, *args):
    consts = [np.asarray(c) for c in closed.consts]
    args = [np.asarray(a) for a in args]
    def run(i, *xs):
        jax.core.eval_jaxpr(closed.jaxpr, xs[:len(consts)], i, *xs[len(consts):])

    compiled = jax.jit(run).trace(np.int32(0), *consts, *args).lower().compile()

    def one(i):
        compiled(np.int32(i), *consts, *args)

    with futures.ThreadPoolExecutor(max_workers=num_threads) as pool:
        results = [pool.submit(one, i) for i in range(num_threads)]
        errors = []
        for r in results:
            try:
                r.result()
            except Exception as e:  # noqa: BLE001 - the first is re-raised below
                errors.append(e)
    if errors:
        raise errors[0]
    return np.asarray(token, np.int32)


def thread_map(f, num_threads: int, token, *args):
    """Runs ``f(i, token, *args)`` for ``i`` in ``range(num_threads)``, each on its own
    thread and all at the same time (so they may wait for each other), and returns the
    token once all have finished. ``f`` is traced once; its threads run from a host
    callback. With one thread, ``f`` is simply called."""
    num_threads = int(num_threads)
    if num_threads == 1:
        return f(jnp.int32(0), token, *args)
    flat, tree = jax.tree_util.tree_flatten(args)

    def body(i, *leaves):
        f(i, jnp.int32(_THREAD_TOKEN), *jax.tree_util.tree_unflatten(tree, leaves))
        return []

    closed = jax.make_jaxpr(body)(jnp.int32(0), *flat)
    return jax.experimental.io_callback(
        functools.partial(_run_threads, closed, num_threads),
        jax.ShapeDtypeStruct((), jnp.int32), token, *flat, ordered=False)
