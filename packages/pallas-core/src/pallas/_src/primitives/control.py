"""Control-flow helpers for kernels: ``when`` and ``loop`` (thin layers over ``lax``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax import lax


def when(condition: Any, /) -> Callable[[Callable[[], None]], None]:
    """Decorator: runs the function only where ``condition`` holds.

    ``@pl.when(pl.program_id(0) == 0)`` above a zero-argument function runs it under a
    ``lax.cond``; a Python ``bool`` decides at trace time.
    """

    def decorator(f: Callable[[], None]) -> None:
        if isinstance(condition, bool):
            if condition:
                f()
            return
        lax.cond(jnp.asarray(condition, jnp.bool_), lambda: (f(), None)[1], lambda: None)

    return decorator


def loop(lower, upper, *, init_carry=None, step=1, unroll=None):
    """Decorator for ``for i in range(lower, upper, step)`` loops in kernels.

    The decorated ``body(i)`` (or ``body(i, carry) -> carry`` with ``init_carry``) runs
    immediately; the decorator returns the final carry.
    """

    def decorator(body: Callable[..., Any]):
        if step == 1:
            count_fn = None
        else:
            count_fn = step

        def index(k):
            return lower + k * count_fn if count_fn is not None else k

        if count_fn is None:
            lo, hi = lower, upper
        else:
            lo, hi = 0, (upper - lower + step - 1) // step

        if init_carry is None:

            def fbody(k, c):
                body(index(k))
                return c

            lax.fori_loop(lo, hi, fbody, None, unroll=unroll)
            return None

        def fbody_c(k, c):
            return body(index(k), c)

        return lax.fori_loop(lo, hi, fbody_c, init_carry, unroll=unroll)

    return decorator
