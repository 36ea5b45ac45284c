"""The GPUs pallas-triton compiles for: NVIDIA by compute capability, AMD by ``gfx`` name.

An AMD target is chosen by ``CompilerParams.rocm_arch``, else the
``PALLAS_TRITON_ROCM_ARCH`` environment variable, else :data:`DEFAULT_ROCM_ARCH`
(gfx942, MI300). What each AMD target has (wavefront size, matrix unit, the dot input
types it multiplies natively, TF32, LDS) is in :data:`AMD_TARGETS`, checked against what
``triton.compile`` emits for it (``benchmarks/triton_codegen.py``, the tests).
"""

from __future__ import annotations

import dataclasses
import os

from pallas import plugins
from pallas_triton._src.codegen import TritonLoweringError

ENV_ROCM_ARCH = "PALLAS_TRITON_ROCM_ARCH"
DEFAULT_ROCM_ARCH = "gfx942"


@dataclasses.dataclass(frozen=True)
class AMDTarget:
    """One AMD GPU architecture as Triton 3.9 compiles for it.

    Attributes:
      arch: the LLVM processor name (``"gfx942"``).
      family: ``"CDNA2"``, ``"CDNA3"``, ``"CDNA4"`` (Instinct) or ``"RDNA3"`` (Radeon).
      gpus: examples of GPUs with this architecture.
      warp_size: threads per wavefront (64 on CDNA, 32 on RDNA); a program of
        ``num_warps`` warps has ``num_warps * warp_size`` threads.
      matrix_unit: ``"MFMA"`` (CDNA) or ``"WMMA"`` (RDNA3).
      matrix_dtypes: dot operand types the matrix unit multiplies natively, with the
        instruction Triton selects for a 32x32 (MFMA) or 16x16 (WMMA) f32/i32 tile.
      emulated_dtypes: dot operand types Triton first converts (fp8 -> f16 on the
        unit; f32/f64 on RDNA3 -> FMA on the vector ALUs): correct, not native speed.
      tf32: whether f32 dots at DEFAULT precision may use TF32 (CDNA3's ``xf32``);
        elsewhere they are exact f32 (``input_precision="ieee"``), which DEFAULT allows.
      lds_bytes: LDS (shared memory) per workgroup.
    """

    arch: str
    family: str
    gpus: str
    warp_size: int
    matrix_unit: str
    matrix_dtypes: dict
    emulated_dtypes: tuple[str, ...]
    tf32: bool
    lds_bytes: int

    @property
    def platform(self) -> str:
        return "rocm"


AMD_TARGETS: dict[str, AMDTarget] = {t.arch: t for t in [
    AMDTarget(
        "gfx90a", "CDNA2", "MI200 (MI210, MI250, MI250X)", 64, "MFMA",
        {"float16": "v_mfma_f32_32x32x8f16", "bfloat16": "v_mfma_f32_32x32x8bf16_1k",
         "float32": "v_mfma_f32_32x32x2f32", "int8": "v_mfma_i32_32x32x8i8",
         "float64": "v_mfma_f64_16x16x4f64"},
        ("float8_e4m3fn", "float8_e5m2"), tf32=False, lds_bytes=65536),
    AMDTarget(
        "gfx942", "CDNA3", "MI300X, MI300A, MI325X", 64, "MFMA",
        {"float16": "v_mfma_f32_32x32x8_f16", "bfloat16": "v_mfma_f32_32x32x8_bf16",
         "float32": "v_mfma_f32_32x32x4_xf32 (TF32); ieee: v_mfma_f32_32x32x2_f32",
         "int8": "v_mfma_i32_32x32x16_i8", "float64": "v_mfma_f64_16x16x4_f64"},
        # CDNA3's native fp8 is the FNUZ pair (float8_e4m3fnuz, float8_e5m2fnuz); the
        # OCP types JAX kernels use are converted to f16 first.
        ("float8_e4m3fn", "float8_e5m2"), tf32=True, lds_bytes=65536),
    AMDTarget(
        "gfx950", "CDNA4", "MI350X, MI355X", 64, "MFMA",
        {"float16": "v_mfma_f32_32x32x16_f16", "bfloat16": "v_mfma_f32_32x32x16_bf16",
         "float32": "v_mfma_f32_32x32x2_f32", "int8": "v_mfma_i32_32x32x32_i8",
         "float8_e4m3fn": "v_mfma_f32_32x32x16_fp8_fp8",
         "float8_e5m2": "v_mfma_f32_32x32x16_bf8_bf8", "float64": "v_mfma_f64_16x16x4_f64"},
        (), tf32=False, lds_bytes=163840),
    AMDTarget(
        "gfx1100", "RDNA3", "Radeon RX 7900 XTX, Radeon PRO W7900", 32, "WMMA",
        {"float16": "v_wmma_f32_16x16x16_f16", "bfloat16": "v_wmma_f32_16x16x16_bf16",
         "int8": "v_wmma_i32_16x16x16_iu8"},
        ("float8_e4m3fn", "float8_e5m2", "float32", "float64"), tf32=False,
        lds_bytes=65536),
]}


class TargetLacksError(TritonLoweringError, plugins.LevelUnsupportedError):
    """A kernel needs what its target does not have (e.g. more LDS than the AMD
    target's): refused at lowering naming the target; the conformance suite reports such
    a case ``unsupported`` for that target, not failed."""


class UnknownTargetError(ValueError):
    """An AMD architecture pallas-triton does not know."""


def amd_target(arch: str) -> AMDTarget:
    """The :class:`AMDTarget` named ``arch`` (``"gfx942"``; ``"rocm:gfx942"`` too)."""
    name = str(arch).split(":")[-1].strip().lower()
    try:
        return AMD_TARGETS[name]
    except KeyError:
        raise UnknownTargetError(
            f"unknown AMD target {arch!r} for the Pallas Triton backend (pallas-triton); "
            f"known: {', '.join(AMD_TARGETS)}") from None


def rocm_arch(compiler_params=None) -> str:
    """The AMD target: ``CompilerParams.rocm_arch``, ``PALLAS_TRITON_ROCM_ARCH``, the
    emulated AMD GPU's (``PALLAS_EMULATE_DEVICE=rocm:gfx942``), or gfx942; checked to be
    one of :data:`AMD_TARGETS`."""
    arch = (getattr(compiler_params, "rocm_arch", None) or os.environ.get(ENV_ROCM_ARCH)
            or _emulated_arch() or DEFAULT_ROCM_ARCH)
    return amd_target(arch).arch


def _emulated_arch() -> str | None:
    dev = plugins.emulated_device()
    return dev.target if dev is not None and dev.platform == "rocm" else None


def allows_tf32(target) -> bool:
    """Whether an f32 dot at DEFAULT precision may use TF32 on ``target`` (None: CUDA,
    where every target pallas-triton supports, sm_80 and up, has it)."""
    if target is None or isinstance(target, int):
        return True
    return amd_target(target).tf32


def check_fits(compiled) -> None:
    """Raises when a kernel compiled for an AMD target needs more LDS than the target
    has per workgroup (Triton 3.9 compiles it, and the launch would fail)."""
    t = amd_target(compiled.arch)
    if compiled.shared_mem_bytes > t.lds_bytes:
        raise TargetLacksError(
            f"kernel {compiled.name} needs {compiled.shared_mem_bytes} bytes of LDS; AMD "
            f"target {t.arch} ({t.family}) has {t.lds_bytes} per workgroup "
            f"(pallas-triton). Use smaller blocks or fewer num_stages.")
