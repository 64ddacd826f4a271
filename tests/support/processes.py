"""The guard and the simulator in processes of their own, as in production: for tests that measure the guard's memory
or load it with many clients (in the test's process they would share one interpreter lock with the clients)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.servers import MODEL


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory now (VmRSS) or at its peak so far (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise LookupError(field)


def peak_with_children_mb(pid: int) -> float:
    """The peaks (VmHWM) of a process and of every process below it, summed: never below their peak together."""
    return sum(rss_mb(p, "VmHWM") for p in _family(pid))


def reset_peaks(pid: int) -> None:
    """Start the peaks of a process and its children again from their current RSS (Linux: clear_refs 5), so that a
    test sharing a guard with earlier ones measures its own request's peak, not the largest of the module's."""
    for p in _family(pid):
        with suppress(OSError):  # not allowed: the peaks stay the process's whole-life ones (stricter)
            Path(f"/proc/{p}/clear_refs").write_text("5")


def _family(pid: int) -> list[int]:
    pids, index = [pid], 0
    while index < len(pids):
        for task in Path(f"/proc/{pids[index]}/task").iterdir():
            pids += [int(child) for child in (task / "children").read_text().split()]
        index += 1
    return pids


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Stack:
    url: str  # the guard
    sim_url: str
    guard_pid: int
    logs: Path


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "proxy", *command], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=env)  # fmt: skip


@contextmanager
def simulator_process(
    tokenizer: Path, log: Path, flags: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> Iterator[str]:
    """`token-guard simulate` alone on a free loopback port (its URL), as an operator starts it, stopped on the way
    out."""
    port = free_port()
    sim = _start(["simulate", "--tokenizer", str(tokenizer), "--model", MODEL, "--port", str(port), *flags], log,
                 {**os.environ, **(env or {})})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert eventually(lambda: healthy(url), timeout_s=60), log.read_text()
        yield url
    finally:
        sim.terminate()
        sim.wait(timeout=60)


@contextmanager
def guard_and_simulator(
    tokenizer: Path, logs: Path, window: int = 2048, sim_flags: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> Iterator[Stack]:
    """`token-guard simulate` and `token-guard serve` in front of it, on free loopback ports, stopped on the way out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    sim_port, guard_port = free_port(), free_port()
    environ = {**os.environ, **(env or {})}
    sim = _start(["simulate", "--tokenizer", str(tokenizer), "--model", MODEL, "--profile", "0.31", "--max-model-len",
                  str(window), "--port", str(sim_port), *sim_flags], logs / "simulator.log", environ)  # fmt: skip
    sim_url, url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{guard_port}"
    serve = ["serve", "--upstream", sim_url, "--model", MODEL, "--tokenizer", str(tokenizer), "--max-model-len",
             str(window), "--port", str(guard_port), "--log-level", "warning"]  # fmt: skip
    guard = _start(serve, logs / "guard.log", environ)
    try:
        assert eventually(lambda: healthy(url), timeout_s=60), (logs / "guard.log").read_text()
        yield Stack(url, sim_url, guard.pid, logs)
    finally:
        for process in (guard, sim):
            process.terminate()
            process.wait(timeout=60)
