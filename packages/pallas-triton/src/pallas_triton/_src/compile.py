"""The compile level: ``triton.compile`` of the generated kernel to PTX and cubin.

No GPU is needed: Triton compiles for a ``GPUTarget`` named by compute capability
(80 for A100, 90 for H100) with its bundled ``ptxas``.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from pallas_triton._src import module
from pallas_triton._src.lowering import LoweredKernel

ENV_COMPUTE_CAPABILITY = "PALLAS_TRITON_COMPUTE_CAPABILITY"
DEFAULT_COMPUTE_CAPABILITY = 80


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """What ``triton.compile`` produced for one kernel and one compute capability."""

    name: str  # the kernel's symbol in the PTX
    compute_capability: int
    num_warps: int
    num_stages: int
    shared_mem_bytes: int
    global_scratch_bytes: int  # Triton's per-launch global scratch (0 for most kernels)
    asm: dict  # stage -> text or bytes: ttir, ttgir, llir, ptx, cubin
    lowered: LoweredKernel

    @property
    def ptx(self) -> str:
        return self.asm["ptx"]

    @property
    def ttir(self) -> str:
        return self.asm["ttir"]

    @property
    def cubin(self) -> bytes:
        return self.asm["cubin"]

    def uses_tensor_cores(self) -> bool:
        """Whether the PTX has ``mma``/``wgmma`` instructions."""
        return "mma" in self.ptx

    def resource_usage(self) -> dict[str, int]:
        """Registers, stack, shared and local memory (bytes) of the compiled kernel, as
        ``cuobjdump -res-usage`` (bundled with Triton) reads them from the cubin."""
        return resource_usage(self.cubin, self.name)


def compute_capability(compiler_params=None) -> int:
    """The target: ``CompilerParams.compute_capability``, the environment, or 80."""
    cc = getattr(compiler_params, "compute_capability", None)
    if cc is None and os.environ.get(ENV_COMPUTE_CAPABILITY):
        cc = int(os.environ[ENV_COMPUTE_CAPABILITY])
    if cc is None:
        cc = _device_compute_capability()
    return int(cc or DEFAULT_COMPUTE_CAPABILITY)


def _device_compute_capability() -> int | None:
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


def _compile(lowered: LoweredKernel, cc: int) -> CompiledKernel:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = jit_function(lowered)
    # XLA's buffers are 16-byte aligned: let Triton vectorise accesses.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(lowered.params))}
    src = ASTSource(fn=fn, signature=dict(lowered.signature), constexprs={}, attrs=attrs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
        kernel = triton.compile(
            src, target=GPUTarget("cuda", cc, 32),
            options={"num_warps": lowered.num_warps, "num_stages": lowered.num_stages},
        )
    md = kernel.metadata
    return CompiledKernel(
        name=md.name, compute_capability=cc, num_warps=lowered.num_warps,
        num_stages=lowered.num_stages, shared_mem_bytes=int(md.shared),
        global_scratch_bytes=int(getattr(md, "global_scratch_size", 0) or 0),
        asm=dict(kernel.asm), lowered=lowered,
    )


def compile_lowered(lowered: LoweredKernel, compute_capability: int = 80) -> CompiledKernel:
    """Compiles a lowered kernel for ``sm_{compute_capability}`` (cached by source)."""
    key = (lowered.source, tuple(sorted(lowered.signature.items())), lowered.num_warps,
           lowered.num_stages, int(compute_capability))
    hit = _CACHE.get(key)
    if hit is None:
        hit = _CACHE[key] = _compile(lowered, int(compute_capability))
    return hit


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
