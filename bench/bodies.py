"""`python -m bench bodies`: what the largest bodies cost the guard. `token-guard serve` runs in a process of its own
in front of the simulator (a fresh one per case, its body parser's child process already started); each case posts
its body and reports the answer's status and time, the guard's RSS before, at its peak and after (from /proc), the
peak of the guard and its child processes together (sampled every 20 ms; and the sum of each one's own peak, which
they need not reach at once, so never below the true one), and the slowest /livez answered meanwhile (a loop held by
the work shows there).

A case is `kind:amount`, optionally followed by `xN` for N such bodies posted at once:

- `reject:31`, `chunk:31`, `truncate:8`: a chat prompt of that many MiB of fresh random words (no cache helps), under
  that overflow policy;
- `arrays:32`, `objects:4`: a small chat request with an unused field of `[]` (or `{}`) that fills the body to that
  many MiB less 4 KiB (32: just under server.max_body_bytes; 4: just under the size parsed in a child process);
- `ids:131000`: a completions prompt of that many token ids, in a window 16 tokens longer, with a `max_tokens` that
  the guard clamps (so it writes the body back);
- `utf16:31.5`: the `arrays` body in UTF-16-LE, which json.loads reads too, behind a field holding "∀" (U+2200, whose
  bytes 00 22 hold a quote to a scan of the body as UTF-8 bytes);
- `audio:25`: a transcription form (multipart) of that many MiB of WAV audio, whose limit the guard passes (the
  simulator answers 4 tokens), as the OpenAI SDK sends it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.isolated import LOOP_VALUES
from proxy.server.running import bind_socket

MODEL = "tiny"
POLICIES = ("reject", "truncate", "chunk")
FILLERS = {"arrays": b"[]", "objects": b"{}"}
MARGIN = 4096  # filled bodies stop this far below their size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default="reject:31,truncate:8,reject:8,arrays:32,objects:32,objects:4,ids:131000",
                        help="comma-separated kind:amount[xN] (see the module's docstring)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    tokenizer = write_demo_tokenizer_dir(Path(tempfile.mkdtemp(prefix="bench-bodies-")))
    print("| case | body | status | answered in | guard RSS before | peak | after | guard + children peak "
          "| sum of their peaks | slowest /livez meanwhile |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        print(measure(tokenizer, case), flush=True)
    return 0


def measure(tokenizer: Path, case: str) -> str:
    kind, _, amount = case.partition(":")
    amount, _, times = amount.partition("x")
    path, body, window = _request(kind, float(amount))
    content_type = "application/json"
    if kind == "audio":
        body, content_type = _audio_form(float(amount))
    sim_port, guard_port = _free_port(), _free_port()
    run = [sys.executable, "-m", "proxy"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    sim = subprocess.Popen([*run, "simulate", "--tokenizer", str(tokenizer), "--model", MODEL, "--profile", "0.31",
                            "--max-model-len", window, "--port", str(sim_port)],
                           **quiet)  # type: ignore[call-overload]  # fmt: skip
    env = {**os.environ, "TOKEN_GUARD_POLICY_ON_OVERFLOW": kind if kind in POLICIES else "reject"}
    guard = subprocess.Popen([*run, "serve", "--upstream", f"http://127.0.0.1:{sim_port}", "--model", MODEL,
                              "--tokenizer", str(tokenizer), "--max-model-len", window, "--port", str(guard_port),
                              "--log-level", "warning"], env=env, **quiet)  # type: ignore[call-overload]  # fmt: skip
    url = f"http://127.0.0.1:{guard_port}"
    try:
        _wait_ready(url)
        # the body parser's child process, spawned on first use: running from here on, so that the peaks are the
        # body's (and a fork not yet turned into the child does not count the guard's pages twice)
        _post(url + "/v1/completions", json.dumps({"model": MODEL, "prompt": [1] * (LOOP_VALUES + 1)}).encode())
        before = _rss_mb(guard.pid)
        peak, together, slowest, done = [before], [before], [0.0], threading.Event()
        watchers = [threading.Thread(target=_sample, args=(guard.pid, peak, together, done)),
                    threading.Thread(target=_probe, args=(url, slowest, done))]  # fmt: skip
        for watcher in watchers:
            watcher.start()
        started = time.perf_counter()
        with ThreadPoolExecutor(int(times or 1)) as pool:
            answers = list(pool.map(lambda _: _post(url + path, body, content_type), range(int(times or 1))))
        took = time.perf_counter() - started
        done.set()
        for watcher in watchers:
            watcher.join()
        time.sleep(1)
        after = _rss_mb(guard.pid)
        peaks = sum(_rss_mb(pid, "VmHWM") for pid in _family(guard.pid))
        statuses = "/".join(sorted({str(a.status_code) for a in answers}))
        return (
            f"| {case} | {len(body) / 2**20:.1f} MB | {statuses} | {took:.1f} s | {before:.0f} MB | "
            f"{max(peak[0], _rss_mb(guard.pid, 'VmHWM')):.0f} MB | {after:.0f} MB | {together[0]:.0f} MB | "
            f"{peaks:.0f} MB | {slowest[0] * 1000:.0f} ms |"
        )
    finally:
        for process in (guard, sim):
            process.terminate()
            process.wait(timeout=60)


def _request(kind: str, amount: float) -> tuple[str, bytes, str]:
    """The path, the body and the model's window."""
    if kind in POLICIES:
        return "/v1/chat/completions", _chat(_words(amount)), "2048"
    if kind in FILLERS:
        head, tail = _chat("hi")[:-1] + b', "unused": [', b"]}"
        count = (int(amount * 2**20) - MARGIN - len(head) - len(tail) + 1) // (len(FILLERS[kind]) + 1)
        return "/v1/chat/completions", head + b",".join([FILLERS[kind]] * count) + tail, "2048"
    if kind == "utf16":
        text = _chat("hi")[:-1].decode() + ', "hidden": "\u2200", "unused": ['
        count = (int(amount * 2**20) // 2 - len(text) - 2 + 1) // 3
        return "/v1/chat/completions", (text + ",".join(["[]"] * count) + "]}").encode("utf-16-le"), "2048"
    if kind == "ids":
        rng = random.Random(1)
        prompt = [rng.randrange(30_000) for _ in range(int(amount))]
        body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1000}).encode()
        return "/v1/completions", body, str(len(prompt) + 16)
    if kind == "audio":
        return "/v1/audio/transcriptions", b"", "2048"
    raise SystemExit(
        f"unknown case kind {kind!r}: expected one of {', '.join([*POLICIES, *FILLERS, 'ids', 'utf16', 'audio'])}"
    )


