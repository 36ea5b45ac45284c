"""``thread_map``: run ``f(thread_index, token, *args)`` on several threads at once."""

from __future__ import annotations

import functools
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np


def _run_threads(f, num_threads, token, *args):
    args = jax.tree_util.tree_map(np.asarray, args)

    def one(i):
        return jax.jit(f)(jnp.int32(i), jnp.int32(token), *args)

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
    token once all have finished. Inside a traced computation the threads run from a
    host callback; with one thread, ``f`` is simply called."""
    num_threads = int(num_threads)
    if num_threads == 1:
        return f(jnp.int32(0), token, *args)
    return jax.experimental.io_callback(
        functools.partial(_run_threads, f, num_threads),
        jax.ShapeDtypeStruct((), jnp.int32), token, *args, ordered=False)
