"""Running a ``pallas_call`` as on an emulated device, from its CPU lowering.

When JAX lowers ``pallas_call_p`` for ``cpu`` while a device is emulated (and the call
is not in interpret mode), the equation becomes a host callback that runs the code the
backend generated for that device:

1. the backend is chosen as on the device's platform (:func:`backend_for`);
2. the kernel is compiled by the backend's real compiler for the device's chip
   (``Backend.compile`` with :meth:`EmulatedDevice.compile_options`); a rejection is
   raised as it would be when compiling for the device, with the compiler's message;
   a backend without a compile level, or whose compiler is not installed, skips the
   step and the reason is recorded (:class:`EmulatedKernel`);
3. the backend's executor plan is built (``Backend.emulator``) and runs on the operands,
   as numpy arrays on the host, once per call.

A kernel that addresses other devices (remote DMAs and semaphore signals: a
``device_id``) is neither compiled alone (its device ids and mesh axes exist only in
its ``shard_map`` program) nor executed by the executors, which run one device's code:
it runs with the cross-device semantics of the backend's interpret mode
(``Backend.device_interpret_mode``; Mosaic GPU's) or else of the core interpreter (each
device's instance of the kernel, in ``shard_map``), and its :class:`EmulatedKernel`
says so.

Steps 1-3 happen once per kernel, device and operand types (the lowering is also cached
by ``jax.jit``); a call costs one host callback.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pallas._src import config
from pallas._src import jax_compat as jc
from pallas._src.dynamic_grid import check_dynamic_grid_support, check_dynamic_shapes_support
from pallas._src.emulation.device import EmulatedDevice
from pallas._src.interpreter.lowering import lower_with_interpreter
from pallas._src.jaxpr_util import remote_operations
from pallas._src.registry import registry
from pallas._src.registry.artifacts import cached_artifact
from pallas._src.registry.backend import LevelUnsupportedError
from pallas._src.registry.requests import KernelRequest

log = logging.getLogger("pallas.emulate")

# The GPU architectures Mosaic GPU compiles for (Hopper and Blackwell).
MOSAIC_GPU_TARGETS = ("sm_90a", "sm_100a")


class EmulationError(NotImplementedError):
    """A kernel cannot run on the emulated device (the message says what and why)."""


EmulationError.__module__ = "pallas"


@dataclasses.dataclass
class EmulatedKernel:
    """One kernel prepared for an emulated device: what was compiled and what runs.

    Attributes:
      name: the kernel's name.
      device: the emulated device.
      backend: the name of the backend that lowered it.
      compiled: what the backend's compiler returned (``None`` when skipped).
      compile_skipped: why the compile step was skipped (``""`` when it ran).
      run: the executor plan: ``run(*operands) -> outputs``; ``None`` for a kernel that
        addresses other devices, which the interpreter runs (see ``executor``).
      calls: how many times the executor ran it.
      executor: what executes it: the backend's executor of the generated code, or the
        core interpreter (for a kernel that addresses other devices).
    """

    name: str
    device: EmulatedDevice
    backend: str
    compiled: Any
    compile_skipped: str
    run: Callable[..., Any] | None
    calls: int = 0
    executor: str = ""


_cache: dict = {}
_lock = threading.Lock()
_CACHE_SIZE = 512


def emulated_kernels() -> list[EmulatedKernel]:
    """The kernels prepared for emulated devices in this process, oldest first."""
    with _lock:
        return [k for _, k in _cache.values()]


def clear_cache() -> None:
    """Forgets every prepared kernel (the next call compiles and plans again)."""
    with _lock:
        _cache.clear()


# ------------------------------------------------------------------------------------
# Choosing the backend, as on the device's platform.


def backend_for(dev: EmulatedDevice, backend: str | None = None,
                compiler_params: Any = None):
    """The backend that runs a kernel on ``dev``: ``backend=``, the compiler params'
    type, ``PALLAS_BACKEND_<PLATFORM>``, and then the platform's default (for ``cuda``,
    upstream's ``jax_pallas_use_mosaic_gpu`` flag picks Mosaic GPU or Triton; Mosaic
    GPU only targets sm_90a and sm_100a, so an sm_80 device defaults to Triton)."""
    explicit = registry.requested_backend(backend, compiler_params)
    if explicit is None and dev.platform == "cuda" and not _env_backend(dev.platform):
        import jax

        use_mgpu = bool(jax.config.jax_pallas_use_mosaic_gpu)
        explicit = ("mosaic_gpu" if use_mgpu and dev.target in MOSAIC_GPU_TARGETS
                    else "triton")
    if explicit is not None:
        b = registry.get_backend(explicit)
        if dev.platform not in b.platforms:
            raise ValueError(
                f"Pallas backend {b.name!r} lowers for {', '.join(b.platforms)}; it does "
                f"not run on the emulated device {dev} (platform {dev.platform!r}). Emulate "
                f"a {'/'.join(p for p in b.platforms if p != 'cpu')} device, or leave out "
                f"backend=/compiler_params")
        if b.name == "mosaic_gpu" and dev.target not in MOSAIC_GPU_TARGETS:
            raise ValueError(
                f"Mosaic GPU compiles for {', '.join(MOSAIC_GPU_TARGETS)}, not for the "
                f"emulated device {dev} ({dev.device_kind}); use the Triton backend "
                f"(pltriton.CompilerParams) or emulate cuda:sm_90a")
        return b
    return registry.select_backend(dev.platform, None, None)


def _env_backend(platform: str) -> str | None:
    import os

    return os.environ.get(registry.env_var(platform)) or None


# ------------------------------------------------------------------------------------
# Preparing a kernel: compile, then plan.


def _compile(b, request: KernelRequest, dev: EmulatedDevice) -> tuple[Any, str]:
    """``(compiled, "")``, or ``(None, reason)`` when the step cannot run here."""
    if "compile" not in b.levels:
        return None, (f"backend {b.name!r} provides no compile level on this machine, so "
                      f"the kernel was not compiled for {dev}")
    try:
        return b.compile(request), ""
    except LevelUnsupportedError as e:
        return None, f"backend {b.name!r} cannot compile this kernel here: {e}"
    except ImportError as e:
        return None, f"the compiler of backend {b.name!r} is not installed: {e}"


def prepare(dev: EmulatedDevice, b, request: KernelRequest) -> EmulatedKernel:
    """Compiles ``request`` for ``dev`` and builds its executor plan (cached)."""
    key = (dev.spec, b.name, _structural(request.jaxpr), _grid_key(request.grid_mapping),
           _hashable(request.compiler_params), request.name, request.out_avals,
           request.debug, config.enable_poison_buffers.value,
           config.enable_debug_checks.value)  # switches a lowering reads
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit[1]
    remote = remote_operations(request.jaxpr)
    if remote:
        # Its device ids and mesh axes exist only within its shard_map program; the
        # compile step compiles a kernel alone.
        compiled, skipped = None, (
            "the kernel addresses other devices, so it is compiled only within its "
            "shard_map program, not alone")
    else:
        compiled, skipped = _compile(b, request, dev)
    if skipped:
        log.info("pallas_call %s on %s: compile step skipped: %s", request.name, dev, skipped)
    if remote:
        # The executors run one device's code; an interpret mode runs every device's.
        mode = b.device_interpret_mode()
        runner = (f"{b.name}'s interpret mode ({type(mode).__qualname__})" if mode is not None
                  else "the core interpreter")
        run, executor = None, (
            f"{runner} (the kernel addresses other devices: "
            f"{', '.join(sorted(set(remote)))} with a device_id)")
    else:
        run, executor = b.emulator(request), f"the {b.name} executor"
    kernel = EmulatedKernel(request.name, dev, b.name, compiled, skipped, run,
                            executor=executor)
    with _lock:
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = (request, kernel)
    return kernel


def _structural(jaxpr) -> tuple:
    """A key equal for equal kernels: a ``pallas_call`` built anew on every call (as
    upstream code often does) traces a new but equal jaxpr."""
    consts = tuple(repr(c) for c in getattr(jaxpr, "consts", ()))
    return str(jaxpr), consts


def _grid_key(value) -> Any:
    """A key of a grid mapping with every field, index maps included (kernels that
    differ only in an index map are different kernels; the mapping's repr omits them)."""
    if hasattr(value, "jaxpr") and hasattr(value, "consts"):
        return _structural(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(
            _grid_key(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (tuple, list)):
        return tuple(_grid_key(v) for v in value)
    return _hashable(value)


def _hashable(x):
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


# ------------------------------------------------------------------------------------
# The lowering.


def lower_emulated(ctx, *in_nodes, dev: EmulatedDevice, jaxpr, grid_mapping, name,
                   compiler_params, cost_estimate, metadata, backend, out_avals,
                   debug=False):
    """Lowers one ``pallas_call`` for ``cpu`` as a host callback running the code
    generated for ``dev``."""
    b = backend_for(dev, backend, compiler_params)
    if grid_mapping.num_dynamic_grid_bounds:
        check_dynamic_grid_support(b, grid_mapping, name)
    check_dynamic_shapes_support(b, grid_mapping, name)
    request = KernelRequest(
        jaxpr=jaxpr, grid_mapping=grid_mapping,
        compiler_params=registry.resolve_compiler_params(b, compiler_params),
        name=name, out_avals=tuple(out_avals), cost_estimate=cost_estimate,
        metadata=metadata, options=dev.compile_options(), debug=bool(debug))
    request = dataclasses.replace(request, artifact=cached_artifact(b, request))
    if "emulate" not in b.levels and not remote_operations(jaxpr):
        # Lowered above and compiled here first, so that what the device's toolchain
        # rejects is raised as on the device; only then is the missing executor named.
        # (A kernel addressing other devices needs no executor: an interpreter runs it.)
        _, skipped = _compile(b, request, dev)
        done = "lowered" if skipped else "lowered and compiled"
        raise EmulationError(
            f"pallas_call {name} on the emulated device {dev}: backend {b.name!r} has no "
            f"executor of its generated code (no emulate level), so it cannot run on an "
            f"emulated device (it was {done} for {dev}); run it with interpret=True (the "
            f"interpreter, with the backend's primitive rules)")
    kernel = prepare(dev, b, request)
    if kernel.run is None:
        mode = b.device_interpret_mode()
        if mode is not None:
            return mode.lower_pallas_call(ctx, *in_nodes, jaxpr=jaxpr,
                                          grid_mapping=grid_mapping,
                                          compiler_params=request.compiler_params, name=name)
        return lower_with_interpreter(ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping)
    # A typed PRNG key crosses the callback as its key data.
    out_types = [(tuple(a.shape), np.dtype(a.dtype))
                 for a in (jc.core.physical_aval(a) for a in out_avals)]

    def run(*operands):
        kernel.calls += 1
        outs = kernel.run(*operands)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        if len(outs) != len(out_types):
            raise RuntimeError(f"the {b.name} executor returned {len(outs)} outputs for "
                               f"pallas_call {name}, which has {len(out_types)}")
        return tuple(np.asarray(o).astype(dt, copy=False).reshape(shape)
                     for o, (shape, dt) in zip(outs, out_types))

    results = jc.emit_host_callback(ctx, run, in_nodes)
    if ctx.tokens_in is not None and ctx.tokens_out is None:
        ctx.set_tokens_out(ctx.tokens_in)
    return results