def _words(megabytes: float) -> str:
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(50_000)]
    return " ".join(rng.choice(words) for _ in range(int(megabytes * 2**20 / 6.5)))


def _chat(text: str) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 10}).encode()


def _audio_form(megabytes: float) -> tuple[bytes, str]:
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16000)
        audio.writeframes(b"\x01\x00" * int(megabytes * 2**20 / 2))
    data = {"model": MODEL, "max_completion_tokens": "4"}
    request = httpx.Request("POST", "http://x/", data=data, files={"file": ("speech.wav", out.getvalue(), "audio/wav")})
    return request.read(), request.headers["content-type"]


def _post(url: str, body: bytes, content_type: str = "application/json") -> httpx.Response:
    return httpx.post(url, content=body, timeout=600, headers={"content-type": content_type})


def _sample(pid: int, peak: list[float], together: list[float], done: threading.Event) -> None:
    while not done.is_set():
        peak[0] = max(peak[0], _rss_mb(pid))
        together[0] = max(together[0], sum(_rss_mb(p) for p in _family(pid)))
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


def _family(pid: int) -> list[int]:
    """`pid` and every process below it (the body parser, multiprocessing's resource tracker)."""
    found, index = [pid], 0
    while index < len(found):
        try:
            for task in Path(f"/proc/{found[index]}/task").iterdir():
                found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # gone meanwhile
            pass
        index += 1
    return found


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:  # gone meanwhile
        pass
    return 0.0


def _free_port() -> int:
    sock = bind_socket()
    port: int = sock.getsockname()[1]
    sock.close()
    return port
