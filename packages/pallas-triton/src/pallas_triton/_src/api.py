"""The user-facing helpers: ``CompilerParams``, ``inspect``, and kernel discovery."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.extend.core as jex_core
from jax import lax

import pallas as pl
from pallas_triton._src.lowering import LoweredKernel, lower_kernel


@dataclasses.dataclass(frozen=True)
class CompilerParams(pl.CompilerParams):
    """Triton options for ``pallas_call``; passing an instance selects the Triton backend.

    Attributes:
      num_warps: warps per program (Triton's default, 4, when None).
      num_stages: software-pipelining stages for loops (when None, Triton's default for
        the target: 3 on NVIDIA GPUs, 2 on AMD GPUs).
      compute_capability: the target GPU as ``major * 10 + minor`` (80 = A100,
        90 = H100). Not in upstream: when None, the ``PALLAS_TRITON_COMPUTE_CAPABILITY``
        environment variable, then the local GPU, then 80.
      rocm_arch: the AMD GPU when lowering for platform ``rocm`` (``"gfx942"`` = MI300,
        ``"gfx90a"``, ``"gfx950"``, ``"gfx1100"``; see ``pltriton.AMD_TARGETS``). Not in
        upstream: when None, the ``PALLAS_TRITON_ROCM_ARCH`` environment variable, then
        gfx942.
    """

    BACKEND: ClassVar[str] = "triton"

    num_warps: int | None = None
    num_stages: int | None = None
    compute_capability: int | None = None
    rocm_arch: str | None = None


@dataclasses.dataclass(frozen=True)
class PallasCall:
    """One ``pallas_call`` found in a traced function: its kernel and grid mapping."""

    name: str
    jaxpr: Any  # the kernel's ClosedJaxpr
    grid_mapping: Any
    compiler_params: Any

    def lower(self, target: str | None = None) -> LoweredKernel:
        """The kernel's Triton source, for NVIDIA (``target=None``) or an AMD arch."""
        return lower_kernel(self.jaxpr, self.grid_mapping, self.compiler_params, self.name,
                            target=target)


def _walk(jaxpr, out: list) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive is pl.pallas_call_p:
            p = eqn.params
            out.append(PallasCall(p["name"], p["jaxpr"], p["grid_mapping"],
                                  p["compiler_params"]))
            continue
        for sub in jex_core.jaxprs_in_params(eqn.params):
            _walk(sub, out)


def find_pallas_calls(f, *args, **kwargs) -> list[PallasCall]:
    """Every ``pallas_call`` that ``f(*args, **kwargs)`` makes, in trace order."""
    closed = jax.make_jaxpr(f)(*args, **kwargs)
    out: list[PallasCall] = []
    _walk(closed.jaxpr, out)
    return out


def lower(f, *args, **kwargs) -> list[LoweredKernel]:
    """The Triton kernels (as :class:`LoweredKernel`) of every ``pallas_call`` in ``f``."""
    return [c.lower() for c in find_pallas_calls(f, *args, **kwargs)]


def inspect(f, *args, **kwargs) -> str:
    """The generated ``triton.language`` source of every ``pallas_call`` in ``f(*args)``.

    The text is exactly what ``triton.compile`` receives on GPU and what Triton's
    interpreter runs in emulation. ``print(pltriton.inspect(f, x))`` to read it.
    """
    kernels = lower(f, *args, **kwargs)
    if not kernels:
        raise ValueError("the function makes no pallas_call")
    return "\n\n".join(k.source for k in kernels)


def approx_tanh(x: jax.Array) -> jax.Array:
    """``tanh`` (the Triton backend computes it with libdevice, like ``jnp.tanh``)."""
    return jax.numpy.tanh(x)


def dot(a, b, trans_a: bool = False, trans_b: bool = False, allow_tf32: bool | None = None,
        precision=None):
    """Matrix product of 2-D blocks, optionally transposed (upstream ``pltriton.dot``)."""
    if allow_tf32 is not None:
        if precision is not None:
            raise ValueError("only one of allow_tf32 and precision can be given")
        precision = lax.Precision.DEFAULT if allow_tf32 else lax.Precision.HIGHEST
    lhs_c = 0 if trans_a else a.ndim - 1
    rhs_c = b.ndim - 1 if trans_b else b.ndim - 2
    pref = jax.numpy.float32 if jax.numpy.issubdtype(a.dtype, jax.numpy.floating) else None
    out = lax.dot_general(a, b, (((lhs_c,), (rhs_c,)), ((), ())), precision=precision,
                          preferred_element_type=pref)
    return out


def max_contiguous(x, values):
    """A hint that runs of ``values`` elements of ``x`` are contiguous; returns ``x``."""
    del values
    return x


def load(ref, *, mask=None, other=None, cache_modifier: str | None = None,
         eviction_policy: str | None = None, volatile: bool = False):
    """``pl.load`` with Triton's cache hints (hints do not change values)."""
    return pl.load(ref, (), mask=mask, other=other, cache_modifier=cache_modifier,
                   eviction_policy=eviction_policy, volatile=volatile)


def store(ref, val, *, mask=None, eviction_policy: str | None = None) -> None:
    """``pl.store`` with Triton's eviction hint (hints do not change values)."""
    pl.store(ref, (), val, mask=mask, eviction_policy=eviction_policy)
