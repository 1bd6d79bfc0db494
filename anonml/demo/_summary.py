"""The demo's closing summary: participation, what was accepted and what was
lost, epsilon, AUC beside the non-private baseline, time, memory; and the
exit code that says whether the round delivered.
"""

from __future__ import annotations

import json
import resource
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from anonml.demo._audit import Audit
from anonml.demo._data import DemoData, baseline_auc
from anonml.demo._progress import Progress
from anonml.demo._schedule import DemoParams
from anonml.demo._trace import explain_lines, group_quantiles
from anonml.aggregator import score_links, timing_figures

PEER_COUNTS = ("joined", "packets", "sends", "resends", "covers", "acknowledged", "missing", "unconfirmed")


def peer_totals(progress: Progress) -> dict[str, Any]:
    """What the peers said of their messages, summed over the workers: :data:`PEER_COUNTS` and ``missing_reasons``."""
    total = Counter[str]()
    reasons = Counter[str]()
    for s in progress.summaries.values():
        for key in PEER_COUNTS:
            total[key] += int(s.get(key, 0))
        reasons.update(s.get("missing_reasons", {}))
    return {**{key: total[key] for key in PEER_COUNTS}, "missing_reasons": dict(reasons)}


def held_after_window_opened(progress: Progress) -> dict[str, Any]:
    """Packets the relays accepted after their hop window had opened (``relay.LateIntake``): in all, at
    their first hop (where it ties arrival to send time), per relay, and how long the window had been
    open on average; and those whose drawn release time had passed before they were stored."""
    per_relay = {index: int(m.get("held_after_window_opened", 0)) for index, m in sorted(progress.relays.items())}
    total = sum(per_relay.values())
    seconds = sum(m.get("held_after_window_opened_seconds", 0.0) for m in progress.relays.values())
    return {
        "total": total,
        "per_relay": per_relay,
        "mean_seconds_open": seconds / total if total else 0.0,
        "due_before_stored": sum(int(m.get("due_before_stored", 0)) for m in progress.relays.values()),
    }


def summarise(data: DemoData, params: DemoParams, progress: Progress, report: dict[str, Any], audit: Audit, work: Path,
              seconds: float) -> dict[str, Any]:
    epsilons = [e for s in progress.summaries.values() for e in s.get("epsilon", [])]
    promised = (report.get("privacy") or {}).get("eps_total_local", params.epsilon)
    total = peer_totals(progress)
    status = progress.status
    counts = dict(status.counts) if status is not None else {}
    rejected = dict(status.rejected) if status is not None else {}
    return {
        "dataset": data.name,
        "peers": progress.peers,
        "registered": counts.get("registered", 0),
        "credentials": counts.get("credentials", 0),
        "joined": total["joined"],
        "packets": total["packets"],
        "sends": total["sends"],
        "resends": total["resends"],
        "covers": total["covers"],
        "receipts": total["acknowledged"],
        "missing": total["missing"],
        "missing_reasons": total["missing_reasons"],
        "unconfirmed": total["unconfirmed"],
        "accepted": counts.get("accepted", 0),
        # Every prepared message matched against the accepted set: accepted, lost by reason, counted twice.
        "audit": audit.to_dict(),
        "rejected": rejected,
        "peer_errors": progress.errors,
        "relay_drops": dict(progress.relay_drops()),
        "relay_forwarded": sum(int(m.get("forwarded", 0)) for m in progress.relays.values()),
        "relay_held_after_window_opened": held_after_window_opened(progress),
        "epsilon_local_max": max(epsilons, default=0.0),
        "epsilon_local_mean": float(np.mean(epsilons)) if epsilons else 0.0,
        "epsilon_promised": promised,
        # Peers whose ledger sums to exactly the promise: the ledger and the manifest's ε_T are both the
        # fsum of the same releases, so a peer that made every release it consented to is equal, not close.
        "ledgers_at_promise": sum(e == promised for e in epsilons),
        "ledgers": len(epsilons),
        "report": report,
        "phase": status.phase if status is not None else "unknown",
        # Non-private logistic regression on exactly the rows the peers held (the round's yardstick), and on
        # every training row when the peers held fewer (what more data would give, not what the round could).
        "baseline_rows": params.rows_held,
        "baseline_auc": baseline_auc(data, params.rows_held),
        "training_rows": len(data.train_rows),
        "baseline_auc_all_rows": baseline_auc(data, len(data.train_rows)) if params.rows_held < len(data.train_rows) else None,
        "wall_seconds": seconds,
        "work_dir": str(work),
        # ru_maxrss is in KiB on Linux; for RUSAGE_CHILDREN it is the largest child.
        "peak_rss_mb_demo": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "peak_rss_mb_children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0,
        "peak_rss_mb_total": progress.peak_rss_mb,
        "restarted": list(progress.exits),
        "died": list(progress.died),
        # Sampled every 2 s while the round ran: what each role's processes cost, the demo's own beside them.
        "cpu_seconds": {**progress.cpu_by_role(), "demo": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1)},
    }


