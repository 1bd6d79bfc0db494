"""``anonml simulate``: whole rounds in one process on a virtual clock, against an adversary that is a program.

Every role runs its real code over an in-memory network (``_world``); a
malicious aggregator and colluding relays are strategies with hooks into
that round (``_adversary``); a linking estimator and the property it must
not beat are in ``_property``; ``_command`` is the click command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.simulate._adversary import (
        STRATEGIES,
        Adversary,
        AdversaryView,
        Composite,
        DroppingRelay,
        HttpAction,
        HttpRecord,
        LateDocuments,
        RandomStrategy,
        RoundContext,
        RoundOfItsOwn,
        StarvedMirrors,
        TailoredLog,
        TailoredThresholds,
    )
    from anonml.simulate._command import simulate
    from anonml.simulate._names import StrategyName
    from anonml.simulate._property import StrategyVerdict, TrialScore, estimate, score_trial
    from anonml.simulate._world import PeerData, RoundSetup, RoundTrace, SimulationConfig, SpecAdjustment, peer_ip, simulate_round
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "STRATEGIES",
    "StrategyName",
    "Adversary",
    "AdversaryView",
    "Composite",
    "DroppingRelay",
    "HttpAction",
    "HttpRecord",
    "LateDocuments",
    "RandomStrategy",
    "PeerData",
    "RoundContext",
    "RoundOfItsOwn",
    "RoundSetup",
    "RoundTrace",
    "SimulationConfig",
    "SpecAdjustment",
    "StarvedMirrors",
    "StrategyVerdict",
    "TailoredLog",
    "TailoredThresholds",
    "TrialScore",
    "estimate",
    "peer_ip",
    "score_trial",
    "simulate",
    "simulate_round",
]
