"""The processes a comparison runs: the simulator (the upstream), and in front of it nothing (direct), nginx,
token-guard or the LiteLLM proxy, each started as a process of its own on a loopback port and stopped by its pid.

nginx comes from the system (installed with apt when missing and running as root); LiteLLM is installed once, at a
pinned version, into its own virtual environment under ~/.cache/token-guard/.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

LITELLM_VERSION = "1.108.7"
LITELLM_KEY = "sk-bench"
MODEL = "tiny"
SYSTEMS = ("direct", "nginx", "token-guard", "litellm")


class SetupError(RuntimeError):
    """A system cannot be installed or started here; the message says what to do."""


@dataclass
class Running:
    name: str
    url: str
    process: subprocess.Popen[bytes] | None  # None for `direct`: nothing runs in between
    log: Path | None = None
    stop_signal: int = signal.SIGTERM
    helper: subprocess.Popen[bytes] | None = None  # a process the system needs beside its own (Envoy's processor)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self) -> None:
        for process in (self.process, self.helper):
            if process is None or process.poll() is not None:
                continue
            process.send_signal(self.stop_signal)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass(frozen=True)
class Upstream:
    """What every system needs to reach the simulator and to guard its model."""

    url: str
    tokenizer: Path
    max_model_len: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spawn(
    name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log = workdir / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    return process, log


def checkout(name: str, tree: str) -> tuple[Path, dict[str, str]]:
    """Another checkout's directory (system `name`@`tree`, for an A/B in one run) and the environment that runs its
    code; a SetupError when it is not a token-guard checkout."""
    found = Path(tree).resolve()
    if not (found / "proxy" / "__main__.py").is_file():
        raise SetupError(f"{name}: {found} is not a token-guard checkout (no proxy/__main__.py)")
    return found, {**os.environ, "PYTHONPATH": str(found)}


def wait_ready(running: Running, path: str, timeout_s: float = 180.0, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in (running.process, running.helper):
            if process is not None and process.poll() is not None:
                running.stop()
                raise SetupError(f"{running.name} exited during start-up; see {running.log} and the logs beside it")
        try:
            if httpx.get(running.url + path, headers=headers, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    running.stop()
    raise SetupError(f"{running.name} was not ready after {timeout_s:.0f} s; see {running.log}")


def start_simulator(tokenizer: Path, max_model_len: int, ttft_s: float, itl_s: float, workdir: Path) -> Running:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "proxy",
        "simulate",
        "--tokenizer",
        str(tokenizer),
        "--port",
        str(port),
        "--model",
        MODEL,
        "--max-model-len",
        str(max_model_len),
        "--profile",
        "0.32",
        "--ttft",
        str(ttft_s),
        "--itl",
        str(itl_s),
    ]
    process, log = spawn(f"simulator-{ttft_s * 1000:g}ms-{itl_s * 1000:g}ms", argv, workdir)
    running = Running("simulator", f"http://127.0.0.1:{port}", process, log)
    wait_ready(running, "/health")
    return running


def start(name: str, upstream: Upstream, workdir: Path) -> Running:
    if name == "direct":
        return Running("direct", upstream.url, None)
    starters = {"nginx": start_nginx, "token-guard": start_token_guard, "litellm": start_litellm}
    if name not in starters:
        raise SetupError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    return starters[name](upstream, workdir)


def start_token_guard(upstream: Upstream, workdir: Path) -> Running:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--upstream",
        upstream.url,
        "--model",
        MODEL,
        "--tokenizer",
        str(upstream.tokenizer),
        "--max-model-len",
        str(upstream.max_model_len),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    process, log = spawn("token-guard", argv, workdir)
    running = Running("token-guard", f"http://127.0.0.1:{port}", process, log)
    wait_ready(running, "/health")
    return running


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 4m;
    upstream simulator {{
        server {upstream};
        keepalive 128;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://simulator;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("bench: installing nginx with apt-get", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], check=True, env=env)
        return shutil.which("nginx") or "/usr/sbin/nginx"
    raise SetupError(
        "nginx is not installed: run `sudo apt-get install nginx` (Debian/Ubuntu), or leave it out "
        "with --systems direct,token-guard,litellm"
    )


def nginx_version() -> str:
    out = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True).stderr
    return out.strip().rsplit("/", 1)[-1]


def start_nginx(upstream: Upstream, workdir: Path) -> Running:
    home = (workdir / "nginx").resolve()  # nginx reads relative paths from its prefix, not from here
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (home / sub).mkdir(parents=True, exist_ok=True)
        (home / sub).chmod(0o777)  # workers drop to `nobody` when nginx starts as root
    port = free_port()
    conf = home / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=home, upstream=upstream.url.removeprefix("http://"), port=port))
    process, log = spawn("nginx", [nginx_binary(), "-c", str(conf), "-p", str(home)], workdir)
    running = Running("nginx", f"http://127.0.0.1:{port}", process, log, stop_signal=signal.SIGQUIT)
    wait_ready(running, "/health")
    return running


def litellm_home(version: str = LITELLM_VERSION) -> Path:
    return Path.home() / ".cache" / "token-guard" / f"litellm-{version}"


def ensure_litellm(version: str = LITELLM_VERSION) -> Path:
    """The `litellm` command of a virtual environment holding only litellm[proxy]==version (installed once)."""
    home = litellm_home(version)
    if not (home / ".installed").exists():
        print(f"bench: installing litellm[proxy]=={version} into {home} (once; a few minutes)", file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
        pip = [str(home / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"litellm[proxy]=={version}"], check=True)
        (home / ".installed").touch()
    return home / "bin" / "litellm"


def start_litellm(upstream: Upstream, workdir: Path) -> Running:
    command = ensure_litellm()
    config = {  # JSON is YAML: no YAML writer needed
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {"model": f"openai/{MODEL}", "api_base": f"{upstream.url}/v1", "api_key": "x"},
            }
        ],
        "general_settings": {"master_key": LITELLM_KEY},
        "litellm_settings": {"telemetry": False},
    }
    path = workdir / "litellm.yaml"
    path.write_text(json.dumps(config, indent=2))
    port = free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"}
    argv = [str(command), "--config", str(path), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    process, log = spawn("litellm", argv, workdir, env)
    running = Running("litellm", f"http://127.0.0.1:{port}", process, log)
    wait_ready(running, "/health/liveliness", timeout_s=300)
    return running