def anonymity_figures(progress: Progress, links_path: Path) -> dict[str, Any]:
    """The aggregator's timing guesses (``links.json``) scored against who really sent what, and send-vs-arrival rho.

    The aggregator publishes its best guess from its full view but cannot
    score it; the demo plays every peer, so it knows each message's sender
    and send time (what the workers reported as ``sent``).
    """
    if not links_path.is_file():
        return {"unavailable": f"{links_path.name} was not written (the round did not learn)"}
    links = json.loads(links_path.read_text())
    truth = {receipt: (identity, sent_at) for s in progress.summaries.values() for identity, receipt, sent_at in s.get("sent", [])}
    known = [link for link in links if link["receipt"] in truth]
    figures: dict[str, Any] = {"messages": len(links), "senders_known": len(known)}
    if len(known) < 2:
        return figures
    score = score_links([link["guess"] for link in known], [truth[link["receipt"]][0] for link in known],
                        [int(link["candidates"]) for link in known])
    # Ranks within each survey and delivery window: surveys are sent and delivered in their own
    # phases, and each report in one of its phase's two windows (chosen at random, a cover in the
    # other), so times pooled across phases or windows would correlate by phase or window alone.
    groups = [(link["survey"], link.get("window", 1)) for link in known]
    send = group_quantiles(groups, [truth[link["receipt"]][1] for link in known])
    arrival = group_quantiles(groups, [float(link["arrived"]) for link in known])
    timing = timing_figures(send, arrival, np.random.default_rng(0))
    figures.update(aggregator_guess=score.to_dict(), spearman_rho=timing["spearman_rho"],
                   rho_standard_error=timing["rho_standard_error"],
                   half_link_accuracy=timing["half_link_accuracy"], half_link_standard_error=timing["half_link_standard_error"])
    return figures


# The demo fails when the aggregator accepted fewer of the peers' messages than this.
MIN_ACCEPTED_FRACTION = 0.99
EXIT_ROUND_FAILED = 3
"""The round failed (minimum participation missed, or a short survey in a round whose spec says fail)."""
EXIT_MESSAGES_LOST = 4
"""Under 99% of the prepared messages accepted, or a message counted twice, or one the peer saw acknowledged lost."""
EXIT_ROUND_DEGRADED = 5
"""The round ended ``degraded``: a survey got fewer reports than its spec's minimum (a model was still published)."""
EXIT_PEERS_LEFT_OUT = 7  # (6 is `bench netns`: timing off chance)
"""Under 99% of the demo's peers answered (most often: registration or issuance closed before they got through).
The accepted fraction counts only the messages of peers that answered, so it cannot see them."""


# The anonymity report is "at chance" while the aggregator's timing guess is less than this many standard errors
# (of a guess at chance) above chance and |rho(send, arrival)| is within this many of its standard error if
# independent: 3, as the anonymity tests hold it (a false alarm about once in 700 runs per figure).
ANONYMITY_STANDARD_ERRORS = 3.0


