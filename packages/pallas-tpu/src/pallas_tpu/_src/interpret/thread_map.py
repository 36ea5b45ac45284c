"""``thread_map``: run ``f(thread_index, token, *args)`` on several threads at once.

The threads run ``f``'s jaxpr, compiled once, from one host callback. As in the
simulation's cores (``grid.py``: ``Simulation.fail``), the first thread to raise is
reported at once (``on_exception``), so that threads waiting for it can be released
instead of hanging; the callback returns once every thread has finished and re-raises
that first error.
"""

from __future__ import annotations

import functools
import numbers
import threading
from collections.abc import Callable
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np

# The token a thread's computation receives: the threads run as separate computations,
# so nothing orders them after the caller's effects (a distinct value makes that plain).
_THREAD_TOKEN = 1


def _ignore_exception(exception: BaseException, *, device_id: int | None) -> None:
    """The default ``on_exception``: nothing to release."""


class _FirstFailure:
    """Keeps the first error of a ``thread_map``'s threads and reports it once."""

    def __init__(self, num_threads: int, device_id: int | None, on_exception: Callable):
        self.num_threads = num_threads
        self.device_id = device_id
        self.on_exception = on_exception
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def __call__(self, thread: int, e: BaseException) -> None:
        with self.lock:
            if self.error is not None:
                return
            self.error = e
        where = "" if self.device_id is None else f" on device {self.device_id}"
        e.add_note(f"thread_map: raised by thread {thread} of {self.num_threads}{where}")
        try:
            self.on_exception(e, device_id=self.device_id)
        except Exception as h:  # noqa: BLE001 - the thread's error stays the one raised
            e.add_note(f"thread_map: on_exception raised too: {type(h).__name__}: {h}")


def _run_threads(jaxpr, num_consts: int, num_threads: int, on_exception, token,
                 device_id, *operands):
    """The host callback: runs ``jaxpr`` on ``num_threads`` threads and returns
    ``token`` once all have finished, or raises the first thread's error."""
    device_id = None if device_id is None else int(np.asarray(device_id))
    operands = [np.asarray(x) for x in operands]
    consts, args = operands[:num_consts], operands[num_consts:]

    def run(i, consts, args):
        jax.core.eval_jaxpr(jaxpr, consts, i, *args)

    compiled = jax.jit(run).trace(np.int32(0), consts, args).lower().compile()
    failure = _FirstFailure(num_threads, device_id, on_exception)

    def one(i):
        try:
            compiled(np.int32(i), consts, args)
        except BaseException as e:
            failure(i, e)
            raise

    with futures.ThreadPoolExecutor(max_workers=num_threads) as pool:
        for r in [pool.submit(one, i) for i in range(num_threads)]:
            r.exception()  # waits; the error that counts is ``failure.error``
    if failure.error is not None:
        raise failure.error
    return np.asarray(token, np.int32)


def _check(f, num_threads, token, use_ordered_callback, device_id, on_exception) -> int:
    """Validates ``thread_map``'s arguments at trace time; returns ``num_threads``."""
    if not callable(f):
        raise TypeError(f"thread_map: f must be callable f(thread_index, token, *args), "
                        f"got {type(f).__name__} {f!r}")
    if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral):
        raise TypeError(f"thread_map: num_threads must be a positive Python int (known "
                        f"at trace time), got {type(num_threads).__name__} {num_threads!r}")
    if num_threads < 1:
        raise ValueError(f"thread_map: num_threads must be a positive int, got "
                         f"{num_threads}")
    _check_int_scalar("token", token, none_ok=False)
    if not isinstance(use_ordered_callback, bool):
        raise TypeError(f"thread_map: use_ordered_callback must be a bool, got "
                        f"{type(use_ordered_callback).__name__} {use_ordered_callback!r}")
    _check_int_scalar("device_id", device_id, none_ok=True)
    if not callable(on_exception):
        raise TypeError(f"thread_map: on_exception must be callable "
                        f"on_exception(exception, device_id=...), got "
                        f"{type(on_exception).__name__} {on_exception!r}")
    return int(num_threads)


def _check_int_scalar(name: str, x, none_ok: bool) -> None:
    if x is None and none_ok:
        return
    valid = "an integer scalar (a Python int or an integer array of shape ())" + (
        ", or None" if none_ok else "")
    if isinstance(x, bool) or x is None:
        raise TypeError(f"thread_map: {name} must be {valid}, got {x!r}")
    if isinstance(x, numbers.Integral):
        if int(x) < 0 and name == "device_id":
            raise ValueError(f"thread_map: device_id must be >= 0, got {x}")
        return
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if dtype is None:
        raise TypeError(f"thread_map: {name} must be {valid}, got {type(x).__name__} "
                        f"{x!r}")
    if shape != () or not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"thread_map: {name} must be {valid}, got "
                        f"{type(x).__name__} of shape {shape} and dtype {dtype}")


def thread_map(f, num_threads: int, token, *args, use_ordered_callback: bool = False,
               device_id=None, on_exception: Callable = _ignore_exception):
    """Runs ``f(i, token, *args)`` for ``i`` in ``range(num_threads)``, each on its own
    thread and all at the same time (so they may wait for each other), and returns the
    token once all have finished. ``f`` is traced once; its threads run from one host
    callback (``io_callback``, ordered after the caller's ordered effects when
    ``use_ordered_callback``). ``device_id`` (an int, possibly traced, e.g. a
    ``shard_map`` axis index) names the device the threads run for. When a thread
    raises, ``on_exception(exception, device_id=device_id)`` is called at once (once per
    call), so that it can release threads waiting for the failed one; the error is
    re-raised when all have finished. With one thread, ``f`` is simply called."""
    num_threads = _check(f, num_threads, token, use_ordered_callback, device_id,
                         on_exception)
    if num_threads == 1:
        return f(jnp.int32(0), token, *args)
    flat, tree = jax.tree_util.tree_flatten(args)

    def body(i, *leaves):
        f(i, jnp.int32(_THREAD_TOKEN), *jax.tree_util.tree_unflatten(tree, leaves))
        return []

    closed = jax.make_jaxpr(body)(jnp.int32(0), *flat)
    # The consts go to the callback as operands: under ``jit`` they may be tracers.
    callback = functools.partial(_run_threads, closed.jaxpr, len(closed.consts),
                                 num_threads, on_exception)
    return jax.experimental.io_callback(
        callback, jax.ShapeDtypeStruct((), jnp.int32), token, device_id,
        *closed.consts, *flat, ordered=use_ordered_callback)
