"""corral.contracts is the bottom of the house: the standard library only, and nothing else of corral,
so the egress image (no pydantic) and a client install carry it whole."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parents[3] / "services" / "corral" / "contracts"


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.append(node.module)
    return found


def test_contracts_import_only_the_standard_library_and_each_other() -> None:
    strays = {
        f"{path.name}: {name}"
        for path in CONTRACTS.glob("*.py")
        for name in _imports(path)
        if not (name.split(".")[0] in sys.stdlib_module_names or name.startswith("corral.contracts"))
    }
    assert strays == set()


def test_every_contract_module_is_seen() -> None:
    assert {path.stem for path in CONTRACTS.glob("*.py")} >= {
        "actors",
        "auth",
        "cdprules",
        "control",
        "limits",
        "placeholders",
        "urls",
    }
