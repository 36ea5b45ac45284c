"""The device a search is for: the one at hand (timed) or one only compiled for (modelled).

Also the few public figures of each target that the static model needs. They are
approximate datasheet numbers; the model ranks configs with them, it does not predict
seconds.
"""

from __future__ import annotations

import dataclasses
import os

import jax

# Another engineer's emulated device (``pallas.emulate_device``) reads the same variable:
# under it, pallas_call runs the generated code in an executor, so timings mean nothing.
ENV_EMULATE = "PALLAS_EMULATE_DEVICE"


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """What the model knows of a target.

    Attributes:
      peak_flops: dense matmul flops per second (bf16 on accelerators).
      bandwidth: main-memory bytes per second.
      step_overhead_s: the cost of one grid step beyond its work (pipeline bookkeeping).
      onchip_bytes: the on-chip budget of one kernel instance: TPU's default scoped VMEM
        limit, a GPU block's largest dynamic shared memory; 0 when there is no limit.
      onchip_name: what that memory is called in reasons ("VMEM", "SMEM").
      cores: streaming multiprocessors (GPU) or TensorCores (TPU) working on the grid.
      regs_per_core, threads_per_core, smem_per_core: a GPU SM's limits (occupancy).
    """

    peak_flops: float
    bandwidth: float
    step_overhead_s: float
    onchip_bytes: int = 0
    onchip_name: str = "on-chip memory"
    cores: int = 1
    regs_per_core: int = 0
    threads_per_core: int = 0
    smem_per_core: int = 0


_MIB = 1 << 20
SPECS: dict[str, DeviceSpec] = {
    # TPU: the default scoped VMEM limit (what vmem_limit_bytes is when not given).
    "tpu:v4": DeviceSpec(275e12, 1.2e12, 0.35e-6, 16 * _MIB, "VMEM"),
    "tpu:v5e": DeviceSpec(197e12, 0.82e12, 0.35e-6, 16 * _MIB, "VMEM"),
    "tpu:v5p": DeviceSpec(459e12, 2.76e12, 0.35e-6, 16 * _MIB, "VMEM"),
    "tpu:v6e": DeviceSpec(918e12, 1.64e12, 0.35e-6, 32 * _MIB, "VMEM"),
    "tpu:7x": DeviceSpec(2307e12, 7.37e12, 0.35e-6, 32 * _MIB, "VMEM"),
    # GPU: per-block dynamic SMEM, and an SM's registers, threads and SMEM.
    "cuda:sm_80": DeviceSpec(312e12, 2.0e12, 0.0, 166912, "SMEM", 108, 65536, 2048, 167936),
    "cuda:sm_90a": DeviceSpec(989e12, 3.35e12, 0.0, 232448, "SMEM", 132, 65536, 2048, 233472),
    "cuda:sm_100a": DeviceSpec(2250e12, 8.0e12, 0.0, 232448, "SMEM", 148, 65536, 2048, 233472),
    # The CPU path (the core interpreter): a grid step costs far more than its work.
    "cpu": DeviceSpec(50e9, 20e9, 5e-6),
}
_ALIASES = {"sm_90": "sm_90a", "sm_100": "sm_100a", "v5litepod": "v5e", "v5lite": "v5e",
            "tpu7x": "7x", "v7x": "7x", "v6lite": "v6e", "80": "sm_80", "90": "sm_90a", "100": "sm_100a"}
DEFAULT_KIND = {"tpu": "v5e", "cuda": "sm_90a", "rocm": "sm_90a"}


def spec_for(platform: str, kind: str) -> DeviceSpec:
    """The spec of ``platform``/``kind`` (its family's default when the kind is unknown)."""
    if platform == "cpu":
        return SPECS["cpu"]
    k = kind.lower().replace("tpu ", "").replace(" ", "")
    k = _ALIASES.get(k, k)
    if f"{platform}:{k}" in SPECS:
        return SPECS[f"{platform}:{k}"]
    for name, spec in SPECS.items():  # "NVIDIA H100 80GB HBM3" and the like
        if name.startswith(platform) and name.split(":")[1] in k:
            return spec
    if "h100" in k or "h200" in k or "gh200" in k:
        return SPECS["cuda:sm_90a"]
    if "b200" in k or "gb200" in k:
        return SPECS["cuda:sm_100a"]
    if "a100" in k:
        return SPECS["cuda:sm_80"]
    return SPECS.get(f"{platform}:{DEFAULT_KIND.get(platform, '')}", SPECS["cpu"])


@dataclasses.dataclass(frozen=True)
class Target:
    """The device a search is for.

    Attributes:
      platform: the JAX platform kernels lower for (``"cpu"``, ``"cuda"``, ``"tpu"``).
      kind: the device kind (``jax.Device.device_kind``, or ``"v5e"``, ``"sm_90a"``).
      measured: whether configs are timed on it; ``False`` for a device only compiled
        for or emulated, where the static model ranks them.
      why: for a modelled target, why it is not timed.
    """

    platform: str
    kind: str
    measured: bool
    why: str = ""

    @property
    def device(self) -> str:
        """The cache's device field."""
        if self.measured:
            return self.kind
        return f"{'emulated ' if 'emulated' in self.why else ''}{self.platform}:{self.kind}"

    @property
    def spec(self) -> DeviceSpec:
        return spec_for(self.platform, self.kind)

    @property
    def compiler_target(self) -> str:
        """The kind as compilers name it: ``"NVIDIA H100 80GB HBM3"`` is ``"sm_90a"``,
        ``"TPU v5 lite"`` is ``"v5e"`` (the kind itself when no spec matches)."""
        spec = self.spec
        for name, s in SPECS.items():
            if s is spec and name.startswith(self.platform + ":"):
                return name.split(":", 1)[1]
        return self.kind

    def compile_options(self) -> dict:
        """Options for a backend's compile level naming this target."""
        target = self.compiler_target
        opts: dict = {"target": target}
        digits = "".join(c for c in target if c.isdigit())
        if self.platform in ("cuda", "rocm") and digits:
            opts["compute_capability"] = int(digits)
        return opts


def current_target(platform: str | None = None, kind: str | None = None) -> Target:
    """The target: ``platform``/``kind`` if given and not this host's device (cross
    compiling), the emulated device of ``PALLAS_EMULATE_DEVICE``, else the default device."""
    emulated = os.environ.get(ENV_EMULATE, "").strip()
    if platform is None and emulated:
        plat, _, k = emulated.partition(":")
        plat = "cuda" if plat in ("gpu", "nvidia") else plat
        return Target(plat, k or DEFAULT_KIND.get(plat, ""), False,
                      f"emulated device {ENV_EMULATE}={emulated}: timing an executor "
                      "says nothing of the device")
    local = jax.default_backend()
    if platform is None or platform == local:
        dev = jax.devices(local)[0]
        if kind is None or kind == dev.device_kind:
            return Target(local, dev.device_kind, True)
        platform = local
    return Target(platform, kind or DEFAULT_KIND.get(platform, ""), False,
                  f"compiling for {platform}:{kind or DEFAULT_KIND.get(platform, '?')} "
                  f"without that device (this host runs {local})")
