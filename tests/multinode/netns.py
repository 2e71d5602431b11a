"""Nodes with addresses of their own on one machine: Linux network namespaces joined by veths to a bridge.

Each node is a network namespace whose ``eth0`` (one end of a veth pair) has an
address in 198.18.0.0/15, the range reserved for network tests; the other end is
a port of a bridge in the root namespace, which holds the subnet's first address,
so the tests (in the root namespace) reach every node.  A node's processes are
started with ``ip netns exec``; ``ip netns pids`` names every process inside a
namespace, which is how a node is killed (all its processes) and how teardown
finds what to end, by PID.  Taking a node's veth down cuts it off from the
others and from the tests (a partition); up again restores it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field


class Unavailable(Exception):
    """Namespaces cannot be built here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why namespaces, veths and a bridge cannot be made here, or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe_ns, probe_br = f"mnprobe{os.getpid()}", f"mnpb{os.getpid() % 100000}"
    try:
        made = _ip("netns", "add", probe_ns, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        inside = subprocess.run(["ip", "netns", "exec", probe_ns, "true"], capture_output=True, text=True, timeout=30)
        if inside.returncode != 0:
            return f"cannot run a process in a network namespace: {inside.stderr.strip()}"
        bridge = _ip("link", "add", probe_br, "type", "bridge", check=False)
        if bridge.returncode != 0:
            return f"cannot create a bridge: {bridge.stderr.strip()}"
        veth = _ip(
            "link", "add", f"{probe_br}v", "type", "veth", "peer", "name", "eth0", "netns", probe_ns, check=False
        )
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run `ip`: {exc}"
    finally:
        _ip("link", "del", f"{probe_br}v", check=False)
        _ip("link", "del", probe_br, check=False)
        _ip("netns", "del", probe_ns, check=False)
    return None


def _free_subnet() -> str:
    """A /24 of 198.18.0.0/15 that no interface or route here uses (other test runs may hold some)."""
    used = _ip("-o", "-4", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    start = os.getpid() % 512
    for i in range(512):
        n = (start + i) % 512
        prefix = f"198.{18 + n // 256}.{n % 256}."
        if prefix not in used:
            return prefix
    raise Unavailable("no free /24 in 198.18.0.0/15")


@dataclass
class Node:
    name: str  # "n1", "n2", ...
    netns: str
    veth: str  # the root namespace's end, a bridge port
    address: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


class Network:
    """A bridge and ``count`` nodes on it; ``close()`` removes everything it made, whatever state it is in."""

    def __init__(self, count: int) -> None:
        self.tag = f"mn{os.getpid() % 100000}"
        self.bridge = f"{self.tag}br"
        self.nodes: list[Node] = []
        prefix = _free_subnet()
        self.gateway_address = prefix + "1"
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(1, count + 1):
                node = Node(f"n{i}", f"{self.tag}n{i}", f"{self.tag}v{i}", f"{prefix}{10 + i}")
                self.nodes.append(node)
                _ip("netns", "add", node.netns)
                _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
                _ip("link", "set", node.veth, "master", self.bridge)
                _ip("link", "set", node.veth, "up")
                self.exec_ip(node, "addr", "add", f"{node.address}/24", "dev", "eth0")
                self.exec_ip(node, "link", "set", "eth0", "up")
                self.exec_ip(node, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def exec_ip(self, node: Node, *args: str) -> None:
        _ip("-n", node.netns, *args)

    def popen(self, node: Node, cmd: Sequence[str], log: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``cmd`` inside ``node`` (its own session, output to ``log``)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", node.netns, *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        node.procs.append(proc)
        return proc

    def run(self, node: Node, cmd: Sequence[str], env: dict[str, str], timeout_s: float) -> str:
        """Run ``cmd`` inside ``node`` to completion; its output (raises when it fails)."""
        done = subprocess.run(
            ["ip", "netns", "exec", node.netns, *cmd], capture_output=True, text=True, env=env, timeout=timeout_s
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} in {node.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def pids(self, node: Node) -> list[int]:
        """Every process inside the node's namespace."""
        out = _ip("netns", "pids", node.netns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill(self, node: Node) -> int:
        """The node dies: SIGKILL to every process inside it, until none is left; how many there were."""
        killed: set[int] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = self.pids(node)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.2)
        for proc in node.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        return len(killed)

    def cut(self, node: Node) -> None:
        """Partition: the node's link to the bridge goes down (it keeps running, unreachable)."""
        _ip("link", "set", node.veth, "down")

    def restore(self, node: Node) -> None:
        _ip("link", "set", node.veth, "up")

    def close(self) -> None:
        """Kill every process in the nodes, then remove the namespaces, veths and the bridge."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.kill(node)
            _ip("link", "del", node.veth, check=False)
            _ip("netns", "del", node.netns, check=False)
        _ip("link", "del", self.bridge, check=False)
