"""Which conformance ``grad`` cases get backward kernels on each backend.

For every case tagged ``grad`` and every installed compiled backend, traces the case
with ``pl.grad_fallback("error")`` and prints a Markdown table: ``kernels (n)`` with
``n`` the backward ``pallas_call``s (``+ fwd`` when a forward call saving carried
state is added), ``XLA (reason)`` where the backward pass falls back, ``—`` where the
forward kernel itself is refused. The table in docs/transformations.md comes from it.

    hatch run python tools/grad_table.py [-k NAME]
"""

from __future__ import annotations

import argparse
import functools

import jax

import pallas as pl
import pallas.plugins
import pallas_conformance.cases  # noqa: F401 - registers the catalogue
from pallas_conformance.catalogue import all_cases

BACKENDS = ("triton", "mosaic_tpu", "mosaic_gpu")


def _calls(fn, args):
    names = []

    def walk(j):
        for e in j.eqns:
            if e.primitive is pl.pallas_call_p:
                names.append(e.params["name"])
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return names


def cell(case, backend: str) -> str:
    args = case.make_inputs()
    pc = functools.partial(pl.pallas_call, backend=backend)
    fn = functools.partial(case.fn, pc)
    try:
        b = pallas.plugins.get_backend(backend)
        with pl.grad_fallback("allow"):  # is the forward kernel accepted at all?
            for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns:
                if e.primitive is pl.pallas_call_p and "(backward," not in e.params["name"]:
                    b.validate(pallas.plugins.KernelRequest.from_params(
                        e.params, e.params["compiler_params"]))
    except Exception:  # noqa: BLE001 - the forward kernel does not lower there
        return "—"
    try:
        with pl.grad_fallback("error"):
            names = _calls(fn, args)
    except NotImplementedError as e:
        why = str(e).split("cannot be emitted as kernels (", 1)[-1].split("), and", 1)[0]
        return f"XLA ({why})"
    n = sum("(backward," in s for s in names)
    fwd = sum("(forward, saving state)" in s for s in names)
    return f"kernels ({n}{' + fwd' if fwd else ''})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="keyword")
    args = ap.parse_args()
    backends = [b for b in BACKENDS if b in {x.name for x in pallas.plugins.list_backends()}]
    print("| case | " + " | ".join(f"`{b}`" for b in backends) + " |")
    print("|---|" + "---|" * len(backends))
    for case in all_cases():
        if "grad" not in case.tags or (args.keyword and args.keyword not in case.name):
            continue
        print(f"| {case.name} | " + " | ".join(cell(case, b) for b in backends) + " |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
