"""One-way imports: the suite, its tests and the example plugin use pallas-core only
through its public modules, as a third-party backend must."""

from pathlib import Path

from pallas.plugins import private_core_imports

ROOT = Path(__file__).resolve().parents[1]


def test_no_import_of_pallas_core_internals():
    roots = [ROOT / "src", ROOT / "tests", ROOT / "examples"]
    assert all(r.is_dir() for r in roots)
    assert private_core_imports(*roots) == []
