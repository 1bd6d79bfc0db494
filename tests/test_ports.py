"""free_port: published addresses for servers that bind later."""

from __future__ import annotations

import random

from anonml.demo import free_port
from anonml.demo._ports import ephemeral_range


class Replay(random.Random):
    """Draws the ports it was given, in order (a run of bad luck made certain)."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__(0)
        self.ports = iter(ports)

    def randint(self, a: int, b: int) -> int:
        return next(self.ports)


def test_a_port_is_never_handed_out_twice_before_its_server_binds_it() -> None:
    # Two relays of one test were given the same port: the first had not bound
    # it yet, so the probe for the second bound it too, and the second relay
    # could not listen (CI). Here the second call draws the first call's port
    # twice before anything else.
    _, high = ephemeral_range()
    candidates = list(range(high + 1, min(high + 200, 65535)))
    one = free_port(rng=Replay(candidates))
    other = free_port(rng=Replay([one, one, *candidates]))
    assert other != one
