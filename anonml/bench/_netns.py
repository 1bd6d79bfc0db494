"""Linux network namespaces joined by a bridge, with ``tc netem`` on every link (``anonml bench netns``).

One namespace per host: the bench's driver (``ctl``), the aggregator, each
relay and the peers, plus one that holds only the bridge. Each host has one
interface, ``eth0``, with an address from :data:`SUBNET`; its other end is a
port of the bridge. Every bridge port carries ``netem delay D loss L`` on its
egress, i.e. on what the bridge sends *to* that host: a packet from any host
to any other crosses exactly one netem qdisc (the receiver's port), so a round
trip between two hosts is 2 x D and each direction loses L. The qdiscs sit on
forwarded traffic, so a loss is silent to the sender (a qdisc on the sender's
own interface could tell its TCP stack). Nothing is added to the caller's
namespace.

Where the kernel has no netem (this machine's: built without
``CONFIG_NET_SCH_NETEM``, no module loader), :func:`created` says so and each
host's ``eth0`` is instead a TAP device on a user-space switch that puts the
same delay and loss on each port (:mod:`._links`).

Names carry the creating process's id and a random tag
(``anonml-<pid>-<tag>-<role>``), so parallel runs never collide and a run
whose process is gone can be recognised and removed (:func:`stale_namespaces`).
Every command is built by a pure function (tested without root); :func:`created`
runs them and removes every namespace on the way out, however it ends.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

PREFIX = "anonml-"
SUBNET = "10.27.0"
"""The hosts' /24 (private, RFC 1918); it exists only inside the run's namespaces."""
BRIDGE = "br0"
# Netem's default queue holds 1,000 packets: at a round's bursts a full one would drop more than the stated loss.
NETEM_LIMIT = 100_000
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-([0-9a-f]+)-")


@dataclass(frozen=True)
class Host:
    """One namespace with one address on the bridge."""

    role: str
    namespace: str
    address: str
    port: str
    """Its link's name on the bridge's side (unique in the bridge's namespace, at most 15 characters)."""


@dataclass(frozen=True)
class NamespacePlan:
    """Every namespace, address and link of one run, and the netem settings of every link."""

    tag: str
    hosts: tuple[Host, ...]
    bridge_namespace: str
    delay_ms: float
    loss_percent: float

    def host(self, role: str) -> Host:
        for host in self.hosts:
            if host.role == role:
                return host
        raise KeyError(f"no host {role!r} in this plan (hosts: {', '.join(h.role for h in self.hosts)})")

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_namespace, *(host.namespace for host in self.hosts)]

    def exec_prefix(self, role: str) -> list[str]:
        """The words that run a command inside ``role``'s namespace."""
        return self.exec_prefix_namespace(self.host(role).namespace)

    @staticmethod
    def exec_prefix_namespace(namespace: str) -> list[str]:
        return ["ip", "netns", "exec", namespace]

    def netem(self) -> list[str]:
        """The netem settings every link carries (after ``tc qdisc add dev X root``)."""
        return ["netem", "delay", f"{self.delay_ms:g}ms", "loss", f"{self.loss_percent:g}%", "limit", str(NETEM_LIMIT)]

    def setup_commands(self) -> list[list[str]]:
        """The namespaces, each host's loopback up, and the bridge (``ip`` commands, in order)."""
        commands = [["ip", "netns", "add", name] for name in self.namespaces]
        commands += [["ip", "-n", host.namespace, "link", "set", "lo", "up"] for host in self.hosts]
        return commands + [["ip", "-n", self.bridge_namespace, "link", "add", BRIDGE, "type", "bridge"],
                           ["ip", "-n", self.bridge_namespace, "link", "set", BRIDGE, "up"]]

    def netem_commands(self) -> list[list[str]]:
        """Each host's ``eth0``, a veth whose other end is a bridge port with netem on its egress."""
        bridge = self.bridge_namespace
        commands = []
        for host in self.hosts:
            commands += [
                # Made inside the host's namespace, its other end straight in the bridge's: no name in ours.
                ["ip", "-n", host.namespace, "link", "add", "eth0", "type", "veth", "peer", "name", host.port, "netns", bridge],
                ["ip", "-n", bridge, "link", "set", host.port, "master", BRIDGE],
                ["ip", "-n", bridge, "link", "set", host.port, "up"],
                ["tc", "-n", bridge, "qdisc", "add", "dev", host.port, "root", *self.netem()],
            ]
        return commands

    def address_commands(self) -> list[list[str]]:
        """Each host's address on its ``eth0`` (a veth or the emulator's TAP device), and the link up."""
        return [command for host in self.hosts for command in (
            ["ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0"],
            ["ip", "-n", host.namespace, "link", "set", "eth0", "up"])]

    def describe(self, links: str) -> str:
        """The network as built; ``links``: ``netem`` (the kernel's) or ``emulated`` (:mod:`._links`)."""
        hosts = ", ".join(f"{host.role} {host.address}" for host in self.hosts)
        how = (f"bridge ports with tc qdisc add dev PORT root {' '.join(self.netem())}" if links == "netem" else
               f"TAP devices on a user-space switch (anonml.bench._links; this kernel has no netem) delaying each frame "
               f"{self.delay_ms:g} ms and dropping {self.loss_percent:g}% at each port")
        return (f"{len(self.hosts)} namespaces ({SUBNET}.0/24: {hosts}); links: {how}; a frame between two hosts "
                f"crosses one such hop each way: round trip {2 * self.delay_ms:g} ms, {self.loss_percent:g}% loss each way")


