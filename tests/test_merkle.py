"""RFC 9162 §2.1 Merkle tree hash, inclusion and consistency proofs: hand-computed small trees and properties."""

from __future__ import annotations

import hashlib

import pytest

from anonml.protocol import (
    EMPTY_ROOT,
    consistency_proof,
    inclusion_proof,
    tree_hash,
    verify_consistency,
    verify_inclusion,
)


def H(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def leaf(d: bytes) -> bytes:
    return H(b"\x00" + d)


def node(a: bytes, b: bytes) -> bytes:
    return H(b"\x01" + a + b)


LEAVES = [bytes([i]) * 3 for i in range(8)]
A, B, C, D, E, F, G = (leaf(x) for x in LEAVES[:7])


def test_tree_hash_of_small_trees_written_out_by_hand() -> None:
    assert tree_hash([]) == EMPTY_ROOT == H(b"")
    assert tree_hash(LEAVES[:1]) == A
    assert tree_hash(LEAVES[:2]) == node(A, B)
    # n = 3 splits at k = 2: MTH = node(node(a, b), c), not a balanced tree with a duplicate
    assert tree_hash(LEAVES[:3]) == node(node(A, B), C)
    assert tree_hash(LEAVES[:5]) == node(node(node(A, B), node(C, D)), E)
    # n = 7 (RFC 9162 §2.1.5's example tree)
    assert tree_hash(LEAVES[:7]) == node(node(node(A, B), node(C, D)), node(node(E, F), G))


def test_inclusion_paths_of_the_rfc_example_tree() -> None:
    # RFC 9162 §2.1.5 (g = (a, b), h = (c, d), i = (e, f), j = d6, k = (g, h), l = (i, j)): PATH(0) = [b, h, l]
    leaves = LEAVES[:7]
    assert inclusion_proof(leaves, 0) == [B, node(C, D), node(node(E, F), G)]
    # PATH(3) = [c, g, l]
    assert inclusion_proof(leaves, 3) == [C, node(A, B), node(node(E, F), G)]
    # PATH(4) = [f, j, k]
    assert inclusion_proof(leaves, 4) == [F, G, node(node(A, B), node(C, D))]
    # PATH(6) = [i, k]
    assert inclusion_proof(leaves, 6) == [node(E, F), node(node(A, B), node(C, D))]


def test_consistency_proofs_of_the_rfc_example_tree() -> None:
    leaves = LEAVES[:7]
    # RFC 9162 §2.1.5 names the nodes g = (a, b), h = (c, d), i = (e, f), j = d6, k = (g, h), l = (i, j).
    # PROOF(3, D[7]) = [c, d, g, l]
    assert consistency_proof(leaves, 3) == [C, D, node(A, B), node(node(E, F), G)]
    # PROOF(4, D[7]) = [l]
    assert consistency_proof(leaves, 4) == [node(node(E, F), G)]
    # PROOF(6, D[7]) = [i, j, k]
    assert consistency_proof(leaves, 6) == [node(E, F), G, node(node(A, B), node(C, D))]


@pytest.mark.parametrize("size", range(1, 18))
def test_every_leaf_of_every_small_tree_verifies_and_nothing_else_does(size: int) -> None:
    leaves = [H(bytes([size, i])) for i in range(size)]
    root = tree_hash(leaves)
    for index in range(size):
        path = inclusion_proof(leaves, index)
        assert verify_inclusion(leaves[index], index, size, path, root)
        assert not verify_inclusion(leaves[index], index, size, path, H(root))
        assert not verify_inclusion(H(leaves[index]), index, size, path, root)
        if size > 1:
            assert not verify_inclusion(leaves[index], (index + 1) % size, size, path, root)
            assert not verify_inclusion(leaves[index], index, size, path[:-1], root)
    assert not verify_inclusion(leaves[0], size, size, [], root)


@pytest.mark.parametrize("second", range(1, 18))
def test_every_prefix_is_consistent_and_a_rewritten_history_is_not(second: int) -> None:
    leaves = [H(bytes([second, i])) for i in range(second)]
    second_root = tree_hash(leaves)
    for first in range(1, second + 1):
        first_root = tree_hash(leaves[:first])
        proof = consistency_proof(leaves, first)
        assert verify_consistency(first, second, first_root, second_root, proof)
        assert not verify_consistency(first, second, H(first_root), second_root, proof)
        assert not verify_consistency(first, second, first_root, H(second_root), proof)
        # a log that changed an early leaf is not consistent with the old head
        altered = [H(b"other"), *leaves[1:]]
        assert not verify_consistency(first, second, first_root, tree_hash(altered), consistency_proof(altered, first))
        if first < second:
            assert not verify_consistency(first, second, first_root, second_root, proof[:-1])
            assert not verify_consistency(first + 1, second, first_root, second_root, proof)
    assert verify_consistency(0, second, EMPTY_ROOT, second_root, [])
    assert not verify_consistency(second, second - 1, second_root, second_root, [])
