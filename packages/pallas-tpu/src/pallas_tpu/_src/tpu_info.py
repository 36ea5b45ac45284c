"""What a TPU chip has: cores, lanes, MXUs, memory sizes, peak rates and native matmuls.

Every chip upstream knows is here, from TPU v2 to TPU 8i, with upstream's conventions so
that kernels sizing their blocks from these figures behave the same: all figures are
**per TensorCore** (a chip's HBM, bandwidth and peak rates divided by its physical
TensorCores); a figure with no public value is 0 ("not available").
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from pallas_tpu._src.enums import ValueStrEnum

MiB = 1 << 20
KiB = 1 << 10


class ChipVersionBase:
    """Base of chip-version enums (a third-party chip table may define its own)."""


class ChipVersion(ChipVersionBase, ValueStrEnum):
    """TPU chip generations, with the core layout each chip has."""

    TPU_V2 = "v2"
    TPU_V3 = "v3"
    TPU_V4I = "v4i"
    TPU_V4 = "v4"
    TPU_V5E = "v5e"
    TPU_V5P = "v5p"
    TPU_V6E = "v6e"
    TPU_7 = "7"
    TPU_7X = "7x"
    TPU_8I = "8i"

    @property
    def is_lite(self) -> bool:
        """Lite (inference) chips have one TensorCore."""
        return self in _LITE

    @property
    def num_physical_tensor_cores_per_chip(self) -> int:
        return 1 if self.is_lite else 2

    @property
    def supports_megacore(self) -> bool:
        """Whether both TensorCores can act as one logical device (v4, v5p)."""
        return self in (ChipVersion.TPU_V4, ChipVersion.TPU_V5P)


_LITE = frozenset({ChipVersion.TPU_V4I, ChipVersion.TPU_V5E, ChipVersion.TPU_V6E})


@dataclasses.dataclass(frozen=True, kw_only=True)
class SparseCoreInfo:
    """The SparseCores of a chip (absent before v5p)."""

    num_cores: int
    num_subcores: int
    num_lanes: int
    vmem_capacity_bytes: int  # per vector subcore
    dma_granule_size_bytes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class TpuInfo:
    """Hardware facts of one TPU TensorCore, as a kernel author needs them.

    Figures are per TensorCore: multiply by ``num_cores`` for a logical device.
    """

    chip_version: ChipVersionBase
    generation: int
    num_cores: int  # TensorCores per logical device
    num_lanes: int
    num_sublanes: int
    mxu_column_size: int
    num_mxus: int  # per TensorCore
    num_accumulators: int  # (sublanes, mxu_column_size) 32-bit buffers per MXU; 0 = unknown
    vmem_capacity_bytes: int
    cmem_capacity_bytes: int
    smem_capacity_bytes: int
    hbm_capacity_bytes: int
    mem_bw_bytes_per_second: int
    bf16_ops_per_second: int
    int8_ops_per_second: int
    fp8_ops_per_second: int
    int4_ops_per_second: int
    sparse_core: SparseCoreInfo | None = None

    @property
    def is_lite(self) -> bool:
        return self.chip_version.is_lite

    @property
    def is_megacore(self) -> bool:
        """Both physical TensorCores act as one logical device."""
        return self.num_cores > 1

    @property
    def is_split_chip(self) -> bool:
        """A two-core chip used one core per logical device."""
        return self.num_cores == 1 and self.chip_version.num_physical_tensor_cores_per_chip > 1

    @property
    def vreg_shape(self) -> tuple[int, int]:
        """The (sublanes, lanes) tile of one 32-bit vector register."""
        return (self.num_sublanes, self.num_lanes)

    def min_tile(self, dtype) -> tuple[int, int]:
        """The smallest natively tiled (sublanes, lanes) block for ``dtype``."""
        packing = max(1, 4 // np.dtype(dtype).itemsize)
        return (self.num_sublanes * packing, self.num_lanes)

    def is_matmul_supported(self, lhs_dtype, rhs_dtype) -> bool:
        """Whether the MXU multiplies these operand dtypes natively (without casting)."""
        lhs, rhs = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
        for lhs_set, rhs_set in _NATIVE_MATMULS.get(self.generation, ()):
            if lhs in lhs_set and rhs in rhs_set:
                return True
        return False

    def get_sublane_tiling(self, dtype) -> int:
        """The second-minor tile XLA uses for ``dtype`` by default (a heuristic: XLA flags
        change it). 16- and 32-bit types use plain sublanes before generation 7."""
        bits = 4 if np.dtype(dtype) in (_dt("int4"), _dt("uint4")) else 8 * np.dtype(dtype).itemsize
        if self.generation < 7:
            return self.num_sublanes if bits in (16, 32) else self.num_sublanes * (32 // bits)
        if self.generation == 7:
            return self.num_sublanes * (32 // bits)
        raise NotImplementedError(
            f"sublane tiling of TPU generation {self.generation} is not known")


def _dt(name: str) -> np.dtype:
    return np.dtype(getattr(jax.numpy, name))


def _native_matmuls() -> dict[int, tuple]:
    f32, bf16, s8, u8 = _dt("float32"), _dt("bfloat16"), _dt("int8"), _dt("uint8")
    s4, u4 = _dt("int4"), _dt("uint4")
    e5m2, e4m3fn, e4m3b11 = _dt("float8_e5m2"), _dt("float8_e4m3fn"), _dt("float8_e4m3b11fnuz")
    floats56 = {f32, bf16, e5m2, e4m3b11}
    gen7 = (({f32, bf16}, {f32, bf16}), ({f32, bf16, e5m2, e4m3fn}, {e5m2, e4m3fn}))
    return {
        2: (({f32}, {f32}),),
        3: (({f32}, {f32}),),
        4: (({f32, bf16}, {f32, bf16, s8}),),
        5: ((floats56, floats56), ({u8, s8}, {u8, s8}), ({u4, s4}, {u4, s4})),
        6: ((floats56, floats56), ({u8, s8}, {u8, s8}), ({u4, s4}, {u4, s4})),
        7: gen7,
        8: gen7,
    }


_NATIVE_MATMULS = _native_matmuls()

# Per chip: generation, MXU width and count, accumulators, per-core VMEM/SMEM, per-chip
# CMEM, HBM, bandwidth, bf16/int8/fp8/int4 peak rates (0: not available), SparseCores.
_SC_V5P = SparseCoreInfo(num_cores=4, num_subcores=16, num_lanes=8,
                         vmem_capacity_bytes=512 * KiB, dma_granule_size_bytes=32)
_SC_V6E = SparseCoreInfo(num_cores=2, num_subcores=16, num_lanes=8,
                         vmem_capacity_bytes=256 * KiB, dma_granule_size_bytes=32)
_SC_7 = SparseCoreInfo(num_cores=2, num_subcores=16, num_lanes=16,
                       vmem_capacity_bytes=512 * KiB, dma_granule_size_bytes=32)
_SC_8I = SparseCoreInfo(num_cores=1, num_subcores=4, num_lanes=16,
                        vmem_capacity_bytes=512 * KiB, dma_granule_size_bytes=64)
_TPU_7 = (7, 256, 2, 128, 64 * MiB, MiB, 0, 206_000_000_000, 7.40e12,
          2.31e15, 0, 4.60e15, 0, _SC_7)
_CHIPS: dict[ChipVersion, tuple] = {
    #                   gen mxu n acc vmem      smem       cmem         hbm      bw
    #                   bf16     int8     fp8      int4     sparse core
    ChipVersion.TPU_V2: (2, 128, 1, 0, 16 * MiB, 16 * KiB, 0, 16_000_000_000, 7.16e11,
                         4.6e13, 0, 0, 0, None),
    ChipVersion.TPU_V3: (3, 128, 2, 0, 16 * MiB, 16 * KiB, 0, 34_400_000_000, 8.25e11,
                         1.40e14, 0, 0, 0, None),
    ChipVersion.TPU_V4I: (4, 128, 4, 0, 16 * MiB, MiB, 134_000_000, 8_590_000_000, 6.14e11,
                          1.37e14, 0, 0, 0, None),
    ChipVersion.TPU_V4: (4, 128, 4, 0, 16 * MiB, MiB, 134_000_000, 34_400_000_000, 1.23e12,
                         2.75e14, 0, 0, 0, None),
    ChipVersion.TPU_V5E: (5, 128, 4, 0, 128 * MiB, MiB, 0, 17_200_000_000, 8.20e11,
                          1.97e14, 3.94e14, 0, 7.88e14, None),
    ChipVersion.TPU_V5P: (5, 128, 4, 0, 64 * MiB, MiB, 0, 103_000_000_000, 2.46e12,
                          4.59e14, 9.18e14, 0, 1.84e15, _SC_V5P),
    ChipVersion.TPU_V6E: (6, 256, 2, 0, 128 * MiB, MiB, 0, 34_400_000_000, 1.64e12,
                          9.20e14, 1.84e15, 9.20e14, 3.68e15, _SC_V6E),
    ChipVersion.TPU_7: _TPU_7,
    ChipVersion.TPU_7X: _TPU_7,  # one chip, two device kinds ("TPU7", "TPU7x")
    ChipVersion.TPU_8I: (8, 256, 2, 256, 192 * MiB, MiB, 0, 309_000_000_000, 8.60e12,
                         1.101e15, 0, 8.808e15, 0, _SC_8I),
}


def get_tpu_info_for_chip(chip_version: ChipVersion,
                          num_tensor_cores_per_logical_device: int) -> TpuInfo:
    """The :class:`TpuInfo` of ``chip_version`` when a logical device has that many cores.

    Megacore chips (v4, v5p) take 1 (split) or 2 (megacore); every other chip takes 1.
    """
    chip = ChipVersion(chip_version)
    n = num_tensor_cores_per_logical_device
    if not chip.supports_megacore and n != 1:
        raise ValueError(
            "Lite chips and dual-core chips that do not support Megacore must have "
            f"num_tensor_cores_per_logical_device=1, but got {n} (TPU {chip}; only "
            "v4 and v5p take 2)."
        )
    if n not in (1, 2):
        raise ValueError(f"TPU {chip}: num_tensor_cores_per_logical_device must be 1 or 2, "
                         f"got {n}")
    (gen, mxu, num_mxus, acc, vmem, smem, cmem, hbm, bw, bf16, int8, fp8, int4,
     sc) = _CHIPS[chip]
    per_core = chip.num_physical_tensor_cores_per_chip
    return TpuInfo(
        chip_version=chip, generation=gen, num_cores=n, num_lanes=128, num_sublanes=8,
        mxu_column_size=mxu, num_mxus=num_mxus, num_accumulators=acc,
        vmem_capacity_bytes=vmem, smem_capacity_bytes=smem,
        cmem_capacity_bytes=cmem // per_core, hbm_capacity_bytes=hbm // per_core,
        mem_bw_bytes_per_second=int(bw // per_core),
        bf16_ops_per_second=int(bf16 // per_core), int8_ops_per_second=int(int8 // per_core),
        fp8_ops_per_second=int(fp8 // per_core), int4_ops_per_second=int(int4 // per_core),
        sparse_core=sc,
    )


_KINDS = {
    "TPU v2": ChipVersion.TPU_V2, "TPU v3": ChipVersion.TPU_V3,
    "TPU v4": ChipVersion.TPU_V4, "TPU v4 lite": ChipVersion.TPU_V4I,
    "TPU v5e": ChipVersion.TPU_V5E, "TPU v5 lite": ChipVersion.TPU_V5E,
    "TPU v5": ChipVersion.TPU_V5P, "TPU v5p": ChipVersion.TPU_V5P,
    "TPU v6e": ChipVersion.TPU_V6E, "TPU v6 lite": ChipVersion.TPU_V6E,
    "TPU7": ChipVersion.TPU_7, "TPU7x": ChipVersion.TPU_7X, "TPU8i": ChipVersion.TPU_8I,
}


def chip_version_from_device_kind(kind: str) -> ChipVersion | None:
    """The chip of a JAX ``device_kind`` (``"TPU v5 lite"``, ``"TPU7x"``), or None."""
    return _KINDS.get(kind)


def _emulated_chip() -> ChipVersion | None:
    """The chip of the emulated TPU (``PALLAS_EMULATE_DEVICE=tpu:v5e``), else None."""
    from pallas.plugins import emulated_device

    dev = emulated_device()
    if dev is None or dev.platform != "tpu":
        return None
    return ChipVersion(dev.target)


def is_tpu_device() -> bool:
    """True when JAX's default device is a TPU chip this table knows, or a TPU is
    emulated."""
    if _emulated_chip() is not None:
        return True
    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return False
    return dev.platform == "tpu" and chip_version_from_device_kind(dev.device_kind) is not None


def get_tpu_info() -> TpuInfo:
    """The :class:`TpuInfo` of the TPU JAX is running on, or of the emulated TPU (a
    ValueError elsewhere)."""
    emulated = _emulated_chip()
    if emulated is not None:
        from pallas.plugins import emulated_device

        cores = emulated_device().num_cores if emulated.supports_megacore else 1
        return get_tpu_info_for_chip(emulated, cores)
    dev = jax.devices()[0]
    chip = chip_version_from_device_kind(dev.device_kind) if dev.platform == "tpu" else None
    if chip is None:
        raise ValueError(
            f"Unsupported TPU device kind: {dev.device_kind} (JAX's default backend is "
            f"{jax.default_backend()!r}); use pltpu.get_tpu_info_for_chip(chip, cores) "
            "to look up a chip's figures elsewhere"
        )
    cores = getattr(dev, "num_cores", None) or 1
    return get_tpu_info_for_chip(chip, int(cores) if chip.supports_megacore else 1)