def anonymity_problems(figures: dict[str, Any]) -> list[str]:
    """Why the round's anonymity report is not at chance, one line each (none: it is)."""
    if "aggregator_guess" not in figures:
        return [f"no anonymity report: {figures.get('unavailable', 'fewer than 2 messages with a known sender')}"]
    guess = figures["aggregator_guess"]
    problems = []
    if guess["accuracy"] - guess["chance"] > ANONYMITY_STANDARD_ERRORS * guess["standard_error_at_chance"]:
        problems.append(f"the aggregator's timing guess is right {100 * guess['accuracy']:.2f}% of the time, chance "
                        f"{100 * guess['chance']:.2f}% (more than {ANONYMITY_STANDARD_ERRORS:g} s.e. above)")
    if abs(figures["spearman_rho"]) > ANONYMITY_STANDARD_ERRORS * figures["rho_standard_error"]:
        problems.append(f"rho(send, arrival) = {figures['spearman_rho']:+.3f}, more than {ANONYMITY_STANDARD_ERRORS:g} x "
                        f"its standard error if independent ({figures['rho_standard_error']:.3f})")
    return problems


def accepted_fraction(summary: dict[str, Any]) -> float:
    """Prepared messages the aggregator accepted (the audit), over those prepared (1.0 when none were)."""
    audit = summary["audit"]
    return float(audit["accepted"]) / audit["prepared"] if audit["prepared"] else 1.0


def exit_code(summary: dict[str, Any]) -> int:
    """0 when the round is done, lost at most 1% of the prepared messages, counted none twice, and at least 99%
    of the peers answered."""
    if summary["phase"] == "degraded":
        return EXIT_ROUND_DEGRADED
    if summary["phase"] != "done":
        return EXIT_ROUND_FAILED
    audit = summary["audit"]
    if accepted_fraction(summary) < MIN_ACCEPTED_FRACTION or audit["counted_twice"] or audit["peer_acknowledged_but_lost"]:
        return EXIT_MESSAGES_LOST
    if summary["joined"] < MIN_ACCEPTED_FRACTION * summary["peers"]:
        return EXIT_PEERS_LEFT_OUT
    return 0


EXIT_REASONS = {
    EXIT_ROUND_FAILED: "the round failed",
    EXIT_MESSAGES_LOST: f"under {100 * MIN_ACCEPTED_FRACTION:g}% of the peers' messages accepted, or one counted twice or lost after its ack",
    EXIT_ROUND_DEGRADED: "the round ended degraded (a survey got fewer reports than its minimum)",
    EXIT_PEERS_LEFT_OUT: f"under {100 * MIN_ACCEPTED_FRACTION:g}% of the peers answered (see 'peers registered / answered')",
}
"""One line per non-zero exit status of :func:`exit_code`."""


def experiment_command(params: DemoParams, dataset_args: list[str], n_train: int) -> str:
    """The in-process ``anonml experiment`` closest to this round: its AUC is the demo's yardstick.

    ``dataset_args`` name the data (``adult --data-dir D``, or ``csv --spec
    ... --train ... --test ...`` for the files the demo wrote). Same plan, ε,
    vote, cut points and search steps, and the same peers answer the search:
    the comparison pool (``median_peers="reserved"``) or every peer once
    (``"all"``), each drawing its cut point (and a pool peer its feature) at
    random as the round's peers do. Without a pool the round deals whole
    partitions over its sub-rounds where the experiment deals single peers,
    so when ``median_rounds`` does not divide ``k_p`` the round's steps are a
    little uneven.
    """
    args = [
        "anonml", "experiment", *dataset_args, "--epsilon", f"{params.epsilon:g}",
        "--plan", params.plan, "--kp", str(params.k_p), "--ks", str(params.k_s),
    ]
    if params.plan == "split":
        args += ["--kh", str(params.k_h)]
    if params.comparison_pool:
        args += ["--median-peers", "reserved", "--pool", f"{params.comparison_pool:g}"]
    else:
        args += ["--median-peers", "all"]
    args += ["--median-steps", str(max(params.median_rounds, 1)), "--quantiles", str(params.quantiles), "--vote", params.vote]
    if params.peers is not None and params.peers < n_train:
        args += ["--max-train-rows", str(max(50, params.peers))]
    return " ".join(args)


