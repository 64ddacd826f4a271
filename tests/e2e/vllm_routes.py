"""vLLM's route table, read from vLLM's own source (every `@router.<method>("/path")`, `add_api_route`, `websocket`
and `Mount` under vllm/entrypoints, whatever flag enables it), plus the documentation routes FastAPI adds.
`tests/api/vllm_routes.json` holds the tables of every version the guard follows, so that `make test` checks the
guard's route table against them without vLLM installed: the versions the e2e suite runs read from their installed
environments, the later ones from their released wheels (downloaded with pip, never installed: no CPU build of them
installs here). `python -m tests.e2e.vllm_routes` writes it anew, and tests/e2e/test_routes.py fails when the
installed versions' part is out of date."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from tests.e2e.runtime import VERSIONS, cache_root, vllm_venv

SNAPSHOT = Path(__file__).resolve().parents[1] / "api" / "vllm_routes.json"
DECORATORS = {"get", "post", "put", "delete", "patch", "head", "options", "websocket"}
FASTAPI_DOCS = [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")]
RELEASED = ("0.33.0", "0.34.0")  # read from the released wheels


def routes_in(site_packages: Path) -> list[tuple[str, str]]:
    """(method, path) of every route vLLM's entrypoints declare; a mount is ("MOUNT", prefix)."""
    sources = sorted((site_packages / "vllm" / "entrypoints").rglob("*.py"))
    return _routes(source.read_text() for source in sources)


def routes_in_wheel(wheel: Path) -> list[tuple[str, str]]:
    """The same, read from a wheel's vllm/entrypoints without installing it."""
    with zipfile.ZipFile(wheel) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("vllm/entrypoints/") and n.endswith(".py"))
        return _routes(archive.read(name).decode() for name in names)


def released_wheel(version: str) -> Path:
    """vLLM `version`'s x86-64 wheel from the package index (pip's cache and index settings), fetched once."""
    folder = cache_root() / "wheels"
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if not found:
        pip = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--only-binary", ":all:"]
        subprocess.run([*pip, "--platform", "manylinux_2_28_x86_64", "-d", str(folder), "-q"], check=True)
        found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    return found[0]


def _routes(sources: Iterable[str]) -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set(FASTAPI_DOCS)
    for source in sources:
        for node in ast.walk(ast.parse(source)):
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
    tables |= {version: routes_in_wheel(released_wheel(version)) for version in RELEASED}
    SNAPSHOT.write_text(json.dumps(tables, indent=1) + "\n")


if __name__ == "__main__":
    write_snapshot()
    sys.stdout.write(f"wrote {SNAPSHOT}\n")
