"""``pltpu.tpu_info``: what a TPU chip has (cores, memories, SparseCores), as one module.

The same names as upstream's ``jax._src.pallas.mosaic.tpu_info`` keeps for them:
``is_tpu_device()``, ``get_tpu_info()`` (the attached chip), ``get_tpu_info_for_chip``,
``ChipVersion``, ``TpuInfo``, ``SparseCoreInfo``, ``chip_version_from_device_kind``.
"""

from pallas_tpu._src.tpu_info import (
    ChipVersion,
    ChipVersionBase,
    SparseCoreInfo,
    TpuInfo,
    chip_version_from_device_kind,
    get_tpu_info,
    get_tpu_info_for_chip,
    is_tpu_device,
)

__all__ = [
    "ChipVersion", "ChipVersionBase", "SparseCoreInfo", "TpuInfo",
    "chip_version_from_device_kind", "get_tpu_info", "get_tpu_info_for_chip", "is_tpu_device",
]
