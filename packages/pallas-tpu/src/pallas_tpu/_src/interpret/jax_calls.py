"""Running JAX computations for a device's cores on the device's own callback thread.

A device's part of a kernel runs inside a host callback of a JAX computation. Its cores
run on threads of their own; computations they launched themselves could wait behind the
(blocked) computation of the callback under ``shard_map``, so each core hands its JAX
work to the callback's thread, which runs it (results as numpy) while it waits for them.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

import jax
import numpy as np


def _to_numpy(x):
    return jax.tree_util.tree_map(
        lambda a: np.asarray(a) if isinstance(a, jax.Array) else a, x)


class DeviceCalls:
    """A queue of calls that the device's thread runs (``serve``) for its cores."""

    def __init__(self):
        self.owner = threading.current_thread()
        self.requests: queue.Queue = queue.Queue()

    def __call__(self, fn, *args):
        if threading.current_thread() is self.owner:
            return _to_numpy(fn(*args))
        done: Future = Future()
        self.requests.put((fn, args, done))
        return done.result()

    def serve(self, threads) -> None:
        """Runs the cores' calls until every thread in ``threads`` has finished."""
        while any(t.is_alive() for t in threads):
            try:
                fn, args, done = self.requests.get(timeout=0.01)
            except queue.Empty:
                continue
            try:
                done.set_result(_to_numpy(fn(*args)))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting core
                done.set_exception(e)
