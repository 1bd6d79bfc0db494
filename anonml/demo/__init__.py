"""``anonml demo``: one complete round of the whole system on loopback.

Three relays and the aggregator run as separate processes, started with their
own operators' commands (``anonml relay init/info/run``, ``anonml aggregator
init / round new / run``) in a work directory; N peers run as concurrent
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

from anonml.demo._audit import Audit, audit, audit_round
from anonml.demo._children import Child, ChildFailed, Children, open_children, resident_mb, until_signalled
from anonml.demo._command import demo
from anonml.demo._ports import free_port
from anonml.demo._schedule import schedule_seconds

__all__ = ["Audit", "Child", "ChildFailed", "Children", "audit", "audit_round", "demo", "free_port", "open_children", "resident_mb", "schedule_seconds", "until_signalled"]
