"""One-way imports: pallas-tpu uses pallas-core only through its public modules."""

from pathlib import Path

from pallas.plugins import private_core_imports

PACKAGE = Path(__file__).resolve().parents[1]


def test_no_import_of_pallas_core_internals():
    assert (PACKAGE / "src").is_dir()
    assert private_core_imports(PACKAGE / "src", PACKAGE / "tests") == []
