"""Real Redis topologies on loopback for the Redis-mode tests: a Sentinel-managed master with one
replica, and a three-master Cluster. Built from the `redis-server` binary alone (`--sentinel` is the
same binary as `redis-sentinel`); every wait is bounded, every process is stopped by PID."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.support import free_port, wait_until


def _binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError("redis-server is not installed: run `make test` (it installs it)")
    return path


def _cli(port: int, *args: str) -> str:
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli is not installed (Debian package redis-tools, with redis-server)")
    out = subprocess.run(
        [cli, "-p", str(port), *args], capture_output=True, text=True, timeout=10, check=False
    )
    return out.stdout


class _Processes:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="redis-topology-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def server(self, port: int, *args: str) -> None:
        self.procs[port] = subprocess.Popen(
            [_binary(), *args],
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # PONG, or NOAUTH from a server with a password: either way it is up
        wait_until(
            lambda: _cli(port, "PING").strip() in ("PONG", "NOAUTH Authentication required."),
            10,
            what=f"redis on :{port}",
        )

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


_COMMON = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no")


class SentinelSetup(_Processes):
    """A master, one replica and one Sentinel (quorum 1) that fails over within ~2 s."""

    service_name = "gwmaster"

    def start(self) -> SentinelSetup:
        self.master_port, self.replica_port, self.sentinel_port = free_port(), free_port(), free_port()
        # no 5 s wait for more replicas before a diskless full sync
        self.server(
            self.master_port, "--port", str(self.master_port), *_COMMON, "--repl-diskless-sync-delay", "0"
        )
        self.server(
            self.replica_port,
            *("--port", str(self.replica_port), *_COMMON),
            *("--replicaof", "127.0.0.1", str(self.master_port)),
        )
        wait_until(
            lambda: "master_link_status:up" in _cli(self.replica_port, "INFO", "replication"),
            10,
            what="replica in sync",
        )
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\n"
            f"sentinel monitor {self.service_name} 127.0.0.1 {self.master_port} 1\n"
            f"sentinel down-after-milliseconds {self.service_name} 400\n"
            f"sentinel failover-timeout {self.service_name} 3000\n"
        )
        self.server(self.sentinel_port, str(conf), "--sentinel")
        wait_until(
            lambda: "slaves=1" in _cli(self.sentinel_port, "INFO", "sentinel"),
            10,
            what="sentinel sees the replica",
        )
        return self

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{self.sentinel_port}"]

    def __enter__(self) -> SentinelSetup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ClusterSetup(_Processes):
    """Three masters, no replicas, all 16384 slots assigned."""

    def start(self) -> ClusterSetup:
        self.ports = [free_port() for _ in range(3)]
        for port in self.ports:
            self.server(
                port,
                *("--port", str(port), *_COMMON),
                *("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"),
                *("--cluster-node-timeout", "2000"),
                # the bus port defaults to port + 10000, which may be taken or past 65535
                *("--cluster-port", str(free_port())),
            )
        _cli(
            self.ports[0],
            *("--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports)),
            *("--cluster-replicas", "0", "--cluster-yes"),
        )
        wait_until(
            lambda: all("cluster_state:ok" in _cli(p, "CLUSTER", "INFO") for p in self.ports),
            15,
            what="cluster state ok",
        )
        return self

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def __enter__(self) -> ClusterSetup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
