"""``anonml demo``: one complete round of the whole system on loopback.

Five relays (each path crosses three of them) and the aggregator run as separate processes, started with their
own operators' commands (``anonml relay init/run``, each descriptor read as
``relay info`` reads it, ``anonml aggregator init / round new / run``) in a
work directory; N peers run as concurrent
``peer.join_round`` tasks in a few worker processes (``._swarm``), each with
its own identity, credential, ledger and randomness. Before the round opens
the demo measures what each phase costs on this machine and sizes the
round's windows from it; while it runs it restarts a relay or the aggregator
that dies and keeps following the round; it ends with a summary and an exit
code that says whether the round delivered.

One job per module: ``_data`` (the datasets), ``_ports``, ``_children`` (start,
restart, stop), ``_calibrate`` (measured costs), ``_schedule`` (the round's
windows and spec), ``_progress`` (what is shown while it runs), ``_summary``,
``_run`` (the steps), ``_audit`` (every prepared message against the accepted
set), ``_command`` (the click command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each name's module is imported when the name is first used (anonml.base.lazy).
if TYPE_CHECKING:
    from anonml.demo._audit import Audit, audit, audit_round
    from anonml.demo._calibrate import measure_costs
    from anonml.demo._children import Child, ChildFailed, Children, open_children, resident_mb, until_signalled
    from anonml.demo._command import demo
    from anonml.demo._data import DemoData, breast_cancer_data
    from anonml.demo._ports import HOST, free_port
    from anonml.demo._progress import Progress
    from anonml.demo._run import Network, collect_report, follow_round, init_aggregator, open_round, run_demo, start_relays, start_workers
    from anonml.demo._schedule import PATH_LENGTH, RELAYS, cores, plan_round, requests_in_flight, schedule_seconds
    from anonml.demo._summary import anonymity_problems, exit_code, peer_totals
    from anonml.demo._trace import deliveries_to
else:
    from anonml.base.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, __file__)

# The pieces ``anonml bench faults`` builds its round from, and the whole round ``anonml bench round`` measures.
__all__ = [
    "HOST",
    "PATH_LENGTH",
    "RELAYS",
    "Audit",
    "Child",
    "ChildFailed",
    "Children",
    "DemoData",
    "Network",
    "Progress",
    "anonymity_problems",
    "audit",
    "audit_round",
    "breast_cancer_data",
    "collect_report",
    "cores",
    "deliveries_to",
    "demo",
    "exit_code",
    "follow_round",
    "free_port",
    "init_aggregator",
    "measure_costs",
    "open_children",
    "open_round",
    "peer_totals",
    "plan_round",
    "requests_in_flight",
    "resident_mb",
    "run_demo",
    "schedule_seconds",
    "start_relays",
    "start_workers",
    "until_signalled",
]