def plan_namespaces(roles: Iterable[str], delay_ms: float, loss_percent: float, tag: str | None = None,
                    pid: int | None = None) -> NamespacePlan:
    """A namespace and an address for each role (in order, from ``SUBNET.2``), and the bridge's namespace."""
    roles = list(roles)
    if not roles or len(set(roles)) != len(roles):
        raise ValueError(f"roles must be distinct and at least one, got {roles}")
    if len(roles) > 250:
        raise ValueError(f"at most 250 hosts fit in {SUBNET}.0/24, got {len(roles)}")
    if delay_ms < 0 or not 0 <= loss_percent <= 100:
        raise ValueError(f"delay must be >= 0 ms and loss in [0, 100]%, got {delay_ms} ms and {loss_percent}%")
    tag = tag or secrets.token_hex(3)
    if not re.fullmatch(r"[0-9a-f]+", tag):
        raise ValueError(f"the tag must be lowercase hexadecimal, got {tag!r}")
    base = f"{PREFIX}{os.getpid() if pid is None else pid}-{tag}-"
    hosts = tuple(Host(role, base + role, f"{SUBNET}.{index + 2}", f"p{index}") for index, role in enumerate(roles))
    return NamespacePlan(tag, hosts, base + "bridge", delay_ms, loss_percent)


def stale_namespaces(names: Iterable[str], alive: Callable[[int], bool]) -> list[str]:
    """The bench's namespaces among ``names`` whose creating process (the id in the name) is gone."""
    stale = []
    for name in names:
        match = _NAME.match(name)
        if match is not None and not alive(int(match.group(1))):
            stale.append(name)
    return stale


def missing_tools() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (this process runs as uid %d)" % os.geteuid()
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns list` failed: {probe.stderr.strip()}"
    return None


def listed_namespaces() -> list[str]:
    """Every namespace ``ip netns list`` shows (its first word per line)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_namespaces(names: Iterable[str]) -> list[str]:
    """Kill the processes left in each namespace (each by its id), then delete it; errors, one line each."""
    errors = []
    for name in names:
        # Only this run's processes are in its namespaces (a stale one is removed only when empty).
        for pid in namespace_pids(name):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # Deleting a namespace deletes its links; the veth's other end goes with it.
        result = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            errors.append(f"ip netns del {name}: {result.stderr.strip()}")
    return errors


def namespace_pids(name: str) -> list[int]:
    """The processes running in namespace ``name``."""
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


def remove_stale() -> tuple[list[str], list[str]]:
    """The namespaces an earlier run left behind (its process gone, e.g. SIGKILLed): those removed (nothing ran in
    them), and those kept because processes still run there (an orphaned round that ends on its own)."""
    from psutil import pid_exists

    stale = stale_namespaces(listed_namespaces(), pid_exists)
    busy = [name for name in stale if namespace_pids(name)]
    removed = [name for name in stale if name not in busy]
    remove_namespaces(removed)
    return removed, busy


def _run_all(commands: Iterable[list[str]]) -> None:
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed ({result.returncode}): {result.stderr.strip()}")


def kernel_has_netem(plan: NamespacePlan) -> bool:
    """Whether ``tc`` can add a netem qdisc here (tried on the run's bridge, then removed)."""
    bridge = ["tc", "-n", plan.bridge_namespace, "qdisc"]
    added = subprocess.run([*bridge, "add", "dev", BRIDGE, "root", "netem", "delay", "0ms"], capture_output=True, check=False)
    if added.returncode != 0:
        return False
    subprocess.run([*bridge, "del", "dev", BRIDGE, "root"], capture_output=True, check=True)
    return True


@contextmanager
def created(plan: NamespacePlan, seed: int = 0) -> Iterator[str]:
    """The plan's namespaces and links, built; yields how the links delay and drop (``netem`` or ``emulated``).
    Everything is removed when the block ends, however it ends (the emulator, by its process id, first)."""
    from anonml.bench._links import command as emulator_command

    emulator: subprocess.Popen[str] | None = None
    try:
        _run_all(plan.setup_commands())
        if kernel_has_netem(plan):
            links = "netem"
            _run_all(plan.netem_commands())
        else:
            links = "emulated"
            emulator = subprocess.Popen(
                [*plan.exec_prefix_namespace(plan.bridge_namespace),
                 *emulator_command([h.namespace for h in plan.hosts], plan.delay_ms / 1e3, plan.loss_percent / 100, seed)],
                stdout=subprocess.PIPE, text=True)
            assert emulator.stdout is not None
            if emulator.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the link emulator did not start (exit {emulator.wait()})")
        _run_all(plan.address_commands())
        yield links
    finally:
        if emulator is not None:
            emulator.kill()
            emulator.wait()
        existing = set(listed_namespaces())
        errors = remove_namespaces([name for name in plan.namespaces if name in existing])
        if errors:
            raise RuntimeError("could not remove every namespace: " + "; ".join(errors))
