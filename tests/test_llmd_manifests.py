"""The llm-d examples (deploy/llm-d/): token-guard as the render service of llm-d's endpoint picker, in the picker's
pod (token-guard-render-sidecar.yaml) or as a Service its replicas share (token-guard-render-service.yaml). The
picker's token-producer URL reaches the guard's port, its modelName is a model the guard renders, the guard's
settings from its ConfigMap load and name tokenizers on the volume it mounts, the probes ask /health on that port,
and the picker is the one the gateway's InferencePool (deploy/kubernetes/token-guard-inference-pool.yaml) names."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from proxy.settings import Settings, load_settings
from tests.support.dockerfile import image_user
from tests.support.manifests import env_of, grace_s, named_port, pre_stop_s

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "deploy" / "llm-d"
SIDECAR = HERE / "token-guard-render-sidecar.yaml"
SERVICE = HERE / "token-guard-render-service.yaml"
VARIANTS = [SIDECAR, SERVICE]
POOL = ROOT / "deploy" / "kubernetes" / "token-guard-inference-pool.yaml"


def objects(*paths: Path) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in found, f"{key} twice"
                found[key] = doc
    return found


def pod(found: dict[tuple[str, str], dict[str, Any]], deployment: str) -> dict[str, Any]:
    spec: dict[str, Any] = found["Deployment", deployment]["spec"]["template"]["spec"]
    return spec


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in spec["containers"] if c["name"] == name]
    assert isinstance(found, dict)
    return found


def guard_deployment(found: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The Deployment whose pod runs `token-guard render`."""
    (name,) = [
        key[1]
        for key, doc in found.items()
        if key[0] == "Deployment"
        and any(c.get("args") == ["render"] for c in doc["spec"]["template"]["spec"]["containers"])
    ]
    return name