def sgd_experiment_command(params: DemoParams, dataset_args: list[str], n_train: int) -> str:
    """The in-process ``anonml experiment`` of an SGD round: Harmony's LDP SGD of the round's loss on the same
    rows and ε, with the round's steps (its median sub-rounds) and step size γ0, every peer dealt into one step."""
    from anonml.learning import SGD_LEARNER_LOSS, SGD_LEARNING_RATE
    from anonml.protocol import SgdLoss

    loss = SgdLoss.LOGISTIC if params.sgd_loss is None else SgdLoss(params.sgd_loss)
    learner = next(name for name, trained in SGD_LEARNER_LOSS.items() if trained == loss)
    args = [
        "anonml", "experiment", *dataset_args, "--epsilon", f"{params.epsilon:g}", "--learner", str(learner),
        "--linear-tuning", "fixed", "--sgd-steps", str(params.median_rounds), "--sgd-learning-rate",
        f"{SGD_LEARNING_RATE if params.sgd_learning_rate is None else params.sgd_learning_rate:g}",
    ]
    if params.peers is not None and params.peers < n_train:
        args += ["--max-train-rows", str(max(50, params.peers))]
    return " ".join(args)


def baseline_lines(summary: dict[str, Any]) -> list[tuple[str, int, str]]:
    """The non-private baselines the summary prints, each named by the rows it was fitted on."""
    def shown(auc: float | None) -> str:
        return f"{auc:.4f}" if auc is not None else "n/a (those rows hold one class)"

    # The rows dealt to every peer: a peer that never got into the round (registration closed first) held its rows too.
    lines = [("the rows the peers held", int(summary["baseline_rows"]), shown(summary["baseline_auc"]))]
    if summary["baseline_rows"] < summary["training_rows"]:
        lines.append(("every training row", int(summary["training_rows"]), shown(summary["baseline_auc_all_rows"])))
    return lines


