"""The primitives' sizes in bytes, apart from the primitives themselves.

The packet geometry is arithmetic on these numbers; keeping them here lets a
command's ``--help`` show the geometry's defaults without loading libsodium
and OpenSSL (issue 29: every ``--help`` within 5 x ``python -c pass``).
"""

from __future__ import annotations

X25519_SCALAR_SIZE = 32
X25519_ELEMENT_SIZE = 32
HMAC_SHA256_SIZE = 32
SHA256_SIZE = 32
CHACHA20_KEY_SIZE = 32
# LIONESS (Anderson & Biham 1996 §3): the left part of the block is one stream
# cipher key long, the hash output is the same length so it can be xored into it.
LIONESS_HALF_SIZE = CHACHA20_KEY_SIZE
LIONESS_SUBKEY_SIZE = 32
LIONESS_KEY_SIZE = 4 * LIONESS_SUBKEY_SIZE
LIONESS_MIN_BLOCK_SIZE = LIONESS_HALF_SIZE + 1
