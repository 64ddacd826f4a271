"""vLLM's route table, read from an installed vLLM's own source (every `@router.<method>("/path")`, `add_api_route`,
`websocket` and `Mount` under vllm/entrypoints, whatever flag enables it), plus the documentation routes FastAPI adds.
`tests/api/vllm_routes.json` holds the tables of the versions the e2e suite runs, so that `make test` checks the
guard's route table against them without vLLM installed; `python -m tests.e2e.vllm_routes` writes it anew from the
e2e cache, and tests/e2e/test_routes.py fails when it is out of date."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from tests.e2e.runtime import VERSIONS, vllm_venv

SNAPSHOT = Path(__file__).resolve().parents[1] / "api" / "vllm_routes.json"
DECORATORS = {"get", "post", "put", "delete", "patch", "head", "options", "websocket"}
FASTAPI_DOCS = [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")]


def routes_in(site_packages: Path) -> list[tuple[str, str]]:
    """(method, path) of every route vLLM's entrypoints declare; a mount is ("MOUNT", prefix)."""
    found: set[tuple[str, str]] = set(FASTAPI_DOCS)
    for source in sorted((site_packages / "vllm" / "entrypoints").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            found.update(_route(node))
    return sorted(found)


def _route(node: ast.AST) -> list[tuple[str, str]]:
    if not isinstance(node, ast.Call) or not node.args:
        return []
    name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(
        node.func, ast.Name) else ""  # fmt: skip
    path = node.args[0]
    if not (isinstance(path, ast.Constant) and isinstance(path.value, str) and path.value.startswith("/")):
        return []
    if name in DECORATORS:
        return [(name.upper() if name != "websocket" else "WEBSOCKET", path.value)]
    if name in ("add_api_route", "api_route"):
        methods = next((kw.value for kw in node.keywords if kw.arg == "methods"), None)
        listed = ast.literal_eval(methods) if methods is not None else ["GET"]
        return [(m.upper(), path.value) for m in listed]
    if name in ("Mount", "mount"):
        return [("MOUNT", path.value)]
    return []


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def write_snapshot() -> None:
    tables = {version: routes_in(site_packages(vllm_venv(version))) for version in VERSIONS}
    SNAPSHOT.write_text(json.dumps(tables, indent=1) + "\n")


if __name__ == "__main__":
    write_snapshot()
    sys.stdout.write(f"wrote {SNAPSHOT}\n")
