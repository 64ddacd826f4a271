"""The processes of the ceiling comparison: the instant upstream, and in front of it direct, nginx, the smallest Python
relay, token-guard with N workers or LiteLLM; plus the machine's own CPU counter. Reuses bench.systems' helpers."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from bench.envoy import ENVOY_SYSTEMS, envoy_system, start_envoy_system
from bench.procstats import TICKS
from bench.systems import (
    MODEL,
    SYSTEMS,
    Running,
    SetupError,
    Upstream,
    checkout,
    free_port,
    spawn,
    start,
    wait_ready,
)

CEILING_SYSTEMS = ("direct", "nginx", "relay", "token-guard", "token-guard-relayed", "token-guard-2w", "litellm",
                   *ENVOY_SYSTEMS)  # fmt: skip
GUARD_WORKERS = re.compile(r"token-guard-(\d+)w")
OTHER_TREE = "token-guard@"  # token-guard@DIR: the code of another checkout (git worktree add DIR <rev>), 1 worker
RELAYED = "token-guard-relayed"  # token-guard (1 worker) sent the same requests on a relay route of its own: its
RELAYED_PREFIX = "/unguarded"  # cost as a relay alone (request line, metrics, upstream client), nothing counted
RELAYED_PATHS = "/unguarded/v1/chat/completions,/unguarded/v1/completions"  # opened by server.passthrough_paths


def start_instant(workdir: Path, workers: int = 1) -> Running:
    port = free_port()
    argv = [sys.executable, "-m", "bench.instant", "--port", str(port), "--workers", str(workers)]
    process, log = spawn("instant-upstream", argv, workdir)
    running = Running("instant-upstream", f"http://127.0.0.1:{port}", process, log)
    wait_ready(running, "/health")
    return running


def start_relay(upstream: Upstream, workdir: Path) -> Running:
    port = free_port()
    argv = [sys.executable, "-m", "bench.relay", "--upstream", upstream.url, "--port", str(port)]
    process, log = spawn("relay", argv, workdir)
    running = Running("relay", f"http://127.0.0.1:{port}", process, log)
    wait_ready(running, "/health")
    return running


def start_token_guard_workers(
    upstream: Upstream, workdir: Path, workers: int, name: str | None = None, tree: Path | None = None,
    passthrough: str | None = None,
) -> Running:  # fmt: skip
    """token-guard as a user runs it (default settings: one request line per request in its log) with `--workers N`;
    a SetupError that says so when `serve` refuses the flag. `tree`: run the code of another checkout (an earlier
    version, for an A/B in one run)."""
    name = name or ("token-guard" if workers == 1 else f"token-guard-{workers}w")
    port = free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream.url, "--model", MODEL]
    argv += ["--tokenizer", str(upstream.tokenizer), "--max-model-len", str(upstream.max_model_len)]
    argv += ["--port", str(port)] + (["--workers", str(workers)] if workers != 1 else [])
    env = None if tree is None else checkout(name, str(tree))[1]
    if passthrough is not None:  # the routes relayed without guarding (this checkout's setting)
        env = {**(env or os.environ), "TOKEN_GUARD_SERVER_PASSTHROUGH_PATHS": passthrough}
    process, log = spawn(re.sub(r"[^\w.@-]", "_", name), argv, workdir, env, tree)
    running = Running(name, f"http://127.0.0.1:{port}", process, log)
    try:
        wait_ready(running, "/health")
    except SetupError:
        if "--workers" in log.read_text(errors="replace"):
            raise SetupError(f"`token-guard serve` refused `--workers {workers}` (not implemented yet)") from None
        raise
    return running


def start_system(name: str, upstream: Upstream, workdir: Path) -> Running:
    if name == "relay":
        return start_relay(upstream, workdir)
    if name == "token-guard":
        return start_token_guard_workers(upstream, workdir, 1)
    if name.startswith(OTHER_TREE):  # token-guard@/path/to/a/checkout
        tree, _ = checkout(name, name.removeprefix(OTHER_TREE))
        return start_token_guard_workers(upstream, workdir, 1, name, tree)
    if name == RELAYED:  # the load generator posts to <url>/v1/chat/completions: here /unguarded/v1/chat/...
        running = start_token_guard_workers(upstream, workdir, 1, RELAYED, passthrough=RELAYED_PATHS)
        running.url += RELAYED_PREFIX
        return running
    if envoy_system(name) is not None:  # Envoy alone, or with a processor (envoy-extproc@DIR: another checkout's)
        return start_envoy_system(name, upstream, workdir)
    if match := GUARD_WORKERS.fullmatch(name):
        return start_token_guard_workers(upstream, workdir, int(match.group(1)))
    if name in SYSTEMS:
        return start("token-guard" if name == "token-guard-1w" else name, upstream, workdir)
    raise SetupError(f"unknown system {name!r}; choose from {', '.join(CEILING_SYSTEMS)} (or token-guard-<N>w, "
                     "token-guard@<checkout>, envoy-extproc@<checkout>)")  # fmt: skip


def machine_busy_s() -> float:
    """CPU seconds every core spent on anything but idling since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as stat:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS
