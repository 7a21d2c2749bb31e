"""Tune with more than one machine: MetaSchedule's candidates measured through TVM's RPC tracker.

The machine that searches (builds candidates, runs the cost model) need not be the one that
measures them. An RPC **tracker** keeps a queue of RPC **servers**, each registered under a device
**key** (e.g. ``znver5``, or ``rpi4`` for a board); ``RPCRunner`` asks the tracker for a free
server of that key for every candidate, uploads the built library, and times it there. More
servers under one key measure more candidates at once.

In a classroom::

    python -m helpers.rpc_tuning tracker --port 9190                      # one machine
    python -m helpers.rpc_tuning server --tracker HOST:9190 --key znver5   # every idle machine
    python -m helpers.rpc_tuning queue --tracker HOST:9190                 # who is registered

Then ``tune(mod, target, work_dir, trials, tracker="HOST:9190", key="znver5")``. Servers must
have the same CPU as the target (the key says which), and the same TVM.

Introduced on Day 8.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm import rpc
from tvm.s_tir import meta_schedule as ms

from . import tuning
from .errors import CourseError


@dataclass
class LocalCluster:
    """A tracker and its servers started on this machine as subprocesses; ``close()`` ends them."""

    host: str
    port: int
    key: str
    tracker: subprocess.Popen
    servers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        # TVM's tracker and servers each serve from a worker process of their own: end whole groups
        for proc in [*self.servers, self.tracker]:
            _signal_group(proc, signal.SIGTERM)
        for proc in [*self.servers, self.tracker]:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _start(args: list[str]) -> subprocess.Popen:
    """A TVM RPC process in a group of its own: it serves from a worker process it forks."""
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal ``proc``'s whole group (``_start``'s), worker processes and all."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _parse(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CourseError(f"a tracker address is HOST:PORT, e.g. 127.0.0.1:9190; got {address!r}.")
    return host, int(port)


def start_tracker(port: int | None = None, host: str = "127.0.0.1") -> tuple[subprocess.Popen, int]:
    """Start ``python -m tvm.exec.rpc_tracker`` on ``port`` (a free one by default); wait until it answers."""
    port = port or free_port()
    proc = _start(["tvm.exec.rpc_tracker", "--host", host, "--port", str(port), "--port-end", str(port + 1)])
    deadline = time.monotonic() + 30
    while True:
        try:  # the socket first: TVM's connect waits 5 s between retries
            socket.create_connection((host, port), timeout=1).close()
            rpc.connect_tracker(host, port).summary()
            return proc, port
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                _signal_group(proc, signal.SIGKILL)
                raise CourseError(f"the RPC tracker did not start on {host}:{port} (port taken?).") from None
            time.sleep(0.2)


def start_server(tracker: str, key: str, host: str = "127.0.0.1") -> subprocess.Popen:
    """Start ``python -m tvm.exec.rpc_server`` registered under ``key`` at ``tracker`` (HOST:PORT)."""
    port = free_port()
    return _start(["tvm.exec.rpc_server", "--host", host, "--port", str(port), "--port-end", str(port + 1),
                   "--tracker", tracker, "--key", key])


def free_servers(tracker: str, key: str) -> int:
    """How many servers under ``key`` the tracker holds free now; a clear error when it is not reachable."""
    host, port = _parse(tracker)
    try:  # TVM's own connect retries for 60 s: ask the socket first
        socket.create_connection((host, port), timeout=3).close()
        summary = rpc.connect_tracker(host, port).summary()
    except Exception as err:
        raise CourseError(
            f"no RPC tracker answers at {tracker} ({type(err).__name__}). Start one with "
            f"`python -m helpers.rpc_tuning tracker --port {port}` and check the address and firewall."
        ) from None
    return int(summary.get("queue_info", {}).get(key, {}).get("free", 0))


def queue(tracker: str) -> dict:
    """The tracker's queue: for each key, its free and pending servers (``summary()['queue_info']``)."""
    host, port = _parse(tracker)
    free_servers(tracker, "")  # the reachability error
    return dict(rpc.connect_tracker(host, port).summary().get("queue_info", {}))


def start_local(servers: int, key: str = "local") -> LocalCluster:
    """A tracker and ``servers`` servers on localhost, waited for until all are registered."""
    tracker, port = start_tracker()
    cluster = LocalCluster("127.0.0.1", port, key, tracker)
    try:
        cluster.servers = [start_server(cluster.address, key) for _ in range(servers)]
        deadline = time.monotonic() + 60
        while free_servers(cluster.address, key) < servers:
            if time.monotonic() > deadline:
                raise CourseError(f"only {free_servers(cluster.address, key)} of {servers} RPC servers registered in 60 s.")
            time.sleep(0.2)
    except BaseException:
        cluster.close()
        raise
    return cluster


def runner(tracker: str, key: str, workers: int | None = None, timeout_s: int = 30) -> ms.runner.RPCRunner:
    """An ``RPCRunner`` measuring on ``key``'s servers at ``tracker``; checks one is there first.

    ``workers``: candidates measured at once (default: the free servers of the key now).
    """
    free = free_servers(tracker, key)
    if free < 1:
        raise CourseError(
            f"no free RPC server under key {key!r} at {tracker}. On a machine with the target's CPU run "
            f"`python -m helpers.rpc_tuning server --tracker {tracker} --key {key}`."
        )
    host, port = _parse(tracker)
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                 session_timeout_sec=timeout_s)
    return ms.runner.RPCRunner(rpc_config=config, max_workers=workers or free)


def tune(mod: tvm.IRModule, target: tvm.target.Target, work_dir: str | Path, max_trials_per_task: int,
         tracker: str, key: str, workers: int | None = None, **options) -> Path:
    """``tuning.tune``, with candidates measured on the tracker's servers under ``key``."""
    return tuning.tune(mod, target, work_dir, max_trials_per_task, runner=runner(tracker, key, workers), **options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.rpc_tuning", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tracker", help="run an RPC tracker here")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=9190)
    p = sub.add_parser("server", help="run an RPC server here, registered under KEY")
    p.add_argument("--tracker", required=True, help="HOST:PORT")
    p.add_argument("--key", required=True)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=9090)
    p = sub.add_parser("queue", help="print the tracker's servers per key")
    p.add_argument("--tracker", required=True, help="HOST:PORT")
    args = parser.parse_args(argv)
    if args.command == "tracker":
        return subprocess.call([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", args.host,
                                "--port", str(args.port), "--port-end", str(args.port + 1)])
    if args.command == "server":
        free_servers(args.tracker, args.key)  # the tracker must answer
        return subprocess.call([sys.executable, "-m", "tvm.exec.rpc_server", "--host", args.host,
                                "--port", str(args.port), "--tracker", args.tracker, "--key", args.key])
    try:
        for key, info in sorted(queue(args.tracker).items()):
            print(f"{key}: {info.get('free', 0)} free, {info.get('pending', 0)} pending")
    except CourseError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
