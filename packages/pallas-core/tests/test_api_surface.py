"""``import pallas as pl`` exposes upstream ``jax.experimental.pallas`` (JAX 0.10.2).

The expected names, kinds and signatures are read from the reference file
``reference/upstream-api-jax-0.10.2.md`` (section ``jax.experimental.pallas``), which
was produced by introspecting upstream; upstream itself is never imported here.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
from pathlib import Path

import jax
import pytest

import pallas as pl

_CANDIDATES = [
    Path(__file__).resolve().parents[3] / "reference" / "upstream-api-jax-0.10.2.md",
    Path(__file__).resolve().parents[4] / "shared" / "reference" / "upstream-api-jax-0.10.2.md",
]
REFERENCE = next((p for p in _CANDIDATES if p.exists()), None)

# The section's 57 names, as a literal too, so the test runs without the reference file.
UPSTREAM_NAMES = (
    "ANY BlockDim BlockSpec Blocked BoundedSlice Buffered CompilerParams CostEstimate "
    "DeviceIdType Element GridSpec HOST Indirect MemoryRef MemorySpace RevisitMode Slice "
    "Squeezed align_to broadcast_to cdiv core_map debug_check debug_print delay ds dslice "
    "empty empty_like empty_ref_like enable_debug_checks enable_poison_buffers "
    "estimate_cost get_global kernel loop lower_as_mlir multiple_of next_power_of_2 "
    "no_block_spec num_programs pallas_call pallas_call_p pallas_export_experimental "
    "program_id reciprocal run_scoped run_state select_ref semaphore semaphore_read "
    "semaphore_signal semaphore_wait squeezed strides_from_shape when with_scoped"
).split()


def _reference_entries() -> list[tuple[str, str, str]]:
    """(name, kind, signature) for every entry of the ``jax.experimental.pallas`` section."""
    if REFERENCE is None:
        pytest.skip("reference/upstream-api-jax-0.10.2.md is not available")
    text = REFERENCE.read_text()
    section = text.split("## `jax.experimental.pallas` ->", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `(\w+)` \(([^)]*)\)(?: `(.*)`)?$", section, re.M)


def test_the_reference_lists_57_names_and_they_are_the_literal_ones():
    entries = _reference_entries()
    assert len(entries) == 57
    assert sorted(n for n, _, _ in entries) == sorted(UPSTREAM_NAMES)


@pytest.mark.parametrize("name", UPSTREAM_NAMES)
def test_every_upstream_name_exists(name):
    assert hasattr(pl, name), f"pallas has no {name!r}"
    assert name in pl.__all__ or name in ("core_map", "kernel"), f"{name!r} not in __all__"


def test_kinds_match_upstream():
    for name, kind, _ in _reference_entries():
        obj = getattr(pl, name)
        if kind == "function":
            assert callable(obj) and not isinstance(obj, type), name
        elif kind == "class":
            assert isinstance(obj, type), name
        elif kind == "NoBlockSpec":
            assert isinstance(obj, pl.NoBlockSpec), name
        elif kind == "Squeezed":
            assert isinstance(obj, pl.Squeezed), name
        elif kind == "UnionType":
            assert type(obj).__name__ == "UnionType", name
        elif kind == "HiPrimitive":
            assert isinstance(obj, jax.extend.core.Primitive), name
            assert obj.name == "pallas_call"
        else:
            raise AssertionError(f"unknown kind {kind!r} for {name}")


# --------------------------------------------------------------------------------------
# Signatures


_KIND = {
    inspect.Parameter.POSITIONAL_ONLY: "positional-only",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional-or-keyword",
    inspect.Parameter.VAR_POSITIONAL: "*args",
    inspect.Parameter.KEYWORD_ONLY: "keyword-only",
    inspect.Parameter.VAR_KEYWORD: "**kwargs",
}
_NO_DEFAULT = object()


def _parse_signature(sig: str) -> list[tuple[str, str, object]]:
    """(name, kind, literal default or _NO_DEFAULT/None-if-not-literal) per parameter."""
    sig = re.sub(r"=\s*<[^>]*>", "= NOT_A_LITERAL", sig)  # <object at 0x...> defaults
    sig = re.sub(r"\)\s*->.*$", ")", sig)
    fn = ast.parse(f"def f{sig}: pass").body[0]
    a = fn.args
    out = []

    def default(node):
        if node is None:
            return _NO_DEFAULT
        try:
            return ast.literal_eval(node)
        except ValueError:
            return None  # not comparable

    pos = a.posonlyargs + a.args
    pos_defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for i, p in enumerate(pos):
        kind = "positional-only" if i < len(a.posonlyargs) else "positional-or-keyword"
        out.append((p.arg, kind, default(pos_defaults[i])))
    if a.vararg:
        out.append((a.vararg.arg, "*args", _NO_DEFAULT))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((p.arg, "keyword-only", default(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, "**kwargs", _NO_DEFAULT))
    return out


def _ours(obj) -> list[tuple[str, str, object]]:
    return [
        (p.name, _KIND[p.kind], _NO_DEFAULT if p.default is p.empty else p.default)
        for p in inspect.signature(obj).parameters.values()
    ]


# Enums have the Enum constructor's signature upstream; CompilerParams is an abstract
# base there (``(*args, **kwargs)``) and a field-less dataclass here.
_SKIP_SIGNATURES = {"DeviceIdType", "MemorySpace", "RevisitMode", "CompilerParams"}


def _comparable_entries():
    for name, _kind, sig in _reference_entries():
        if not sig or name in _SKIP_SIGNATURES or sig.endswith("..."):
            continue
        yield name, sig


def test_signatures_match_upstream_parameter_for_parameter():
    checked = 0
    for name, sig in _comparable_entries():
        upstream = _parse_signature(sig)
        ours = _ours(getattr(pl, name))
        assert [(n, k) for n, k, _ in ours] == [(n, k) for n, k, _ in upstream], name
        for (pname, _, theirs), (_, _, mine) in zip(upstream, ours):
            if theirs is _NO_DEFAULT:
                assert mine is _NO_DEFAULT, f"{name}({pname}) has a default here only"
            elif theirs is not None:  # a literal default upstream: ours must equal it
                assert mine == theirs, f"{name}({pname}={theirs!r}) != {mine!r}"
        checked += 1
    assert checked >= 45


# The reference truncates these three long signatures; their parameters are spelled out.
_TRUNCATED = {
    "pallas_call": [
        ("kernel", "positional-or-keyword"), ("out_shape", "positional-or-keyword"),
        ("grid_spec", "keyword-only"), ("grid", "keyword-only"), ("in_specs", "keyword-only"),
        ("out_specs", "keyword-only"), ("scratch_shapes", "keyword-only"),
        ("input_output_aliases", "keyword-only"), ("debug", "keyword-only"),
        ("interpret", "keyword-only"), ("name", "keyword-only"),
        ("compiler_params", "keyword-only"), ("cost_estimate", "keyword-only"),
        ("metadata", "keyword-only"),
    ],
    "loop": [
        ("lower", "positional-or-keyword"), ("upper", "positional-or-keyword"),
        ("init_carry", "keyword-only"), ("step", "keyword-only"), ("unroll", "keyword-only"),
    ],
    "kernel": [
        ("body", "positional-or-keyword"), ("out_type", "positional-or-keyword"),
        ("mesh", "keyword-only"), ("scratch_types", "keyword-only"),
        ("compiler_params", "keyword-only"), ("interpret", "keyword-only"),
        ("cost_estimate", "keyword-only"), ("debug", "keyword-only"), ("name", "keyword-only"),
        ("metadata", "keyword-only"),
    ],
}


@pytest.mark.parametrize("name", sorted(_TRUNCATED))
def test_long_signatures_start_with_upstreams_parameters(name):
    ours = [(n, k) for n, k, _ in _ours(getattr(pl, name))]
    expected = _TRUNCATED[name]
    assert ours[: len(expected)] == expected
    # Anything beyond upstream is keyword-only, so upstream calls keep working.
    assert all(k == "keyword-only" for _, k in ours[len(expected):]), ours


def test_the_reference_truncates_exactly_the_spelled_out_signatures():
    truncated = {n for n, _, sig in _reference_entries() if sig.endswith("...")}
    assert truncated == set(_TRUNCATED)
    for name, _, sig in _reference_entries():
        if name in _TRUNCATED:  # the visible part lists upstream's first parameters
            visible = [n for n, _ in _TRUNCATED[name] if re.search(rf"\b{n}\b", sig)]
            assert visible == [n for n, _ in _TRUNCATED[name]][: len(visible)] and visible


def test_pallas_call_defaults_match_upstream():
    sig = inspect.signature(pl.pallas_call)
    d = {k: p.default for k, p in sig.parameters.items()}
    assert d["grid_spec"] is None and d["grid"] == () and d["scratch_shapes"] == ()
    assert d["in_specs"] is pl.no_block_spec and d["out_specs"] is pl.no_block_spec
    assert d["input_output_aliases"] == {} and d["debug"] is False
    assert d["interpret"] is False and d["name"] is None
    assert d["compiler_params"] is None and d["cost_estimate"] is None
    assert d["metadata"] is None


# --------------------------------------------------------------------------------------
# A few values that upstream code relies on


def test_enum_members_used_by_upstream_code():
    assert issubclass(pl.MemorySpace, enum.Enum) and pl.MemorySpace.ANY
    assert {m.name for m in pl.DeviceIdType} >= {"MESH", "LOGICAL"}
    assert {m.name for m in pl.RevisitMode} >= {"ANY"}


def test_aliases_and_singletons():
    assert pl.dslice is pl.ds
    assert isinstance(pl.squeezed, pl.Squeezed)
    assert pl.Squeezed().block_size == 1
    assert pl.Element(4).padding == (0, 0)
    assert pl.BlockSpec().block_shape is None and pl.BlockSpec().index_map is None
    assert pl.GridSpec().grid == ()


def test_blockspec_memory_space_is_keyword_only():
    with pytest.raises(TypeError):
        pl.BlockSpec((8,), lambda i: (i,), None, pl.MemorySpace.ANY)
    assert pl.BlockSpec((8,), memory_space=pl.MemorySpace.ANY).memory_space is pl.MemorySpace.ANY


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


_PACKAGE = Path(__file__).resolve().parents[1]


def test_nothing_imports_upstream_pallas():
    files = sorted((_PACKAGE / "src").rglob("*.py")) + sorted((_PACKAGE / "tests").rglob("*.py"))
    assert len(files) > 20
    for f in files:
        bad = [m for m in _imports(f)
               if m.startswith(("jax.experimental.pallas", "jax._src.pallas"))]
        assert not bad, f"{f} imports {bad}"


def test_private_jax_imports_sit_in_one_module():
    compat = _PACKAGE / "src" / "pallas" / "_src" / "jax_compat.py"
    for f in sorted((_PACKAGE / "src").rglob("*.py")):
        private = [m for m in _imports(f) if m == "jax._src" or m.startswith("jax._src.")]
        if f == compat:
            assert private, "jax_compat.py should hold the jax._src imports"
        else:
            assert not private, f"{f.relative_to(_PACKAGE)} imports {private}"


_REPO = _PACKAGE.parents[1]


def test_nothing_outside_pallas_core_imports_its_internals():
    """Every other package, the conformance suite, examples and benchmarks of this
    repository go through ``pallas``/``pallas.plugins`` (each package also checks itself)."""
    from pallas.plugins import private_core_imports

    if not (_REPO / "packages").is_dir():
        pytest.skip("not run from the repository")
    roots = [p for p in sorted((_REPO / "packages").iterdir()) if p.name != "pallas-core"]
    roots += [_REPO / d for d in ("conformance", "examples", "benchmarks")]
    assert len(roots) >= 5
    assert private_core_imports(*roots) == []


def test_the_boundary_check_finds_a_private_import(tmp_path):
    from pallas.plugins import private_core_imports

    (tmp_path / "ok.py").write_text("import pallas\nfrom pallas import plugins\n")
    (tmp_path / "bad.py").write_text("import jax\nfrom pallas._src import block_spec\n")
    (tmp_path / "worse.py").write_text("from pallas import _src\n")
    found = private_core_imports(tmp_path)
    assert found == [f"{tmp_path / 'bad.py'}:2: pallas._src",
                     f"{tmp_path / 'worse.py'}:1: pallas._src"]
