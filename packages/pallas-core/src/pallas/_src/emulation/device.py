"""Emulated devices: which TPU or GPU a CPU host stands in for.

``PALLAS_EMULATE_DEVICE=tpu:v5e`` (or ``with pl.emulate_device("cuda:sm_90a"):``, or
``"rocm:gfx942"`` for an AMD MI300) makes
every ``pallas_call``/``pl.kernel`` that is not in interpret mode run as on that device:
lowered for its platform, compiled by the real compiler where it is installed, and
executed by the backend's executor of the generated code (see ``emulation.call``).

The current device lives in a JAX configuration state, part of the jit key and of the
trace context: a function traced under one emulated device (or none) is traced again
under another. Device queries (``pltpu.get_tpu_info()``, ``plsc.get_sparse_core_info()``,
the GPU's compute capability) read :func:`emulated_device`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator

from pallas._src import jax_compat as jc

ENV_VAR = "PALLAS_EMULATE_DEVICE"


@dataclasses.dataclass(frozen=True)
class EmulatedDevice:
    """One emulated TPU or GPU, with the figures device queries answer for it.

    Attributes:
      spec: as written, canonical (``"tpu:v5e"``, ``"cuda:sm_90a"``, ``"rocm:gfx942"``).
      platform: the JAX platform kernels are lowered for (``"tpu"``, ``"cuda"`` or
        ``"rocm"``).
      target: the chip (``"v5e"``, ``"7x"``) or the GPU architecture (``"sm_90a"``,
        ``"gfx942"``).
      device_kind: what ``jax.Device.device_kind`` says on that device.
      num_cores: TensorCores per logical TPU device (2 on megacore chips); for a GPU,
        its number of SMs (NVIDIA) or compute units (AMD).
      compute_capability: ``(major, minor)`` of an NVIDIA GPU; ``None`` for a TPU or
        an AMD GPU (named by its ``gfx`` architecture, ``target``).
      smem_bytes_per_block: the most shared memory one CUDA block may opt into (an AMD
        workgroup's LDS); 0 for a TPU (``pltpu.get_tpu_info()`` has the TPU's memories).
    """

    spec: str
    platform: str
    target: str
    device_kind: str
    num_cores: int
    compute_capability: tuple[int, int] | None = None
    smem_bytes_per_block: int = 0

    @property
    def sm_count(self) -> int:
        """A GPU's number of streaming multiprocessors (compute units on AMD; 0 for a
        TPU)."""
        return self.num_cores if self.platform in ("cuda", "rocm") else 0

    def compile_options(self) -> dict:
        """The ``KernelRequest.options`` a backend's ``compile`` receives: ``chip`` for a
        TPU; ``target`` and ``compute_capability`` (``major * 10 + minor``) for an NVIDIA
        GPU; ``platform`` and ``target`` (the ``gfx`` architecture) for an AMD GPU."""
        if self.platform == "tpu":
            return {"chip": self.target, "target": self.target}
        if self.platform == "rocm":
            return {"platform": "rocm", "target": self.target}
        major, minor = self.compute_capability or (0, 0)
        return {"target": self.target, "compute_capability": major * 10 + minor}

    def __str__(self) -> str:
        return self.spec


DEVICES: dict[str, EmulatedDevice] = {d.spec: d for d in (
    EmulatedDevice("tpu:v4", "tpu", "v4", "TPU v4", 2),
    EmulatedDevice("tpu:v5e", "tpu", "v5e", "TPU v5 lite", 1),
    EmulatedDevice("tpu:v5p", "tpu", "v5p", "TPU v5", 2),
    EmulatedDevice("tpu:v6e", "tpu", "v6e", "TPU v6 lite", 1),
    EmulatedDevice("tpu:7x", "tpu", "7x", "TPU7x", 1),
    EmulatedDevice("cuda:sm_80", "cuda", "sm_80", "NVIDIA A100-SXM4-80GB", 108, (8, 0),
                   166912),
    EmulatedDevice("cuda:sm_90a", "cuda", "sm_90a", "NVIDIA H100 80GB HBM3", 132, (9, 0),
                   232448),
    EmulatedDevice("cuda:sm_100a", "cuda", "sm_100a", "NVIDIA B200", 148, (10, 0), 232448),
    # MI300X: 304 compute units, 64 KiB of LDS per workgroup.
    EmulatedDevice("rocm:gfx942", "rocm", "gfx942", "AMD Instinct MI300X", 304, None, 65536),
)}


@functools.cache
def parse(spec: str, origin: str = "emulate_device") -> EmulatedDevice:
    """The :class:`EmulatedDevice` named ``spec`` (case and blanks ignored); a
    ``ValueError`` naming ``origin`` and listing the valid values otherwise."""
    key = str(spec).strip().lower()
    if key in DEVICES:
        return DEVICES[key]
    raise ValueError(
        f"{origin}: {spec!r} is not an emulated device; valid values are "
        f"{', '.join(DEVICES)} (platform:chip for a TPU, platform:architecture for a GPU)")


_state = jc.config.string_or_object_state(
    name="pallas_emulate_device", default=os.environ.get(ENV_VAR) or None,
    help="The TPU or GPU that Pallas kernels not in interpret mode run as, on a CPU host "
         f"(e.g. 'tpu:v5e', 'cuda:sm_90a'); also set by {ENV_VAR}.",
    include_in_jit_key=True, include_in_trace_context=True)


def emulated_device() -> EmulatedDevice | None:
    """The device being emulated now (:func:`emulate_device` or ``PALLAS_EMULATE_DEVICE``),
    or ``None``."""
    value = _state.value
    if not value:
        return None
    if isinstance(value, EmulatedDevice):
        return value
    origin = "emulate_device" if value != os.environ.get(ENV_VAR) else ENV_VAR
    return parse(value, origin)


def emulate_device(device: str | None) -> contextlib.AbstractContextManager:
    """Within the block, Pallas kernels run as on ``device`` (``"tpu:v5e"``,
    ``"cuda:sm_90a"``, ...; ``None`` turns emulation off): lowered for its platform,
    compiled by the real compiler where installed, executed by the backend's executor
    of the generated code. The context yields the :class:`EmulatedDevice`; an unknown
    ``device`` is a ``ValueError`` listing the valid ones, raised at once.

    Kernels with ``interpret=...`` still run in their interpreter.
    """
    dev = None if device is None else parse(device)
    return _emulating(dev)


@contextlib.contextmanager
def _emulating(dev: EmulatedDevice | None) -> Iterator[EmulatedDevice | None]:
    with _state(dev.spec if dev is not None else ""):
        yield dev
