"""`python -m bench bodies`: what the largest bodies cost the guard. `token-guard serve` runs in a process of its own
in front of the simulator; each case posts one chat body of fresh random words (no cache helps) and reports the
answer's status and time, the guard's peak and final RSS (from /proc), and the slowest /livez answered meanwhile
(a loop held by the work shows there)."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from proxy.assets import write_demo_tokenizer_dir
from proxy.server.running import bind_socket

MODEL = "tiny"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default="reject:31,truncate:8,reject:8",
                        help="comma-separated policy:megabytes")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    tokenizer = write_demo_tokenizer_dir(Path(tempfile.mkdtemp(prefix="bench-bodies-")))
    print("| policy | body | status | answered in | guard RSS before | peak | after | slowest /livez meanwhile |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        policy, megabytes = case.split(":")
        print(measure(tokenizer, policy, float(megabytes)), flush=True)
    return 0


def measure(tokenizer: Path, policy: str, megabytes: float) -> str:
    sim_port, guard_port = _free_port(), _free_port()
    run = [sys.executable, "-m", "proxy"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    sim = subprocess.Popen([*run, "simulate", "--tokenizer", str(tokenizer), "--model", MODEL, "--profile", "0.31",
                            "--port", str(sim_port)], **quiet)  # type: ignore[call-overload]  # fmt: skip
    env = {**os.environ, "TOKEN_GUARD_POLICY_ON_OVERFLOW": policy}
    guard = subprocess.Popen([*run, "serve", "--upstream", f"http://127.0.0.1:{sim_port}", "--model", MODEL,
                              "--tokenizer", str(tokenizer), "--max-model-len", "2048", "--port", str(guard_port),
                              "--log-level", "warning"], env=env, **quiet)  # type: ignore[call-overload]  # fmt: skip
    url = f"http://127.0.0.1:{guard_port}"
    try:
        _wait_ready(url)
        body = _body(megabytes)
        before = _rss_mb(guard.pid)
        peak, slowest, done = [before], [0.0], threading.Event()
        watchers = [threading.Thread(target=_sample, args=(guard.pid, peak, done)),
                    threading.Thread(target=_probe, args=(url, slowest, done))]  # fmt: skip
        for watcher in watchers:
            watcher.start()
        started = time.perf_counter()
        response = httpx.post(url + "/v1/chat/completions", content=body, timeout=600,
                              headers={"content-type": "application/json"})  # fmt: skip
        took = time.perf_counter() - started
        done.set()
        for watcher in watchers:
            watcher.join()
        time.sleep(1)
        after = _rss_mb(guard.pid)
        return (
            f"| {policy} | {len(body) / 2**20:.1f} MB | {response.status_code} | {took:.1f} s | {before:.0f} MB | "
            f"{max(peak[0], _rss_mb(guard.pid, 'VmHWM')):.0f} MB | {after:.0f} MB | {slowest[0] * 1000:.0f} ms |"
        )
    finally:
        for process in (guard, sim):
            process.terminate()
            process.wait(timeout=60)


def _body(megabytes: float) -> bytes:
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(50_000)]
    text = " ".join(rng.choice(words) for _ in range(int(megabytes * 2**20 / 6.5)))
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 10}).encode()


def _sample(pid: int, peak: list[float], done: threading.Event) -> None:
    while not done.is_set():
        peak[0] = max(peak[0], _rss_mb(pid))
        time.sleep(0.02)


def _probe(url: str, slowest: list[float], done: threading.Event) -> None:
    with httpx.Client(timeout=600) as client:
        while not done.is_set():
            started = time.perf_counter()
            client.get(url + "/livez")
            slowest[0] = max(slowest[0], time.perf_counter() - started)
            time.sleep(0.02)


def _wait_ready(url: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("the guard did not become ready")


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _free_port() -> int:
    sock = bind_socket()
    port: int = sock.getsockname()[1]
    sock.close()
    return port