def guard(found: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    return container(pod(found, guard_deployment(found)), "token-guard")


def mounted_file(found: dict[tuple[str, str], dict[str, Any]], deployment: str, c: dict[str, Any], path: str) -> str:
    """The text of the ConfigMap key a container sees at `path`, through its volume mounts."""
    volumes = {v["name"]: v for v in pod(found, deployment)["volumes"]}
    for mount in c["volumeMounts"]:
        directory = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(directory) and "configMap" in volumes[mount["name"]]:
            config_map = found["ConfigMap", volumes[mount["name"]]["configMap"]["name"]]
            text: str = config_map["data"][path.removeprefix(directory)]
            return text
    raise AssertionError(f"nothing mounted at {path}")


def guard_toml(found: dict[tuple[str, str], dict[str, Any]]) -> str:
    c = guard(found)
    return mounted_file(found, guard_deployment(found), c, env_of(c)["TOKEN_GUARD_CONFIG"])


def guard_settings(found: dict[tuple[str, str], dict[str, Any]], tmp_path: Path) -> Settings:
    """The guard's settings as its container loads them: the ConfigMap's file, the container's environment, and what
    `token-guard render` adds (render.only, render.local)."""
    path = tmp_path / "config.toml"
    path.write_text(guard_toml(found))
    environ = {k: v for k, v in env_of(guard(found)).items() if k != "TOKEN_GUARD_CONFIG"}
    return load_settings({"render.only": True, "render.local": True}, environ=environ, config_file=path)


def epp_config(found: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """The picker's EndpointPickerConfig, read from the file its --config-file names."""
    epp = container(pod(found, "vllm-pool-epp"), "epp")
    (flag,) = [arg for arg in epp["args"] if arg.startswith("--config-file=")]
    config: dict[str, Any] = yaml.safe_load(mounted_file(found, "vllm-pool-epp", epp, flag.partition("=")[2]))
    return config


def plugin(config: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = [p for p in config["plugins"] if p["type"] == kind]
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_the_guard_settings_load_and_name_tokenizers_on_its_volume(variant: Path, tmp_path: Path) -> None:
    found = objects(HERE / "epp.yaml", variant)
    settings = guard_settings(found, tmp_path)
    assert settings.server.host == "0.0.0.0" and not settings.server.api_keys  # the token-producer sends no key
    mounts = [m["mountPath"].rstrip("/") + "/" for m in guard(found)["volumeMounts"] if m["name"] == "models"]
    assert settings.models and mounts
    for model in settings.models:
        assert model.max_model_len and model.tokenizer.startswith(mounts[0])


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_the_guard_answers_render_locally(variant: Path, tmp_path: Path) -> None:
    found = objects(HERE / "epp.yaml", variant)
    path = tmp_path / "config.toml"
    path.write_text(guard_toml(found))
    assert load_settings(environ={}, config_file=path).render.local is True  # the ConfigMap's own, under serve too
    assert guard(found).get("args") == ["render"]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_the_token_producer_reaches_the_guard_for_a_model_it_renders(variant: Path, tmp_path: Path) -> None:
    found = objects(HERE / "epp.yaml", variant)
    settings = guard_settings(found, tmp_path)
    producer = plugin(epp_config(found), "token-producer")["parameters"]
    assert producer["modelName"] in [m.name for m in settings.models]
    url = urlparse(producer["vllm"]["url"])
    assert url.scheme == "http" and url.path in ("", "/")  # llm-d appends /v1/[chat/]completions/render, no TLS
    c = guard(found)
    (port,) = [p["containerPort"] for p in c["ports"]]
    assert port == settings.server.port
    if variant == SIDECAR:
        assert guard_deployment(found) == "vllm-pool-epp"  # in the picker's pod
        assert url.hostname == "127.0.0.1" and url.port == port
        (rule,) = found["NetworkPolicy", "vllm-pool-epp"]["spec"]["ingress"]
        picker = container(pod(found, "vllm-pool-epp"), "epp")
        opened = {p["port"] for p in rule["ports"]}
        assert port not in opened and opened == {p["containerPort"] for p in picker["ports"]}  # the guard's: loopback
    else:
        name, namespace, svc = str(url.hostname).split(".")
        service = found["Service", name]
        assert svc == "svc" and service["metadata"]["namespace"] == namespace
        (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
        assert named_port(c, service_port["targetPort"]) == port
        labels = found["Deployment", guard_deployment(found)]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        epp_labels = found["Deployment", "vllm-pool-epp"]["spec"]["template"]["metadata"]["labels"]
        (rule,) = found["NetworkPolicy", name]["spec"]["ingress"]
        assert [p["port"] for p in rule["ports"]] == [port]  # only the pickers reach it
        assert all(peer["podSelector"]["matchLabels"].items() <= epp_labels.items() for peer in rule["from"])


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_the_picker_config_refers_only_to_plugins_it_declares(variant: Path) -> None:
    config = epp_config(objects(HERE / "epp.yaml", variant))
    assert config["apiVersion"] == "llm-d.ai/v1alpha1" and config["kind"] == "EndpointPickerConfig"
    declared = [p.get("name", p["type"]) for p in config["plugins"]]
    assert len(set(declared)) == len(declared)
    refs = [ref["pluginRef"] for profile in config["schedulingProfiles"] for ref in profile["plugins"]]
    refs += [ref["pluginRef"] for source in config["dataLayer"]["sources"] for ref in [source, *source["extractors"]]]
    assert set(refs) <= set(declared)
    scorer = plugin(config, "prefix-cache-scorer")["parameters"]
    assert scorer["prefixMatchInfoProducerName"] in declared  # the precise producer, fed by the token-producer
    assert "vllm" in plugin(config, "token-producer")["parameters"]  # not the estimate backend's 4 bytes a token


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_the_picker_is_the_one_the_gateways_pool_names(variant: Path) -> None:
    found = objects(HERE / "epp.yaml", variant)
    pools = [doc for (kind, _), doc in objects(POOL).items() if kind == "InferencePool"]
    (pool,) = pools
    ref = pool["spec"]["endpointPickerRef"]
    service = found["Service", ref["name"]]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    epp = container(pod(found, ref["name"]), "epp")
    assert f"--grpc-port={port['targetPort']}" in epp["args"]
    assert f"--pool-name={pool['metadata']['name']}" in epp["args"]
    namespaces = {doc["metadata"]["namespace"] for doc in found.values()}
    assert namespaces == {"llm-d"} and "--pool-namespace=llm-d" in epp["args"]
    spec = pod(found, ref["name"])
    account = found["ServiceAccount", spec["serviceAccountName"]]
    (binding,) = [doc for (kind, _), doc in found.items() if kind == "RoleBinding"]
    (subject,) = binding["subjects"]
    assert (subject["kind"], subject["name"], subject["namespace"]) == (
        "ServiceAccount",
        account["metadata"]["name"],
        "llm-d",
    )
    selector = found["Deployment", ref["name"]]["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"].items() <= selector.items()


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_probes_resources_and_a_drain_within_the_grace_period(variant: Path, tmp_path: Path) -> None:
    found = objects(HERE / "epp.yaml", variant)
    c = guard(found)
    settings = guard_settings(found, tmp_path)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
        assert named_port(c, c[probe]["httpGet"]["port"]) == settings.server.port
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert str(c["securityContext"]["runAsUser"]) == image_user().partition(":")[0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["name"]: m for m in c["volumeMounts"]}["models"]["readOnly"] is True
    spec = pod(found, guard_deployment(found))
    assert pre_stop_s(c) > 0 and pre_stop_s(c) + settings.server.drain_timeout_s + 1 <= grace_s(spec)


def test_the_readme_and_the_manual_name_files_that_exist() -> None:
    for text in ((HERE / "README.md").read_text(), (ROOT / "docs" / "llm-d.md").read_text()):
        for name in ("epp.yaml", SIDECAR.name, SERVICE.name, POOL.name):
            assert name in text
    assert "llm-d.md" in (ROOT / "mkdocs.yml").read_text()
