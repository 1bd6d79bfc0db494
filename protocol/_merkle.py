"""Merkle tree hashes, inclusion and consistency proofs: RFC 9162 §2.1.

The receipt log (DESIGN.md §5) and the roster (§3 step 3) are committed to by
the Merkle Tree Hash of RFC 9162 §2.1.1: a leaf hashes as
``SHA-256(0x00 ‖ d)``, an interior node as ``SHA-256(0x01 ‖ left ‖ right)``,
and a tree of ``n > 1`` leaves splits at ``k``, the largest power of two
below ``n``. The proofs are those of §2.1.3 (inclusion: one leaf is in the
tree a root commits to) and §2.1.4 (consistency: the tree of the first ``m``
leaves is a prefix of the tree of ``n``, so a log only ever grew); their
verifiers follow the algorithms of §2.1.3.2 and §2.1.4.2 step by step.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

HASH_BYTES = 32
_LEAF = b"\x00"
_NODE = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()
"""MTH({}), the hash of the empty string (RFC 9162 §2.1.1)."""


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(_LEAF + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (``n > 1``)."""
    return 1 << ((n - 1).bit_length() - 1)


def _subtree(hashes: Sequence[bytes], start: int, end: int) -> bytes:
    """MTH of the leaves whose hashes are ``hashes[start:end]`` (``end > start``)."""
    if end - start == 1:
        return hashes[start]
    k = _split(end - start)
    return node_hash(_subtree(hashes, start, start + k), _subtree(hashes, start + k, end))


def tree_hash(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of RFC 9162 §2.1.1."""
    return root_of_hashes([leaf_hash(leaf) for leaf in leaves])


def root_of_hashes(hashes: Sequence[bytes]) -> bytes:
    """MTH over leaves given by their leaf hashes (so a log hashes each leaf once)."""
    return _subtree(hashes, 0, len(hashes)) if hashes else EMPTY_ROOT


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(m, D[n]) of RFC 9162 §2.1.3.1; raises ValueError for an index outside the tree."""
    if not 0 <= index < len(leaves):
        raise ValueError(f"leaf index {index!r} is outside a tree of {len(leaves)!r}")
    hashes = [leaf_hash(leaf) for leaf in leaves]
    path: list[bytes] = []
    start, end = 0, len(hashes)
    # Walk down from the root, keeping the sibling subtree's hash at each level.
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            path.append(_subtree(hashes, start + k, end))
            end = start + k
        else:
            path.append(_subtree(hashes, start, start + k))
            start += k
    path.reverse()  # the path lists siblings from the leaf up
    return path


def _sibling_sides(fn: int, sn: int, count: int) -> list[bool] | None:
    """The walk up the tree both of RFC 9162's verifications make (§2.1.3.2 and §2.1.4.2) from node ``fn``, ``sn``
    the last node's index, over ``count`` path entries: for each entry whether it is the left sibling; None when
    the path does not end exactly at the root."""
    sides: list[bool] = []
    for _ in range(count):
        if sn == 0:
            return None
        left = bool(fn & 1) or fn == sn
        sides.append(left)
        if left and not fn & 1:
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        fn >>= 1
        sn >>= 1
    return sides if sn == 0 else None


def verify_inclusion(leaf: bytes, index: int, size: int, path: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: whether ``leaf`` is leaf ``index`` of the tree of ``size`` with ``root``."""
    if not 0 <= index < size:
        return False
    sides = _sibling_sides(index, size - 1, len(path))
    if sides is None:
        return False
    r = leaf_hash(leaf)
    for p, left in zip(path, sides):
        r = node_hash(p, r) if left else node_hash(r, p)
    return hmac.compare_digest(r, root)


def consistency_proof(leaves: Sequence[bytes], first: int) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 9162 §2.1.4.1 for ``0 < first <= len(leaves)``."""
    if not 0 < first <= len(leaves):
        raise ValueError(f"first size {first!r} must be in [1, {len(leaves)!r}]")
    hashes = [leaf_hash(leaf) for leaf in leaves]
    proof: list[bytes] = []

    def subproof(m: int, start: int, end: int, whole: bool) -> None:
        # SUBPROOF(m, D[start:end], whole), appending in the RFC's order.
        if m == end - start:
            if not whole:
                proof.append(_subtree(hashes, start, end))
            return
        k = _split(end - start)
        if m <= k:
            subproof(m, start, start + k, whole)
            proof.append(_subtree(hashes, start + k, end))
        else:
            subproof(m - k, start + k, end, False)
            proof.append(_subtree(hashes, start, start + k))

    subproof(first, 0, len(hashes), True)
    return proof


def verify_consistency(first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: whether the tree of ``first`` leaves with ``first_root`` is a prefix of the tree of ``second``.

    An empty first tree is a prefix of every tree; equal sizes need equal roots and an empty proof.
    """
    if not 0 <= first <= second:
        return False
    if first == 0:
        return not proof
    if first == second:
        return not proof and hmac.compare_digest(first_root, second_root)
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    sides = _sibling_sides(fn, sn, len(path) - 1)
    if sides is None:
        return False
    fr = sr = path[0]
    for c, left in zip(path[1:], sides):
        if left:
            fr = node_hash(c, fr)
        sr = node_hash(c, sr) if left else node_hash(sr, c)
    return hmac.compare_digest(fr, first_root) and hmac.compare_digest(sr, second_root)
