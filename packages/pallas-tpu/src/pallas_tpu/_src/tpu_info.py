"""What a TPU chip has: cores, lanes, MXUs, memory sizes and peak rates.

Figures are the public ones (Google Cloud TPU documentation and the chips' published
specifications). Per-TensorCore sizes (VMEM, SMEM) are per core; HBM and peak rates are
per chip. Fields with no public figure are marked as such in ``TpuInfo.notes``.
"""

from __future__ import annotations

import dataclasses
import enum

import jax

MiB = 1 << 20
GiB = 1 << 30


class ChipVersion(enum.Enum):
    """TPU chip generations."""

    TPU_V2 = "v2"
    TPU_V3 = "v3"
    TPU_V4I = "v4i"
    TPU_V4 = "v4"
    TPU_V5E = "v5e"
    TPU_V5P = "v5p"
    TPU_V6E = "v6e"
    TPU_7X = "7x"

    def __str__(self) -> str:
        return self.value


ChipVersionBase = ChipVersion


@dataclasses.dataclass(frozen=True, kw_only=True)
class TpuInfo:
    """Hardware facts of one TPU chip, as a kernel author needs them."""

    chip_version: ChipVersion
    generation: int
    num_cores: int  # TensorCores per logical device
    num_lanes: int
    num_sublanes: int
    mxu_column_size: int
    num_mxus: int  # per TensorCore
    num_accumulators: int
    vmem_capacity_bytes: int  # per TensorCore
    cmem_capacity_bytes: int
    smem_capacity_bytes: int
    hbm_capacity_bytes: int  # per chip
    mem_bw_bytes_per_second: int
    bf16_ops_per_second: int
    int8_ops_per_second: int
    fp8_ops_per_second: int
    int4_ops_per_second: int
    notes: str = ""

    @property
    def is_megacore(self) -> bool:
        return self.num_cores > 1

    def is_lite(self) -> bool:
        return self.chip_version in (ChipVersion.TPU_V5E, ChipVersion.TPU_V6E,
                                     ChipVersion.TPU_V4I)

    @property
    def vreg_shape(self) -> tuple[int, int]:
        """The (sublanes, lanes) tile of one 32-bit vector register."""
        return (self.num_sublanes, self.num_lanes)

    def min_tile(self, dtype) -> tuple[int, int]:
        """The smallest natively tiled (sublanes, lanes) block for ``dtype``."""
        import numpy as np

        packing = max(1, 4 // np.dtype(dtype).itemsize)
        return (self.num_sublanes * packing, self.num_lanes)


T = 10**12
_TC_COMMON = dict(num_lanes=128, num_sublanes=8)

# chip -> (generation, TensorCores per chip, per-chip figures)
_CHIPS: dict[ChipVersion, dict] = {
    # TPU v4: 2 TensorCores (megacore), 4 MXUs of 128x128 each, 32 GiB HBM2 at
    # 1200 GB/s, 275 TFLOP/s bf16 and int8 ops, 128 MiB CMEM; 16 MiB VMEM per core.
    ChipVersion.TPU_V4: dict(
        generation=4, cores_per_chip=2, mxu_column_size=128, num_mxus=4,
        vmem_capacity_bytes=16 * MiB, cmem_capacity_bytes=128 * MiB,
        smem_capacity_bytes=1 * MiB, hbm_capacity_bytes=32 * GiB,
        mem_bw_bytes_per_second=1200 * 10**9, bf16_ops_per_second=275 * T,
        int8_ops_per_second=275 * T, fp8_ops_per_second=0, int4_ops_per_second=0,
    ),
    # TPU v5e: 1 TensorCore, 4 MXUs of 128x128, 16 GiB HBM2e at 819 GB/s,
    # 197 TFLOP/s bf16, 394 TOP/s int8; 128 MiB VMEM.
    ChipVersion.TPU_V5E: dict(
        generation=5, cores_per_chip=1, mxu_column_size=128, num_mxus=4,
        vmem_capacity_bytes=128 * MiB, cmem_capacity_bytes=0,
        smem_capacity_bytes=1 * MiB, hbm_capacity_bytes=16 * GiB,
        mem_bw_bytes_per_second=819 * 10**9, bf16_ops_per_second=197 * T,
        int8_ops_per_second=394 * T, fp8_ops_per_second=0, int4_ops_per_second=788 * T,
    ),
    # TPU v5p: 2 TensorCores (megacore), 4 MXUs of 128x128 each, 95 GiB HBM2e at
    # 2765 GB/s, 459 TFLOP/s bf16, 918 TOP/s int8; 95 MiB VMEM per core.
    ChipVersion.TPU_V5P: dict(
        generation=5, cores_per_chip=2, mxu_column_size=128, num_mxus=4,
        vmem_capacity_bytes=95 * MiB, cmem_capacity_bytes=0,
        smem_capacity_bytes=1 * MiB, hbm_capacity_bytes=95 * GiB,
        mem_bw_bytes_per_second=2765 * 10**9, bf16_ops_per_second=459 * T,
        int8_ops_per_second=918 * T, fp8_ops_per_second=0, int4_ops_per_second=0,
    ),
    # TPU v6e (Trillium): 1 TensorCore, 2 MXUs of 256x256, 32 GiB HBM at 1640 GB/s,
    # 918 TFLOP/s bf16, 1836 TOP/s int8; 128 MiB VMEM.
    ChipVersion.TPU_V6E: dict(
        generation=6, cores_per_chip=1, mxu_column_size=256, num_mxus=2,
        vmem_capacity_bytes=128 * MiB, cmem_capacity_bytes=0,
        smem_capacity_bytes=1 * MiB, hbm_capacity_bytes=32 * GiB,
        mem_bw_bytes_per_second=1640 * 10**9, bf16_ops_per_second=918 * T,
        int8_ops_per_second=1836 * T, fp8_ops_per_second=0, int4_ops_per_second=0,
    ),
    # TPU7x (Ironwood): 2 TensorCores per chip, MXUs of 256x256, 192 GiB HBM3e at
    # 7.37 TB/s, 4614 TFLOP/s fp8 (2307 bf16); 64 MiB VMEM per core.
    ChipVersion.TPU_7X: dict(
        generation=7, cores_per_chip=2, mxu_column_size=256, num_mxus=2,
        vmem_capacity_bytes=64 * MiB, cmem_capacity_bytes=0,
        smem_capacity_bytes=1 * MiB, hbm_capacity_bytes=192 * GiB,
        mem_bw_bytes_per_second=7370 * 10**9, bf16_ops_per_second=2307 * T,
        int8_ops_per_second=0, fp8_ops_per_second=4614 * T, int4_ops_per_second=0,
    ),
}

_NOTES = ("HBM sizes, HBM bandwidth and peak rates are Google's published per-chip "
          "figures. VMEM is per TensorCore; v4 and v5e VMEM are published, the v5p, v6e "
          "and 7x values are the commonly cited ones (not officially published). "
          "smem_capacity_bytes and num_accumulators have no published figure; the values "
          "given are conservative. A rate of 0 means not supported natively.")


def get_tpu_info_for_chip(chip_version: ChipVersion,
                          num_tensor_cores_per_logical_device: int) -> TpuInfo:
    """The :class:`TpuInfo` of ``chip_version`` when a logical device has that many cores."""
    chip_version = ChipVersion(chip_version)
    if chip_version not in _CHIPS:
        known = ", ".join(str(c) for c in _CHIPS)
        raise ValueError(f"no TPU figures for chip {chip_version}; known chips: {known}")
    d = dict(_CHIPS[chip_version])
    per_chip = d.pop("cores_per_chip")
    n = int(num_tensor_cores_per_logical_device)
    if not 1 <= n <= per_chip:
        raise ValueError(
            f"TPU {chip_version} has {per_chip} TensorCore(s) per chip; "
            f"num_tensor_cores_per_logical_device={n} is not possible"
        )
    return TpuInfo(chip_version=chip_version, num_cores=n, num_accumulators=d["num_mxus"],
                   notes=_NOTES, **_TC_COMMON, **d)


_KIND_TO_CHIP = (
    ("7x", ChipVersion.TPU_7X), ("v7", ChipVersion.TPU_7X), ("ironwood", ChipVersion.TPU_7X),
    ("v6", ChipVersion.TPU_V6E), ("v5 lite", ChipVersion.TPU_V5E),
    ("v5e", ChipVersion.TPU_V5E), ("v5p", ChipVersion.TPU_V5P), ("v5", ChipVersion.TPU_V5P),
    ("v4", ChipVersion.TPU_V4),
)


def chip_version_from_device_kind(kind: str) -> ChipVersion:
    k = kind.lower()
    for key, chip in _KIND_TO_CHIP:
        if key in k:
            return chip
    raise ValueError(f"unknown TPU device kind {kind!r}")


def is_tpu_device() -> bool:
    """True when JAX's default backend is a TPU."""
    try:
        return jax.devices()[0].platform == "tpu"
    except RuntimeError:
        return False


def get_tpu_info() -> TpuInfo:
    """The :class:`TpuInfo` of the TPU JAX is running on (raises on other platforms)."""
    if not is_tpu_device():
        raise RuntimeError(
            "get_tpu_info() needs a TPU device (JAX's default backend is "
            f"{jax.default_backend()!r}); use pltpu.get_tpu_info_for_chip(chip, cores) "
            "to look up a chip's figures elsewhere"
        )
    dev = jax.devices()[0]
    chip = chip_version_from_device_kind(dev.device_kind)
    cores = getattr(dev, "num_cores", None) or 1
    return get_tpu_info_for_chip(chip, min(int(cores), _CHIPS[chip]["cores_per_chip"]))
