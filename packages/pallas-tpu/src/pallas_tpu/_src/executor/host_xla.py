"""Floating-point functions and matmuls computed by XLA on the host CPU.

A kernel's ``jnp.tanh`` or ``x @ y`` on a TPU agrees bit for bit with the same operation
in XLA:TPU outside the kernel (upstream's tests compare them exactly). On an emulated
device the operations outside the kernel run in XLA:CPU, so the executor computes its
transcendental functions and floating-point matmuls with XLA:CPU's own implementations
(NumPy's differ in the last bit, and in summation order), one jitted function per
operation, on the host's CPU device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# The ``math`` ops that XLA computes (the rest are exact in NumPy too).
FUNCTIONS: dict[str, Callable] = {
    "math.acos": jnp.arccos, "math.acosh": jnp.arccosh, "math.asin": jnp.arcsin,
    "math.asinh": jnp.arcsinh, "math.atan": jnp.arctan, "math.atan2": jnp.arctan2,
    "math.atanh": jnp.arctanh, "math.cbrt": jnp.cbrt, "math.cos": jnp.cos,
    "math.cosh": jnp.cosh, "math.erf": lax.erf, "math.erfc": lax.erfc, "math.exp": jnp.exp,
    "math.exp2": jnp.exp2, "math.expm1": jnp.expm1, "math.log": jnp.log,
    "math.log1p": jnp.log1p, "math.log2": jnp.log2, "math.log10": jnp.log10,
    "math.powf": jnp.power, "math.rsqrt": lax.rsqrt, "math.sin": jnp.sin,
    "math.sinh": jnp.sinh, "math.sqrt": jnp.sqrt, "math.tan": jnp.tan, "math.tanh": jnp.tanh,
}


@functools.cache
def _cpu():
    return jax.devices("cpu")[0]


@functools.cache
def _jitted(name: str):
    return jax.jit(FUNCTIONS[name])


def function(name: str) -> Callable[..., np.ndarray]:
    """``f(*arrays) -> array``: the ``math`` op ``name`` as XLA:CPU computes it."""
    def f(*xs):
        xs = [jax.device_put(np.asarray(x), _cpu()) for x in xs]
        return np.asarray(_jitted(name)(*xs))

    return f


@jax.jit
def _matmul(a, b):
    return lax.dot_general(a, b, (((a.ndim - 1,), (b.ndim - 2,)),
                                  (tuple(range(a.ndim - 2)), tuple(range(b.ndim - 2)))),
                           precision=lax.Precision.HIGHEST,
                           preferred_element_type=jnp.float32)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float32 (batched over leading dims) as XLA:CPU's dot computes it."""
    return np.asarray(_matmul(jax.device_put(a.astype(np.float32), _cpu()),
                              jax.device_put(b.astype(np.float32), _cpu())))
