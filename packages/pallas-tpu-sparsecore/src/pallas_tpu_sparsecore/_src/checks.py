"""Runtime checks of the interpreter rules (out-of-range gather/scatter indices).

With the interpreter's checks on (``pl.enable_bounds_checks`` or debug checks), a
failure is reported through the interpreter's error table, naming the grid point.
Otherwise the check still runs, as a host callback that raises ``IndexError``: an
out-of-range index is never silently clamped or dropped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


class SparseCoreIndexError(IndexError):
    """A gather, scatter or indexed DMA used an index outside its ref."""


def require(ctx, ok, message: str) -> None:
    """Fails the kernel with ``message`` when ``ok`` (a traced bool) is false."""
    ok = jnp.all(jnp.asarray(ok))
    if getattr(ctx, "error_cell", None) is not None:
        ctx.report(ok, message)
        return

    def _raise(ok_value):
        if not bool(ok_value):
            raise SparseCoreIndexError(message)

    jax.debug.callback(_raise, ok)


def in_range(idx, size: int, valid=None):
    """Whether every (valid) entry of ``idx`` lies in ``[0, size)``."""
    good = (idx >= 0) & (idx < size)
    if valid is not None:
        good = good | jnp.logical_not(valid)
    return jnp.all(good)
