"""Kernel artifacts: what a backend builds once from a kernel request.

As Triton's ``BaseBackend.add_stages`` stages a kernel, a backend's
:meth:`~pallas.plugins.Backend.build` turns one typed
:class:`~pallas.plugins.KernelRequest` into a :class:`~pallas.plugins.KernelArtifact`:
the request validated once (its compiler params already coerced by the core) and
whatever the backend wants to keep from that work (a lowered kernel, its generated
source). The core keeps each artifact with the ``pallas_call`` equation it belongs to and
hands the same one, as ``request.artifact``, to ``lower``, ``compile``, ``emulate``,
``emulator`` and ``interpret``; a backend reads it with ``self.artifact(request)``, which
builds it when no stage has yet.

The cache is keyed by the kernel jaxpr object itself, weakly (an entry lives exactly as
long as the jaxpr does: the id of a dead jaxpr, which a new one may reuse, is never a
key), then by the backend and the rest of the request (the grid mapping by identity).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from pallas._src.registry.requests import KernelArtifact, KernelRequest, LoweringRequest

if TYPE_CHECKING:
    from pallas._src.registry.backend import Backend

_artifacts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _kernel(request: KernelRequest) -> KernelRequest:
    return request.kernel if isinstance(request, LoweringRequest) else request


def _key(backend: Backend, request: KernelRequest) -> Any:
    """The request's identity for ``backend``, or None when part of it is unhashable."""
    key = (backend.name, request.grid_mapping, request.compiler_params, request.name,
           request.out_avals, request.metadata, request.cost_estimate, request.debug,
           tuple(sorted(request.options.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def cached_artifact(backend: Backend, request: KernelRequest) -> KernelArtifact | None:
    """The artifact ``backend`` built for this kernel, if a stage built one (no build)."""
    key = _key(backend, request)
    if key is None:
        return None
    with _lock:
        try:
            return _artifacts.get(request.jaxpr, {}).get(key)
        except TypeError:  # a jaxpr that cannot be referenced weakly: never cached
            return None


def artifact_for(backend: Backend, request: KernelRequest) -> KernelArtifact:
    """``request.artifact`` when the core handed one, else the cached artifact of this
    kernel, else ``backend.build(request)`` (cached when it succeeds)."""
    if request.artifact is not None and request.artifact.backend == backend.name:
        return request.artifact
    request = _kernel(request)
    hit = cached_artifact(backend, request)
    if hit is not None:
        return hit
    artifact = backend.build(request)
    if not isinstance(artifact, KernelArtifact):
        raise TypeError(f"backend {backend.name!r}: build() returned "
                        f"{type(artifact).__name__}, not a pallas.plugins.KernelArtifact")
    key = _key(backend, request)
    if key is not None:
        with _lock:
            try:
                _artifacts.setdefault(request.jaxpr, {})[key] = artifact
            except TypeError:
                pass
    return artifact
