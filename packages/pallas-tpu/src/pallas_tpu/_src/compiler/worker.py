"""The child process that runs libtpu: ``python -m pallas_tpu._src.compiler.worker``.

It reads requests (length-prefixed pickles) on stdin and answers on the stdout it was
started with; everything libtpu prints (its initialisation warnings on a host without a
TPU, its logs, a ``CHECK`` failure's message) goes to stderr, which the parent points
at a log file. A compiler abort ends this process only: the parent reports it and
starts another. The parent sets ``LIBTPU_INIT_ARGS=--xla_mosaic_dump_to=DIR`` so that
Mosaic writes every stage of each kernel to ``DIR``; the stages of one compile are
read back and removed.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time

from pallas_tpu._src.compiler.protocol import read_message, write_message

_DUMP = re.compile(r"^(\d+)-(\d+)-mosaic-dump-(.*)\.txt$")
_SCOPED = re.compile(r'"used_scoped_memory_configs":\[(.*?)\]')
_CONFIG = re.compile(r'\{"memory_space":"(\d+)","offset":"(\d+)","size":"(\d+)"\}')
# The stages whose text a result carries (the others are listed by name, and kept
# whole with ``dump_dir=``): the module after Mosaic's layout passes, and the final LLO.
KEPT = ("post-apply-vector-layout-simplify", "post-apply-vector-layout", "post-finalize-llo")


def _stage_name(rest: str) -> str:
    m = re.search(r"(original|post-.*)$", rest)
    return m.group(1) if m else rest


def collect_stages(dump_dir: str, before: set[str], keep_to: str | None,
                   remove: bool) -> tuple[list[str], dict[str, str]]:
    """The stages Mosaic dumped since ``before``: their names in order and the texts of
    :data:`KEPT`. Dumps of one compile share an id; the run through the whole pipeline
    (the group with the most stages) is the kernel's."""
    groups: dict[str, list[tuple[int, str, str]]] = {}
    for f in sorted(set(os.listdir(dump_dir)) - before):
        m = _DUMP.match(f)
        if m:
            groups.setdefault(m.group(1), []).append((int(m.group(2)), _stage_name(m.group(3)),
                                                      f))
    names: list[str] = []
    texts: dict[str, str] = {}
    if groups:
        main = max(groups.values(), key=len)
        for _, stage, f in sorted(main):
            names.append(stage)
            if stage in KEPT or stage.endswith("-failed"):
                with open(os.path.join(dump_dir, f), encoding="utf-8", errors="replace") as fh:
                    texts[stage] = fh.read()
        if keep_to:
            os.makedirs(keep_to, exist_ok=True)
            for _, _, f in sorted(main):
                shutil.copy(os.path.join(dump_dir, f), keep_to)
    if remove:
        for group in groups.values():
            for _, _, f in group:
                try:
                    os.remove(os.path.join(dump_dir, f))
                except OSError:
                    pass
    return names, texts


def scoped_memory(hlo_text: str) -> dict[str, int]:
    """The scoped memory XLA gave the kernel's custom call, by memory space id (``"1"``
    is VMEM), from ``used_scoped_memory_configs`` of the compiled HLO."""
    out: dict[str, int] = {}
    for m in _SCOPED.finditer(hlo_text):
        for space, _, size in _CONFIG.findall(m.group(1)):
            out[space] = max(out.get(space, 0), int(size))
    return out


class Compiler:
    def __init__(self, dump_dir: str | None, own_dumps: bool):
        import jax
        from jax.experimental import topologies

        self.jax, self.topologies = jax, topologies
        self.dump_dir, self.own_dumps = dump_dir, own_dumps
        self._topos: dict[str, object] = {}

    def devices(self, topology: str) -> list:
        if topology not in self._topos:
            self._topos[topology] = list(self.topologies.get_topology_desc(
                platform="tpu", topology_name=topology).devices)
        return self._topos[topology]

    def arguments(self, exported, topology: str) -> list:
        """The artifact's arguments on the topology's first device, or for an artifact
        of ``n`` devices (a ``shard_map`` program) on its first ``n`` devices, laid out
        as the artifact's mesh (its axis names, sizes and types)."""
        jax = self.jax
        devs, n = self.devices(topology), exported.nr_devices
        if n == 1:
            sharding = jax.sharding.SingleDeviceSharding(devs[0])
            return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
                    for a in exported.in_avals]
        if n > len(devs):
            raise ValueError(f"the artifact runs on {n} devices; topology {topology} has "
                             f"{len(devs)}")
        import numpy as np

        try:
            named = [s for s in exported.in_shardings_jax(None) if s is not None]
        except Exception:  # noqa: BLE001 - an artifact with HLO shardings only
            named = []
        am = named[0].mesh if named else None
        if am is not None and int(np.prod(am.axis_sizes)) == n:
            mesh = jax.sharding.Mesh(np.array(devs[:n]).reshape(am.axis_sizes),
                                     am.axis_names, axis_types=am.axis_types)
        else:
            mesh = jax.sharding.Mesh(np.array(devs[:n]), ("devices",))
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s or replicated)
                for a, s in zip(exported.in_avals, exported.in_shardings_jax(mesh))]

    def compile(self, msg: dict) -> dict:
        jax = self.jax
        t0 = time.perf_counter()
        dev = self.devices(msg["topology"])[0]
        exported = jax.export.deserialize(bytearray(msg["exported"]))
        args = self.arguments(exported, msg["topology"])
        before = set(os.listdir(self.dump_dir)) if self.dump_dir else set()
        error = None
        try:
            compiled = (jax.jit(exported.call).trace(*args)
                        .lower(lowering_platforms=("tpu",)).compile())
        except Exception as e:  # noqa: BLE001 - the compiler's rejection is the answer
            error, compiled = f"{type(e).__name__}: {e}", None
        seconds = time.perf_counter() - t0
        names, texts = ([], {})
        if self.dump_dir:
            names, texts = collect_stages(self.dump_dir, before, msg.get("keep_dumps"),
                                          remove=self.own_dumps)
        out = {"error": error, "stages": names, "texts": texts, "seconds": seconds,
               "device_kind": dev.device_kind}
        if compiled is not None:
            out["scoped_memory"] = scoped_memory(compiled.as_text())
            stats = compiled.memory_analysis()
            out["memory"] = {k: int(getattr(stats, k)) for k in dir(stats)
                             if k.endswith("_in_bytes")} if stats is not None else {}
        return out


def main() -> int:
    # The answers go to the stdout this process was started with; anything the native
    # code prints to stdout afterwards lands in the log (stderr) instead.
    import resource

    # A CHECK failure aborts this process: no core file.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    compiler = Compiler(os.environ.get("PALLAS_TPU_DUMP_DIR") or None,
                        os.environ.get("PALLAS_TPU_OWN_DUMPS") == "1")
    write_message(answers, {"ready": True})
    while True:
        msg = read_message(requests)
        if msg is None:
            return 0
        print(f"pallas_tpu.compile: compiling {msg.get('name')!r} for {msg['topology']}",
              file=sys.stderr, flush=True)
        if msg.get("abort_for_test"):  # the parent's crash handling, tested for real
            print("F0000 00:00:00.000000 1 worker.py:0] Check failed: abort_for_test",
                  file=sys.stderr, flush=True)
            os.abort()
        try:
            answer = compiler.compile(msg)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            answer = {"error": f"{type(e).__name__}: {e}", "stages": [], "texts": {},
                      "seconds": 0.0}
        write_message(answers, answer)


if __name__ == "__main__":
    sys.exit(main())
