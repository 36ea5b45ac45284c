"""The compile level: ``triton.compile`` of the generated kernel, for NVIDIA or AMD.

No GPU is needed: Triton compiles for a ``GPUTarget`` named by compute capability
(80 for A100, 90 for H100) to PTX and a cubin with its bundled ``ptxas``, or by AMD
architecture (``"gfx942"`` for MI300, see :mod:`.targets`) to AMDGCN and a ``hsaco``
with its bundled LLVM and ``ld.lld``.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from pallas_triton._src import module
from pallas_triton._src.lowering import LoweredKernel

ENV_COMPUTE_CAPABILITY = "PALLAS_TRITON_COMPUTE_CAPABILITY"
DEFAULT_COMPUTE_CAPABILITY = 80


def _stage(name: str, doc: str) -> property:
    """A read-only attribute for one stage's output in :attr:`CompiledKernel.asm`."""
    return property(lambda self: self.asm[name], doc=doc)


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """What ``triton.compile`` produced for one kernel and one target."""

    name: str  # the kernel's symbol in the PTX / hsaco
    compute_capability: int | None  # NVIDIA targets; None for AMD ones
    num_warps: int
    num_stages: int
    shared_mem_bytes: int
    global_scratch_bytes: int  # Triton's per-launch global scratch (0 for most kernels)
    asm: dict  # stage -> text or bytes: ttir, ttgir, llir, ptx, cubin (amdgcn, hsaco)
    lowered: LoweredKernel
    arch: str = ""  # "sm_80", "gfx942"
    warp_size: int = 32

    @property
    def platform(self) -> str:
        """The JAX platform the kernel runs on: ``"cuda"`` or ``"rocm"``."""
        return "rocm" if self.arch.startswith("gfx") else "cuda"

    ptx = _stage("ptx", "The PTX text (NVIDIA).")
    ttir = _stage("ttir", "The Triton IR text.")
    cubin = _stage("cubin", "The cubin bytes (NVIDIA).")
    amdgcn = _stage("amdgcn", "The AMDGCN assembly text (AMD).")
    hsaco = _stage("hsaco", "The hsaco code object bytes (AMD).")

    def uses_tensor_cores(self) -> bool:
        """Whether the kernel multiplies on the matrix units: ``mma``/``wgmma`` in the PTX,
        ``v_mfma``/``v_wmma`` in the AMDGCN."""
        if self.platform == "rocm":
            return "v_mfma" in self.amdgcn or "v_wmma" in self.amdgcn
        return "mma" in self.ptx

    def resource_usage(self) -> dict[str, int]:
        """What the compiled kernel uses. NVIDIA: registers, stack, shared and local
        memory (bytes), as ``cuobjdump -res-usage`` (bundled with Triton) reads them
        from the cubin. AMD: see :func:`.amdgcn.resource_usage` (VGPRs, SGPRs, LDS,
        scratch, spills, occupancy, from the code object's metadata)."""
        if self.platform == "rocm":
            from pallas_triton._src import amdgcn

            return amdgcn.resource_usage(self)
        return resource_usage(self.cubin, self.name)


def compute_capability(compiler_params=None) -> int:
    """The target: ``CompilerParams.compute_capability``, the environment, the emulated
    or local GPU, or 80."""
    cc = getattr(compiler_params, "compute_capability", None)
    if cc is None and os.environ.get(ENV_COMPUTE_CAPABILITY):
        cc = int(os.environ[ENV_COMPUTE_CAPABILITY])
    if cc is None:
        cc = _device_compute_capability()
    return int(cc or DEFAULT_COMPUTE_CAPABILITY)


def _device_compute_capability() -> int | None:
    """The attached GPU's compute capability: the emulated GPU's
    (``PALLAS_EMULATE_DEVICE=cuda:sm_90a``), else the first local GPU's."""
    from pallas.plugins import emulated_device

    dev = emulated_device()
    if dev is not None and dev.compute_capability is not None:
        major, minor = dev.compute_capability
        return major * 10 + minor
    try:
        import jax

        for d in jax.devices():
            if d.platform == "gpu" and hasattr(d, "compute_capability"):
                major, _, minor = str(d.compute_capability).partition(".")
                return int(major) * 10 + int(minor or 0)
    except Exception:  # noqa: BLE001 - no GPU backend: fall back to the default
        return None
    return None


