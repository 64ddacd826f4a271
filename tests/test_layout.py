"""The layout holds: imports point one way (server and extproc -> doctor -> exchange -> drift -> upstream -> fleet ->
policy -> counting -> api -> settings, errors and error bodies; the request path never imports the doctor command),
and the pure packages (api, counting, policy) import nothing that speaks HTTP or Redis. Every import in every module
counts, also those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "proxy"

LAYERS = [  # lowest first: a module may import its own layer and the layers below it
    {"errors", "error_bodies", "settings", "assets"},
    {"api"},
    {"counting"},
    {"policy"},
    {"fleet"},
    {"upstream"},
    {"drift"},
    {"exchange"},
    {"doctor"},
    {"server", "extproc"},
    {"simulator", "demo", "cli", "__main__"},
]
PURE = {"api", "counting", "policy"}
HTTP_LIBRARIES = {"httpx", "httpcore", "aiohttp", "starlette", "uvicorn", "anyio", "prometheus_client", "redis"}


def layer_of(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def imports(path: Path) -> list[str]:
    """Every module `path` imports, as dotted names (`from proxy import x` gives proxy.x)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{a.name}" for a in node.names] if node.module == "proxy" else [node.module]
    return names


MODULES = sorted(PACKAGE.rglob("*.py"))


def own_part(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_every_module_has_a_layer() -> None:
    assert MODULES and {own_part(p) for p in MODULES if own_part(p) != "__init__"} <= set().union(*LAYERS)


def test_imports_point_down() -> None:
    upward = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in MODULES if own_part(path) != "__init__"
        for name in imports(path)
        if name.startswith("proxy.") and layer_of(name.split(".")[1]) > layer_of(own_part(path))
    ]  # fmt: skip
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_pure_packages_speak_no_http() -> None:
    http = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in MODULES if own_part(path) in PURE
        for name in imports(path) if name.split(".")[0] in HTTP_LIBRARIES
    ]  # fmt: skip
    assert not http, "pure modules importing HTTP libraries:\n" + "\n".join(http)


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from proxy.server.app import create_app\n    import httpx\n")
    found = imports(module)
    assert "proxy.server.app" in found and "httpx" in found


def test_the_guard_never_unpickles() -> None:
    """prompt_embeds arrive as pickles: the guard reads their opcodes (api/embeds.py), it never loads one, nor torch.
    The simulator, a stand-in for vLLM, loads them through an unpickler that resolves four names."""
    loading = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in MODULES if own_part(path) != "simulator"
        for name in imports(path) if name.split(".")[0] in {"pickle", "torch", "dill", "cloudpickle", "joblib"}
    ]  # fmt: skip
    assert not loading, "modules that could load a pickle:\n" + "\n".join(loading)
