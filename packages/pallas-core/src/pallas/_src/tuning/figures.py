"""Compile-level figures: what a backend's real compiler says a config costs.

A backend contributes figures in one of three ways, first found wins:

1. a provider registered with :func:`register_figures` (``provider(request, target)``
   returning a mapping), for a plugin that wants to choose what it reports;
2. its ``Backend.tuning_figures(request, target)`` (the default answers ``None``);
3. otherwise, where the backend has a ``compile`` level, its compiled artifact is read
   for the attributes named in :data:`FIELDS` (``registers``, ``smem_bytes``, ...).

A backend with none of these contributes nothing: the core's own figures (from the
jaxpr) are still there. Nothing here imports a backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from pallas._src.registry.requests import KernelRequest

# The figures the model reads, and the attribute names they are found under in a
# backend's compiled artifact (pallas_mosaic_gpu's CompiledKernel, pallas_triton's, ...).
FIELDS: dict[str, tuple[str, ...]] = {
    "registers": ("registers", "num_regs", "n_regs"),
    "spill_stores": ("spill_stores",),
    "spill_loads": ("spill_loads",),
    "smem_bytes": ("smem_bytes", "shared_mem_bytes", "shared", "smem"),
    "vmem_bytes": ("vmem_bytes", "vmem_usage_bytes", "vmem"),
    "num_warps": ("num_warps",),
}

Provider = Callable[[KernelRequest, Any], Mapping[str, Any]]
_PROVIDERS: dict[str, Provider] = {}


def register_figures(backend: str, provider: Provider) -> None:
    """Makes ``provider(request, target)`` the source of ``backend``'s compile figures.

    ``request`` is a :class:`pallas.plugins.KernelRequest` whose ``options`` name the
    target (``{"target": "v5e"}``, ``{"target": "sm_90a", "compute_capability": 90}``);
    the provider returns a mapping with any of ``registers``, ``spill_stores``,
    ``spill_loads``, ``smem_bytes``, ``vmem_bytes``, ``num_warps`` and
    ``instruction_mix`` (a dict of op -> count), and raises if the compiler rejects the
    kernel (the config is then pruned with that error as its reason).
    """
    if not callable(provider):
        raise TypeError(f"register_figures: provider for {backend!r} must be callable, "
                        f"got {provider!r}")
    _PROVIDERS[backend] = provider


def unregister_figures(backend: str) -> None:
    """Removes ``backend``'s provider (tests, or a plugin unloading)."""
    _PROVIDERS.pop(backend, None)


def read_compiled(compiled: Any) -> dict[str, Any]:
    """The :data:`FIELDS` found on a compiled artifact (a list: the first kernel's)."""
    if isinstance(compiled, list | tuple) and compiled:
        compiled = compiled[0]
    out: dict[str, Any] = {}
    for field, names in FIELDS.items():
        for n in names:
            v = getattr(compiled, n, None)
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[field] = v
                break
    if "registers" not in out and callable(getattr(compiled, "resource_usage", None)):
        try:  # pallas_triton: read from the cubin by cuobjdump, where it is installed
            usage = compiled.resource_usage()
            out["registers"] = int(usage.get("registers", usage.get("REG", 0)))
            if usage.get("local"):  # per-thread local memory: spilled registers
                out.setdefault("spill_stores", int(usage["local"]) // 4)
        except Exception:  # noqa: BLE001 - an optional figure; the rest still stand
            pass
    mix = getattr(compiled, "instruction_mix", None)
    if callable(mix):
        out["instruction_mix"] = dict(mix())
    return out


def provider_for(backend: Any) -> Provider | None:
    """The figures source of ``backend`` (see the module docstring), or ``None``."""
    if backend.name in _PROVIDERS:
        return _PROVIDERS[backend.name]
    if "compile" not in backend.levels:
        return backend.tuning_figures  # Backend's default answers None: no figures

    def figures(request: KernelRequest, target: Any) -> Mapping[str, Any]:
        own = backend.tuning_figures(request, target)
        return own if own is not None else read_compiled(backend.compile(request))

    return figures


@dataclasses.dataclass
class BackendFigures:
    """One kernel's compile figures, and which backend gave them."""

    backend: str
    values: dict


def backend_figures(backend: Any, params: Mapping[str, Any], target: Any) -> BackendFigures | None:
    """Compile figures of one ``pallas_call_p`` equation for ``target`` (``None`` when
    the backend has no source of them). Raises what the compiler raised."""
    provider = provider_for(backend)
    if provider is None:
        return None
    request = KernelRequest.for_backend(backend, params, **target.compile_options())
    values = provider(request, target)
    return None if values is None else BackendFigures(backend.name, dict(values))