def jit_function(lowered: LoweredKernel):
    """The ``triton.runtime.JITFunction`` for the generated source."""
    return module.load(lowered.source, lowered.name)


_CACHE: dict = {}


def _gpu_target(target):
    """Triton's ``GPUTarget`` for a compute capability (int) or an AMD arch (str)."""
    from triton.backends.compiler import GPUTarget

    if isinstance(target, str):
        from pallas_triton._src.targets import amd_target

        t = amd_target(target)
        return GPUTarget("hip", t.arch, t.warp_size)
    return GPUTarget("cuda", int(target), 32)


def _compile(lowered: LoweredKernel, target) -> CompiledKernel:
    import triton
    from triton.compiler import ASTSource

    gpu_target = _gpu_target(target)
    fn = jit_function(lowered)
    # XLA's buffers are 16-byte aligned: let Triton vectorise accesses.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(lowered.params))}
    src = ASTSource(fn=fn, signature=dict(lowered.signature), constexprs={}, attrs=attrs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
        kernel = triton.compile(
            src, target=gpu_target,
            options={"num_warps": lowered.num_warps, "num_stages": lowered.num_stages},
        )
    md = kernel.metadata
    is_amd = gpu_target.backend == "hip"
    return CompiledKernel(
        name=md.name, compute_capability=None if is_amd else int(target),
        arch=str(target) if is_amd else f"sm_{target}", warp_size=gpu_target.warp_size,
        num_warps=lowered.num_warps,
        num_stages=lowered.num_stages, shared_mem_bytes=int(md.shared),
        global_scratch_bytes=int(getattr(md, "global_scratch_size", 0) or 0),
        asm=dict(kernel.asm), lowered=lowered,
    )


def compile_lowered(lowered: LoweredKernel, compute_capability: int | str = 80
                    ) -> CompiledKernel:
    """Compiles a lowered kernel (cached by source) for ``sm_{compute_capability}``, or,
    given an AMD architecture name (``"gfx942"``), for that AMD GPU."""
    target = compute_capability
    if isinstance(target, str) and target.removeprefix("sm_").rstrip("a").isdigit():
        target = int(target.removeprefix("sm_").rstrip("a"))  # "sm_90a", "90"
    if not isinstance(target, str):
        target = int(target)
        check_float8(lowered, target)
    else:
        from pallas_triton._src.targets import amd_target

        target = amd_target(target).arch
        if lowered.target != target:
            raise ValueError(
                f"kernel {lowered.name} was lowered for "
                f"{lowered.target or 'NVIDIA GPUs'}, not for AMD target {target}: lower it "
                f"with target={target!r}")
    key = (lowered.source, tuple(sorted(lowered.signature.items())), lowered.num_warps,
           lowered.num_stages, target)
    hit = _CACHE.get(key)
    if hit is None:
        hit = _CACHE[key] = _compile(lowered, target)
    return hit


# Triton's float8_e4m3fn (``fp8e4nv``) needs sm_89 (Ada) or later; earlier NVIDIA GPUs
# have only its e5m2 and e4m3b15 types ("type fp8e4nv not supported in this architecture").
_FP8E4NV_MIN_CC = 89


def check_float8(lowered: LoweredKernel, cc: int) -> None:
    """Refuses a kernel using float8_e4m3fn for an NVIDIA target before sm_89, naming the
    dtype and the target (the conformance suite reports it unsupported there)."""
    uses = "tl.float8e4nv" in lowered.source or any(
        "fp8e4nv" in t for t in lowered.signature.values())
    if uses and cc < _FP8E4NV_MIN_CC:
        from pallas_triton._src.targets import TargetLacksError

        raise TargetLacksError(
            f"kernel {lowered.name} uses float8_e4m3fn, which Triton supports on sm_89 and "
            f"later; the target is sm_{cc} (pallas-triton). Compile for sm_89 or later "
            f"(PALLAS_TRITON_COMPUTE_CAPABILITY=90) or use float8_e5m2.")


def resource_usage(cubin: bytes, name: str) -> dict[str, int]:
    """``{"registers", "stack", "shared", "local"}`` of kernel ``name`` in ``cubin``."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    block = out.split(f"Function {name}:", 1)[-1]
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", block))
    return {"registers": int(fields.get("REG", 0)), "stack": int(fields.get("STACK", 0)),
            "shared": int(fields.get("SHARED", 0)), "local": int(fields.get("LOCAL", 0))}
