"""A switch in user space with delay and loss on every port: ``tc netem``'s job where the kernel has no netem.

This machine's kernel is built without ``CONFIG_NET_SCH_NETEM`` (``tc qdisc
add ... netem`` answers "Specified qdisc kind is unknown") and has no module
loader, so ``anonml bench netns`` puts the same delay and loss on its links
here: each host namespace gets a TAP device as its ``eth0``, whose other end
is a file descriptor this process holds. Every Ethernet frame a host sends
is switched (destination MAC learned from source MACs; unknown and broadcast
frames go to every other port) and each copy is dropped with probability
``loss`` or handed to its destination ``delay`` seconds after it was read:
one emulated hop per direction, as netem on each bridge port gives. Frames
keep their order (one delay for all). The hosts' kernels run real TCP over
it: loss is silent to the sender and is repaired by TCP's own
retransmissions.

``python -m anonml.bench._links ARGUMENTS`` (:func:`command`) runs it inside the bridge's
namespace: it creates one TAP device per host, moves each into its host's
namespace as ``eth0``, prints ``ready`` and switches frames until it is
killed (its descriptors close and the kernel removes the devices).
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import random
import selectors
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
# Larger than any frame at the default MTU of 1,500 (the header included).
_READ_BYTES = 65_536


@dataclass
class Switch:
    """The frames in flight between ports, and the MAC address each port was last seen sending from."""

    delay: float
    loss: float
    rng: random.Random
    ports: int
    where: dict[bytes, int] = field(default_factory=dict)
    pending: list[tuple[float, int, int, bytes]] = field(default_factory=list)
    """(due, sequence, port, frame): a heap, earliest first (the sequence keeps equal times in order)."""
    sequence: int = 0
    received: int = 0
    dropped: int = 0

    def frame_in(self, port: int, frame: bytes, now: float) -> None:
        """Switch one frame read from ``port``: each copy lost with probability ``loss``, else due at now + delay."""
        if len(frame) < 14:
            return
        self.received += 1
        destination, source = frame[:6], frame[6:12]
        self.where[source] = port
        known = self.where.get(destination)
        # Broadcast and multicast (the group bit) and unknown unicast go to every other port.
        targets = [known] if known is not None and not destination[0] & 1 else [p for p in range(self.ports) if p != port]
        for target in targets:
            if target == port:
                continue
            if self.rng.random() < self.loss:
                self.dropped += 1
                continue
            self.sequence += 1
            heapq.heappush(self.pending, (now + self.delay, self.sequence, target, frame))

    def due(self, now: float) -> list[tuple[int, bytes]]:
        """The frames due by ``now``, in order, as (port, frame)."""
        out = []
        while self.pending and self.pending[0][0] <= now:
            _, _, port, frame = heapq.heappop(self.pending)
            out.append((port, frame))
        return out

    def wait(self, now: float) -> float | None:
        """Seconds until the next frame is due (None: none in flight)."""
        return max(0.0, self.pending[0][0] - now) if self.pending else None


def open_tap() -> tuple[int, str]:
    """A new TAP device (no packet information header) in this namespace: its descriptor and the kernel's name."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    answer = fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", b"", _IFF_TAP | _IFF_NO_PI))
    return fd, answer[:16].rstrip(b"\0").decode()


def serve(namespaces: list[str], delay: float, loss: float, seed: int) -> None:
    """Make the hosts' devices (``namespaces[i]`` gets port i), say ``ready`` on stdout, switch frames until killed."""
    switch = Switch(delay, loss, random.Random(seed), len(namespaces))
    selector = selectors.DefaultSelector()
    fds = []
    for port, namespace in enumerate(namespaces):
        fd, name = open_tap()
        fds.append(fd)
        # The device moves; this descriptor stays its other end.
        for command in (["ip", "link", "set", name, "netns", namespace],
                        ["ip", "-n", namespace, "link", "set", name, "name", "eth0"]):
            subprocess.run(command, check=True, capture_output=True)
        selector.register(fd, selectors.EVENT_READ, port)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select(switch.wait(time.monotonic())):
            fd = key.fd
            while True:
                try:
                    frame = os.read(fd, _READ_BYTES)
                except BlockingIOError:
                    break
                switch.frame_in(key.data, frame, time.monotonic())
        for port, frame in switch.due(time.monotonic()):
            try:
                os.write(fds[port], frame)
            except OSError:
                # The host's device is down (its namespace is being removed): the frame is lost, as on a cut link.
                switch.dropped += 1


def command(namespaces: list[str], delay: float, loss: float, seed: int) -> list[str]:
    """The command line that runs :func:`serve` (``python -m anonml.bench._links``)."""
    return [sys.executable, "-m", "anonml.bench._links", json.dumps(
        {"namespaces": namespaces, "delay": delay, "loss": loss, "seed": seed})]


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    serve([str(n) for n in arguments["namespaces"]], float(arguments["delay"]), float(arguments["loss"]), int(arguments["seed"]))