def print_summary(console: Any, summary: dict[str, Any], params: DemoParams) -> None:
    from rich.table import Table

    table = Table(title="round summary", show_header=False)
    table.add_column("what")
    table.add_column("figure", justify="right")
    sent = summary["sends"]
    accepted = summary["accepted"]
    table.add_row("outcome", summary["phase"])
    table.add_row("peers registered / answered", f"{summary['registered']} / {summary['joined']} of {summary['peers']}")
    table.add_row(
        "packets: messages / sends (first and second chance)",
        f"{summary['packets']} / {sent} ({summary['resends']} resent, {summary['covers']} covers)",
    )
    audit = summary["audit"]
    table.add_row(
        "accepted by the aggregator",
        f"{audit['accepted']} of {audit['prepared']} messages ({100.0 * accepted_fraction(summary):.2f}%; the demo fails "
        f"below {100 * MIN_ACCEPTED_FRACTION:g}%); {accepted} packets counted in all",
    )
    table.add_row(
        "lost by reason (each message's peer store)",
        ", ".join(f"{k}: {v}" for k, v in sorted(audit["lost_by_reason"].items())) or "none",
    )
    table.add_row("counted twice / accepted but prepared by no peer", f"{audit['counted_twice']} / {audit['unknown_accepted']}")
    if summary["restarted"]:
        table.add_row("processes restarted after dying", ", ".join(summary["restarted"]))
    if summary["died"]:
        table.add_row("peer workers that died (their peers stopped answering)", ", ".join(summary["died"]))
    reasons = ", ".join(f"{v} {k}" for k, v in sorted(summary["missing_reasons"].items()))
    table.add_row(
        "peers: receipts found / missing / unconfirmed",
        f"{summary['receipts']} / {summary['missing']}{f' ({reasons})' if reasons else ''} / {summary['unconfirmed']}",
    )
    table.add_row("rejected by reason", ", ".join(f"{k}: {v}" for k, v in sorted(summary["rejected"].items())) or "none")
    late = summary["relay_held_after_window_opened"]
    table.add_row(
        "relays: packets accepted after their window opened (a later hop's; per relay)",
        f"{late['total']} of {summary['relay_forwarded']} forwarded ("
        + ", ".join(f"relay {i}: {n}" for i, n in late["per_relay"].items())
        + f"; window open {late['mean_seconds_open']:.2f} s on average); {late['due_before_stored']} due before stored",
    )
    if "sink_deliveries" in summary:
        table.add_row("packets each sink address took (the aggregator's, then its workers')",
                      ", ".join(f"{address}: {count}" for address, count in summary["sink_deliveries"].items()))
    table.add_row("dropped by relays", ", ".join(f"{k}: {v}" for k, v in sorted(summary["relay_drops"].items())) or "none")
    table.add_row(
        "epsilon per peer, local, record level (ledger sums)",
        f"max {summary['epsilon_local_max']:.3g}, promised {summary['epsilon_promised']:.3g}; "
        f"{summary['ledgers_at_promise']} of {summary['ledgers']} ledgers equal to the promise",
    )
    per_attribute = (summary["report"].get("privacy") or {}).get("eps_per_attribute_secondary")
    if per_attribute is not None:
        table.add_row("per-attribute figure (thesis eq. 7.4, secondary)", f"{per_attribute:.3g}")
    central = (summary["report"].get("privacy") or {}).get("central_per_survey") or {}
    if "epsilon" in central:
        # Each data report hides among the n unlinkable reports its survey
        # accepted (the fewest of any survey; Feldman-McMillan-Talwar); a peer's k_h reports compose.
        table.add_row(
            "epsilon, central (shuffle bound)",
            f"{central['epsilon']:.3g} per report (n={central['n']}, delta={central['delta']:.1e}); "
            f"{params.k_h * central['epsilon']:.3g} for a peer's {params.k_h} reports",
        )
    anonymity = summary.get("anonymity") or {}
    if "aggregator_guess" in anonymity:
        guess = anonymity["aggregator_guess"]
        table.add_row(
            "anonymity: aggregator's timing guess of each sender",
            f"{100 * guess['accuracy']:.2f}% right over {guess['messages']} messages; chance {100 * guess['chance']:.2f}% "
            f"(±{100 * guess['standard_error_at_chance']:.2f} pp, 1 s.e.)",
        )
        table.add_row(
            "anonymity: rank correlation send vs arrival (ranks within each survey and window)",
            f"{anonymity['spearman_rho']:+.3f} (±{anonymity['rho_standard_error']:.3f}, 1 s.e. if independent)",
        )
    if "stages" in anonymity:
        for what, figure in explain_lines(anonymity["stages"]):
            table.add_row(what, figure)
    answers = summary["report"].get("statistics")
    if answers is not None:
        table.add_row("statistic answers (report.json, each with its std error and formula)", str(len(answers)))
    else:
        auc = summary.get("auc")
        table.add_row("AUC on held-out data", f"{auc:.4f}" if isinstance(auc, float) else "n/a")
        for what, rows, figure in baseline_lines(summary):
            table.add_row(f"AUC, non-private logistic regression on {what} ({rows:,} rows)", figure)
    if "experiment_command" in summary:
        table.add_row("closest round without the network (compare its AUC)", summary["experiment_command"])
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s")
    table.add_row(
        "peak memory (all processes / demo / largest child)",
        f"{summary['peak_rss_mb_total']:.0f} MB / {summary['peak_rss_mb_demo']:.0f} MB / {summary['peak_rss_mb_children']:.0f} MB",
    )
    table.add_row("CPU seconds by role (sampled)", ", ".join(f"{role} {seconds:.1f}" for role, seconds in summary["cpu_seconds"].items()))
    table.add_row("report", summary.get("report_path", summary["work_dir"]))
    console.print(table)
