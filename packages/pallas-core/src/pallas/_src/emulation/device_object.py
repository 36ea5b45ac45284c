"""The per-device figures kernels read from ``jax.Device`` itself, answered for the
emulated device on a CPU host.

Kernels size themselves from the device object: upstream's Mosaic GPU matmuls ask
``jax.devices()[0].core_count`` (the GPU's number of SMs), TPU kernels
``jax.devices()[0].num_cores`` (TensorCores per device). A CPU device has neither
attribute. While a device is emulated, a CPU device answers them for it; otherwise
(and on real TPU and GPU devices, always) the attribute is looked up as jaxlib does,
so nothing changes outside emulation.
"""

from __future__ import annotations

import jax

from pallas._src.emulation.device import emulated_device

# Each attribute, and the platforms of the emulated devices that have it.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "core_count": ("cuda", "rocm"),  # SMs (NVIDIA) or compute units (AMD)
    "num_cores": ("tpu",),  # TensorCores per logical TPU device
}


def _answer(name: str, platforms: tuple[str, ...]) -> property:
    def get(device: jax.Device) -> int:
        dev = emulated_device()
        if dev is None or dev.platform not in platforms or device.platform != "cpu":
            # Not ours to answer: jaxlib's own lookup (the device's attributes) runs,
            # and raises AttributeError where the device has no such attribute.
            raise AttributeError(name)
        return dev.num_cores

    get.__name__ = name
    get.__doc__ = (f"``{name}`` of the emulated device (pallas) on a CPU device; "
                   "jaxlib's device attribute otherwise.")
    return property(get)


def install() -> None:
    """Gives ``jax.Device`` the attributes in :data:`ATTRIBUTES` (idempotent); a class
    attribute that jaxlib itself defines is left alone."""
    for name, platforms in ATTRIBUTES.items():
        current = jax.Device.__dict__.get(name)
        if current is None:
            setattr(jax.Device, name, _answer(name, platforms))
