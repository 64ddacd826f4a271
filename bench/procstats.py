"""CPU time and memory of a process and its descendants, read from /proc (Linux only)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    cpu_s: float  # user + system time of the whole tree since it started
    rss_mb: float  # resident now, summed over the tree
    peak_mb: float  # VmHWM (peak resident since start or the last reset), summed over the tree


def tree(pid: int) -> list[int]:
    """`pid` and every descendant still alive (nginx's workers, uvicorn's, LiteLLM's)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(_stat(int(entry.name))[1], []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _stat(pid: int) -> tuple[float, int]:
    """(user + system seconds, parent pid) from /proc/<pid>/stat; the command name may hold spaces."""
    text = (PROC / str(pid) / "stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, int(fields[1])


def _status_mb(pid: int, key: str) -> float:
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def resident_mb(pid: int) -> float:
    """The resident memory of `pid` alone (not its descendants)."""
    with contextlib.suppress(OSError):
        return _status_mb(pid, "VmRSS")
    return 0.0


def usage(pid: int) -> Usage:
    cpu = rss = peak = 0.0
    for member in tree(pid):
        with contextlib.suppress(OSError):
            cpu += _stat(member)[0]
            rss += _status_mb(member, "VmRSS")
            peak += _status_mb(member, "VmHWM")
    return Usage(cpu, rss, peak)


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (writing 5 to clear_refs; needs Linux 4.0+ and the same user)."""
    for member in tree(pid):
        with contextlib.suppress(OSError):
            (PROC / str(member) / "clear_refs").write_text("5")


def run_s(pid: int, descendants: bool = True) -> float:
    """Seconds on a CPU of every thread now alive of `pid` (and of its descendants), from each thread's schedstat
    (nanoseconds, where utime and stime count 10 ms ticks): fine enough for one request. A thread that ended in
    between is missing from it; `usage(pid).cpu_s` counts it, in ticks."""
    total = 0
    for member in tree(pid) if descendants else [pid]:
        with contextlib.suppress(OSError):
            for task in (PROC / str(member) / "task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9
