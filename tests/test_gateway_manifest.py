"""The Kubernetes gateway example (deploy/kubernetes/token-guard-gateway.yaml): guard replicas in front of a vLLM
Service sharing one budget through the Redis beside them. Its settings load, the Redis URL names the Redis Service
and port, the probes and ports agree with the image, the Services select what they should, and a guard told to stop
pauses for the endpoints to drop it, then drains within the pod's grace period."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from proxy.settings import ServerSettings, load_settings
from tests.support.dockerfile import image_env, image_user
from tests.support.manifests import env_of, grace_s, named_port, pre_stop_s

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "deploy" / "kubernetes" / "token-guard-gateway.yaml"


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def container(deployment: str, name: str) -> dict[str, Any]:
    spec = objects()["Deployment", deployment]["spec"]["template"]["spec"]
    found: list[dict[str, Any]] = [c for c in spec["containers"] if c["name"] == name]
    assert len(found) == 1
    return found[0]


def guard() -> dict[str, Any]:
    return container("llm-gateway", "token-guard")


def test_the_keys_come_from_a_secret_the_pod_starts_without() -> None:
    secret = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in guard()["env"] if "valueFrom" in item}
    assert set(secret) == {"TOKEN_GUARD_SERVER_METRICS_API_KEY", "TOKEN_GUARD_SERVER_ADMIN_API_KEYS"}
    assert all(ref["name"] == "token-guard-keys" and ref["optional"] for ref in secret.values())
    settings = load_settings(environ=env_of(guard()))
    assert settings.server.metrics_api_key and settings.server.admin_api_keys


def test_the_guards_settings_load_and_share_a_budget_through_redis() -> None:
    settings = load_settings(environ=env_of(guard()))
    assert settings.redis.url and settings.admission.max_inflight_tokens not in (0, "0")
    assert settings.server.host == "0.0.0.0" and settings.server.workers > 1
    assert [urlparse(url).hostname for url in settings.upstream.urls] == ["vllm"]  # the vLLM Service, not a pod
    assert objects()["Deployment", "llm-gateway"]["spec"]["replicas"] > 1


def test_the_redis_url_names_the_redis_service_and_its_port() -> None:
    url = urlparse(load_settings(environ=env_of(guard())).redis.url or "")
    host = str(url.hostname)
    service = objects()["Service", host]
    (port,) = service["spec"]["ports"]
    assert port["port"] == url.port
    redis = container(host, "redis")
    assert named_port(redis, port["targetPort"]) == url.port == 6379
    labels = objects()["Deployment", host]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert redis["args"][:4] == ["--save", "", "--appendonly", "no"]  # leases of seconds: nothing kept on disk


def test_probes_ports_and_the_service_agree_with_the_image() -> None:
    c = guard()
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c[kind]["httpGet"]
        assert probe["path"] == ("/livez" if kind == "livenessProbe" else "/health")
        assert named_port(c, probe["port"]) == ServerSettings().port
    service = objects()["Service", "llm-gateway"]
    deployment = objects()["Deployment", "llm-gateway"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert all(named_port(c, p["targetPort"]) == ServerSettings().port for p in service["spec"]["ports"])


def test_a_stopping_guard_drains_within_the_pods_grace_period() -> None:
    pod = objects()["Deployment", "llm-gateway"]["spec"]["template"]["spec"]
    settings = load_settings(environ=env_of(guard()))
    assert pre_stop_s(guard()) > 0  # the endpoints drop the pod before its SIGTERM closes the port
    assert pre_stop_s(guard()) + settings.server.drain_timeout_s + 1 <= grace_s(pod)  # + 1 s: the stop itself


def test_resources_and_security() -> None:
    for c in (guard(), container("token-guard-redis", "redis")):
        assert c["resources"]["requests"] and c["resources"]["limits"]
        assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert str(guard()["securityContext"]["runAsUser"]) == image_user().partition(":")[0]
    mounts = {m["name"]: m for m in guard()["volumeMounts"]}
    assert mounts["models"]["readOnly"] is True
    assert image_env()["HF_HOME"].startswith("/tmp/") and mounts["tmp"]["mountPath"] == "/tmp"
