"""Resource figures of a kernel compiled for an AMD GPU, read from its code object.

The ``hsaco`` Triton links is an ELF code object whose note holds the AMDHSA kernel
metadata; the AMDGCN text Triton keeps beside it carries the same metadata as the
``.amdgpu_metadata`` YAML block it was assembled from, plus the compiler's per-kernel
summary (occupancy). Both are read here; :func:`check_hsaco` confirms that the code
object is an AMDGPU ELF that defines the kernel's descriptor.
"""

from __future__ import annotations

import re
import struct

EM_AMDGPU = 224  # ELF e_machine of AMDGPU code objects


def _metadata_block(amdgcn: str, name: str) -> str:
    """The ``.amdgpu_metadata`` YAML entry of kernel ``name``."""
    meta = amdgcn.split(".amdgpu_metadata", 1)[-1]
    for entry in re.split(r"\n  - ", meta):
        if re.search(rf"\.name:\s+{re.escape(name)}\n", entry):
            return entry
    raise ValueError(f"no AMDHSA metadata for kernel {name!r} in the AMDGCN")


def _field(text: str, key: str, default: int | None = None) -> int:
    m = re.search(rf"\.{re.escape(key)}:\s+(\d+)", text)
    if m is None:
        if default is not None:
            return default
        raise ValueError(f"the AMDHSA metadata has no .{key}")
    return int(m.group(1))


def _comment(amdgcn: str, key: str) -> int | None:
    m = re.search(rf"^; {re.escape(key)}: (\d+)", amdgcn, re.MULTILINE)
    return int(m.group(1)) if m else None


def resource_usage(compiled) -> dict[str, int]:
    """:func:`code_object_usage` of a :class:`~pallas_triton.CompiledKernel`."""
    return code_object_usage(compiled.amdgcn, compiled.hsaco, compiled.name,
                             compiled.shared_mem_bytes)


def code_object_usage(amdgcn: str, hsaco: bytes, name: str, dynamic_lds: int = 0
                      ) -> dict[str, int]:
    """What kernel ``name`` of a code object compiled for AMD uses, per lane or per
    workgroup (``dynamic_lds``: the LDS Triton requests at launch, its
    ``metadata.shared``).

    ``vgprs`` (vector registers per lane, AGPRs included on CDNA: the figure occupancy
    depends on), ``agprs`` (CDNA's accumulation registers; 0 on RDNA), ``sgprs`` (scalar registers per wavefront), ``lds`` (bytes
    per workgroup: the code object's static LDS plus the dynamic LDS Triton allocates at
    launch), ``scratch`` (private bytes per lane), ``vgpr_spills``, ``sgpr_spills``,
    ``occupancy`` (waves per SIMD the compiler reports), ``wavefront_size``. Like the
    NVIDIA figures, ``registers`` (= ``vgprs``), ``shared`` (= ``lds``) and ``local``
    (= ``scratch``) are also given.
    """
    check_hsaco(hsaco, name)
    text = amdgcn
    meta = _metadata_block(text, name)
    agprs = _field(meta, "agpr_count", 0)  # RDNA has no AGPRs
    vgprs = _comment(text, "TotalNumVgprs") or _field(meta, "vgpr_count")
    lds = _field(meta, "group_segment_fixed_size") + int(dynamic_lds)
    scratch = _field(meta, "private_segment_fixed_size")
    out = {
        "vgprs": vgprs,
        "agprs": agprs,
        "sgprs": _field(meta, "sgpr_count"),
        "lds": lds,
        "scratch": scratch,
        "vgpr_spills": _field(meta, "vgpr_spill_count"),
        "sgpr_spills": _field(meta, "sgpr_spill_count"),
        "occupancy": _comment(text, "Occupancy") or 0,
        "wavefront_size": _field(meta, "wavefront_size"),
    }
    out.update(registers=vgprs, shared=lds, local=scratch)
    return out


def check_hsaco(hsaco: bytes, name: str) -> None:
    """Raises unless ``hsaco`` is a 64-bit AMDGPU ELF defining ``name``'s descriptor."""
    if hsaco[:4] != b"\x7fELF" or hsaco[4] != 2:
        raise ValueError("the hsaco is not a 64-bit ELF file")
    (machine,) = struct.unpack_from("<H", hsaco, 18)
    if machine != EM_AMDGPU:
        raise ValueError(f"the hsaco is an ELF for machine {machine}, not AMDGPU")
    if f"{name}.kd".encode() not in hsaco:
        raise ValueError(f"the hsaco defines no kernel descriptor {name}.kd")


_MNEMONIC = re.compile(r"^\s+([sv]_\w+|buffer_\w+|global_\w+|flat_\w+|ds_\w+|scratch_\w+)",
                       re.MULTILINE)


def instruction_mix(amdgcn: str) -> dict[str, int]:
    """Counts of the instructions that show how a kernel moves and multiplies data:
    ``v_mfma``/``v_wmma`` (matrix unit), ``buffer_load``, ``global_load``, ``ds_read``
    (LDS reads, ``ds_load`` on RDNA), ``ds_write`` (``ds_store``), ``scratch`` (spill
    traffic), ``s_waitcnt`` and ``s_barrier``."""
    names = _MNEMONIC.findall(amdgcn)
    groups = {
        "v_mfma": ("v_mfma",), "v_wmma": ("v_wmma",), "buffer_load": ("buffer_load",),
        "global_load": ("global_load",), "buffer_store": ("buffer_store",),
        "global_store": ("global_store",), "ds_read": ("ds_read", "ds_load"),
        "ds_write": ("ds_write", "ds_store"), "scratch": ("scratch_",),
        "s_waitcnt": ("s_waitcnt",), "s_barrier": ("s_barrier",),
    }
    return {g: sum(1 for n in names if n.startswith(prefixes)) for g, prefixes in
            groups.items()}
