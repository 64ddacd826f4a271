"""The layout holds: imports point one way (server and extproc -> doctor -> exchange -> drift -> upstream -> fleet ->
policy -> counting -> api -> settings, errors and error bodies; the request path never imports the doctor command),
and the pure packages (api, counting, policy) import nothing that speaks HTTP or Redis. The simulator is a package of
its own beside proxy/, with layers of its own: proxy/ reaches it only from the command layer, inside functions, and it
reads request bodies with readers of its own, so that a test of the guard against it has an independent oracle. Every
import in every module counts, also those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "proxy"
SIMULATOR = ROOT / "simulator"

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
    {"demo", "cli", "__main__"},
]
COMMANDS = {"demo", "cli"}  # the only modules of proxy/ that may reach the simulator, and only inside a function
SIMULATOR_LAYERS = [  # lowest first, as LAYERS
    {
        "errors",
        "cache_info",
        "orjson_text",
        "profiles",
        "settings",
        "kv",
        "wire",
        "limits",
        "embeds",
        "forced",
        "schema_example",
        "conversation",
        "content_format",
        "processor",
        "invocations",
        "cohere_request",
        "responses_input",
        "responses_request",
        "responses_tools",
        "messages_request",
        "messages_chat",
        "pooling_request",
        "render_sampling",
    },
    {"generation", "stats", "responses", "api_shapes", "token_out", "streaming", "stored", "tokenizer", "harmony"},
    {"context", "chat_prompt", "endings"},
    {
        "chat",
        "completions",
        "converted",
        "messages",
        "pooling",
        "cohere",
        "batch",
        "token_in",
        "tokenize",
        "audio",
        "decisions",
    },
    {"render"},  # answers through the generation routes' planners
    {"app"},
    {"command"},
]
# What the simulator takes from proxy/: the demo tokenizer's files only; never the guard's readers or counting
FROM_PROXY = {"proxy.assets"}
STILL_BORROWED = {  # the guard's readers the simulator has not yet replaced with its own: this set only shrinks
    "proxy.counting.harmony",  # gpt-oss: the last step of rendering (legacy tool-call headers, analysis dropped)
    "proxy.errors",
}
PURE = {"api", "counting", "policy"}
HTTP_LIBRARIES = {"httpx", "httpcore", "aiohttp", "starlette", "uvicorn", "anyio", "prometheus_client", "redis"}


def layer_of(part: str, layers: list[set[str]] = LAYERS) -> int:
    return next(i for i, layer in enumerate(layers) if part in layer)


def imports(path: Path) -> list[str]:
    """Every module `path` imports, as dotted names (`from proxy import x` gives proxy.x)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{a.name}" for a in node.names] if node.module == "proxy" else [node.module]
    return names


def top_level_imports(path: Path) -> list[str]:
    """The modules `path` imports at module level (not inside a function or class)."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


MODULES = sorted(PACKAGE.rglob("*.py"))
SIMULATOR_MODULES = sorted(SIMULATOR.rglob("*.py"))


def own_part(path: Path, package: Path = PACKAGE) -> str:
    return path.relative_to(package).parts[0].removesuffix(".py")


def test_every_module_has_a_layer() -> None:
    assert MODULES and {own_part(p) for p in MODULES if own_part(p) != "__init__"} <= set().union(*LAYERS)
    parts = {own_part(p, SIMULATOR) for p in SIMULATOR_MODULES if own_part(p, SIMULATOR) != "__init__"}
    assert SIMULATOR_MODULES and parts <= set().union(*SIMULATOR_LAYERS)


def test_imports_point_down() -> None:
    upward = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in MODULES if own_part(path) != "__init__"
        for name in imports(path)
        if name.startswith("proxy.") and layer_of(name.split(".")[1]) > layer_of(own_part(path))
    ]  # fmt: skip
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_simulator_imports_point_down() -> None:
    upward = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in SIMULATOR_MODULES if own_part(path, SIMULATOR) != "__init__"
        for name in imports(path)
        if name.startswith("simulator.") and layer_of(name.split(".")[1], SIMULATOR_LAYERS)
        > layer_of(own_part(path, SIMULATOR), SIMULATOR_LAYERS)
    ]  # fmt: skip
    assert not upward, "imports from a higher layer of the simulator:\n" + "\n".join(upward)


def test_the_simulator_borrows_nothing_of_the_guard() -> None:
    """The simulator reads bodies, converts Responses and Messages requests and renders prompts on its own: had it
    the guard's readers, a test of the guard against it would agree with any bug of theirs."""
    borrowed = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in SIMULATOR_MODULES
        for name in imports(path)
        if name.split(".")[0] == "proxy" and name not in FROM_PROXY | STILL_BORROWED
    ]  # fmt: skip
    assert not borrowed, "the simulator borrowing from proxy/:\n" + "\n".join(borrowed)


def test_proxy_reaches_the_simulator_only_from_the_command_layer_lazily() -> None:
    """A production install carries neither the simulator nor its libraries (the simulator extra): only `simulate`
    and `demo` need them, and they import them when run."""
    outside = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in MODULES if own_part(path) not in COMMANDS
        for name in imports(path) if name.split(".")[0] in {"simulator", "starlette", "httpx", "multipart"}
    ]  # fmt: skip
    assert not outside, "proxy/ importing the simulator or its libraries:\n" + "\n".join(outside)
    eager = [name for name in top_level_imports(PACKAGE / "cli.py") if name.split(".")[0] == "simulator"]
    eager += [name for name in top_level_imports(PACKAGE / "cli.py") if name == "proxy.demo"]
    assert not eager, f"cli.py imports the simulator when loaded: {eager}"


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
        for path in MODULES
        for name in imports(path) if name.split(".")[0] in {"pickle", "torch", "dill", "cloudpickle", "joblib"}
    ]  # fmt: skip
    assert not loading, "modules that could load a pickle:\n" + "\n".join(loading)
