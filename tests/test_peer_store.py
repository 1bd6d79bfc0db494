"""The peer's identity files and SQLite store."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from anonml.base.errors import ConfigError
from anonml.peer._identity import (
    IDENTITY_FILE,
    IdentityError,
    init_identity,
    load_identity,
)
from anonml.mechanisms import ReleaseKind
from anonml.peer._store import SCHEMA, PeerStore, Spend, StoreError
from anonml.protocol import SurveyId


def test_identity_is_owner_only_never_overwritten_and_never_created_by_load(tmp_path: Path) -> None:
    data_dir = tmp_path / "peer"
    with pytest.raises(IdentityError, match="peer init"):
        load_identity(data_dir)
    created = init_identity(data_dir)
    assert stat.S_IMODE((data_dir / IDENTITY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    with pytest.raises(IdentityError, match="refusing to overwrite"):
        init_identity(data_dir)
    loaded = load_identity(data_dir)
    assert loaded.public_key == created.public_key
    signed = loaded.signing_key.sign(b"hello")
    created.signing_key.verify_key.verify(signed)


def test_identity_readable_by_others_or_garbled_is_refused(tmp_path: Path) -> None:
    init_identity(tmp_path)
    key = tmp_path / IDENTITY_FILE
    key.chmod(0o644)
    with pytest.raises(ConfigError, match="open to other users"):
        load_identity(tmp_path)
    key.chmod(0o600)
    key.write_text("zz\n")
    with pytest.raises(IdentityError, match="hex"):
        load_identity(tmp_path)
    key.write_text("00" * 31 + "\n")
    with pytest.raises(IdentityError, match="31 bytes"):
        load_identity(tmp_path)


PEER = b"\x01" * 32
ROUND = b"\x02" * 32


def test_a_different_manifest_for_a_registered_round_is_refused(tmp_path: Path) -> None:
    store = PeerStore(tmp_path / "peer.sqlite")
    store.remember_manifest(PEER, "http://a", "r1", ROUND)
    store.remember_manifest(PEER, "http://a", "r1", ROUND)  # the same one again is fine
    # another hash under a registered name: the first signed manifest comes back, for the proof of equivocation
    assert store.remember_manifest(PEER, "http://a", "r1", b"\x04" * 32, b"second") == b""
    # another identity, another aggregator or another round name is independent
    store.remember_manifest(b"\x05" * 32, "http://a", "r1", b"\x04" * 32)
    store.remember_manifest(PEER, "http://b", "r1", b"\x04" * 32)
    store.remember_manifest(PEER, "http://a", "r2", b"\x04" * 32)
    store.close()
    reopened = PeerStore(tmp_path / "peer.sqlite")
    registration = reopened.registration(PEER, ROUND)
    assert registration is not None and (registration.aggregator, registration.round_name) == ("http://a", "r1")


def test_spends_and_packets_persist_and_are_recorded_once_per_survey(tmp_path: Path) -> None:
    store = PeerStore(tmp_path / "peer.sqlite")
    spend = Spend(b"s1", ("age", "sex"), True, 0.5)
    store.record_spend(PEER, ROUND, spend, (b"message", b"receipt"))
    with pytest.raises(StoreError, match="already holds"):
        store.record_spend(PEER, ROUND, Spend(b"s1", ("age",), True, 0.1), (b"other", b"receipt"))
    store.count_send(PEER, b"s1")
    store.count_send(PEER, b"s1")
    store.acknowledge(PEER, b"s1")
    store.close()
    reopened = PeerStore(tmp_path / "peer.sqlite")
    assert reopened.spends(PEER, ROUND) == [spend]
    assert reopened.spends(PEER) == [spend]
    assert reopened.spends(PEER, b"\x09" * 32) == []
    packet = reopened.packet(PEER, b"s1")
    assert packet is not None
    assert (packet.message, packet.receipt, packet.sends, packet.acknowledged) == (b"message", b"receipt", 2, True)


def test_a_release_and_the_packet_carrying_it_are_committed_together(tmp_path: Path) -> None:
    """A peer killed between committing a release and storing its packet could not
    resume: the ledger refused the survey again and no packet was left to send
    (CI: a SIGKILLed `peer join`, run again, exited "the ledger already holds a
    release"). Both are one transaction now: when the packet cannot be stored,
    the release is not recorded either, so nothing is half done."""
    import sqlite3

    path = tmp_path / "peer.sqlite"
    store = PeerStore(path)
    store.record_spend(PEER, ROUND, Spend(b"s1", ("age",), True, 0.5), (b"message", b"receipt"))
    assert store.packet(PEER, b"s1") is not None and len(store.spends(PEER, ROUND)) == 1
    # A packet row already there for s2 (as a crash could leave it) makes the packet insert fail.
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO packets (peer, survey, round_id, message, receipt) VALUES (?, ?, ?, ?, ?)",
                   (PEER.hex(), b"s2".hex(), ROUND.hex(), b"old", b"r".hex()))
    with pytest.raises(StoreError):
        store.record_spend(PEER, ROUND, Spend(b"s2", ("sex",), True, 0.5), (b"new", b"receipt"))
    assert [spend.survey for spend in store.spends(PEER, ROUND)] == [b"s1"]  # rolled back with the packet
    store.close()
    # Every release on disk has its packet: what a resumed peer sends instead of answering again.
    reopened = PeerStore(path)
    for spend in reopened.spends(PEER, ROUND):
        assert reopened.packet(PEER, spend.survey) is not None


def _older_store(path: Path, version: int, *undo: str) -> PeerStore:
    """A store holding one spend as a peer of schema ``version`` left it (``undo``: the later versions' changes
    taken back), reopened by this version."""
    import sqlite3

    store = PeerStore(path)
    store.record_spend(b"\x01" * 32, b"\x02" * 32, Spend(b"\x09" * 8, ("age",), True, 1.0))
    store.close()
    with sqlite3.connect(path) as db:
        for statement in (*undo, f"PRAGMA user_version = {version}"):
            db.execute(statement)
    return PeerStore(path)


def test_a_version_2_store_gains_the_lifetime_budget_and_keeps_its_ledger(tmp_path: Path) -> None:
    from anonml.peer._store import DEFAULT_LIFETIME_EPSILON

    # What a peer of the version before the lifetime budget left on disk.
    reopened = _older_store(tmp_path / "peer.sqlite", 2, "DROP TABLE settings", "ALTER TABLE spends DROP COLUMN kind",
                            "ALTER TABLE registrations DROP COLUMN issuance")
    assert reopened.lifetime_epsilon() == DEFAULT_LIFETIME_EPSILON
    assert [s.epsilon for s in reopened.spends(b"\x01" * 32)] == [1.0]
    reopened.set_lifetime_epsilon(3.0)
    assert reopened.lifetime_epsilon() == 3.0
    reopened.close()


def test_a_version_3_store_gains_release_kinds_and_keeps_its_ledger(tmp_path: Path) -> None:
    # What a peer of the version before model releases left on disk.
    reopened = _older_store(tmp_path / "peer.sqlite", 3, "ALTER TABLE spends DROP COLUMN kind",
                            "ALTER TABLE registrations DROP COLUMN issuance")
    assert reopened.spends(b"\x01" * 32) == [Spend(b"\x09" * 8, ("age",), True, 1.0)]
    model = Spend(b"\x0a" * 8, ("age", "sex"), True, 2.0, ReleaseKind.MODEL)
    reopened.record_spend(b"\x01" * 32, b"\x02" * 32, model, (b"block 0", b"r0"), further=[(b"\x0b" * 8, b"block 1", b"r1")])
    assert reopened.spends(b"\x01" * 32)[-1] == model
    assert [r.kind for r in model.releases()] == [ReleaseKind.MODEL]
    assert reopened.packet(b"\x01" * 32, b"\x0b" * 8) is not None
    reopened.close()


def test_a_version_4_store_gains_the_credential_request_in_progress_and_keeps_its_ledger(tmp_path: Path) -> None:
    import sqlite3

    # What a peer of the version before credential requests were kept (issue 27) left on disk.
    reopened = _older_store(tmp_path / "peer.sqlite", 4, "ALTER TABLE registrations DROP COLUMN issuance")
    assert reopened.spends(b"\x01" * 32) == [Spend(b"\x09" * 8, ("age",), True, 1.0)]
    reopened.close()
    with sqlite3.connect(tmp_path / "peer.sqlite") as db:
        assert "issuance" in {row[1] for row in db.execute("PRAGMA table_info(registrations)")}
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA.version


def test_a_version_5_store_holds_its_sgd_gradients_as_gradient_releases_and_nothing_else_changes(tmp_path: Path) -> None:
    import sqlite3

    peer, round_id = b"\x01" * 32, b"\x02" * 32
    store = PeerStore(tmp_path / "peer.sqlite")
    # What version 5 stored: an SGD round's gradient (a median survey) as a subset report, beside an ensemble
    # round's median answer (no label) and subset report (a data survey).
    gradient = Spend(SurveyId.median(round_id, 0, 1).to_bytes(), ("age", "sex"), True, 4.0)
    median = Spend(SurveyId.median(round_id, 1, 0).to_bytes(), ("age",), False, 0.5)
    subset = Spend(SurveyId.data(round_id, 1, 0).to_bytes(), ("age", "sex"), True, 1.5)
    for spend in (gradient, median, subset):
        store.record_spend(peer, round_id, spend)
    store.close()
    with sqlite3.connect(tmp_path / "peer.sqlite") as db:
        db.execute("PRAGMA user_version = 5")
    reopened = PeerStore(tmp_path / "peer.sqlite")
    by_survey = {s.survey: s for s in reopened.spends(peer)}
    assert by_survey[gradient.survey].kind == ReleaseKind.GRADIENT
    assert [(r.kind, r.epsilon) for r in by_survey[gradient.survey].releases()] == [(ReleaseKind.GRADIENT, 4.0)]
    assert by_survey[median.survey] == median and by_survey[subset.survey] == subset
    assert [r.kind for r in subset.releases()] == [ReleaseKind.SUBSET]
    reopened.close()
