"""The signed model of one iteration of an SGD round (``[task] kind = "sgd"``).

In an SGD round the median schedule's sub-rounds are the gradient steps: the
peers of the partitions that answer sub-round ``i``
(``RoundManifest.median_partitions``) each send one perturbed gradient of
their loss at the model the aggregator published for iteration ``i``; after
that sub-round's delivery window the aggregator averages them, takes one step
and publishes iteration ``i + 1``'s model, signed (and mirrored like the
thresholds), before the next send window opens. The document after the last
iteration is the round's model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nacl.signing import SigningKey

from anonml.protocol._api import finite_number
from anonml.protocol._canonical import InvalidDocument
from anonml.protocol._signed import DocumentKind, SignedDocument

MAX_SGD_DIMENSION = 4096
"""The most coefficients a published model may hold (an intercept, a numeric feature's one, a categorical one's bins - 1)."""
MAX_SGD_ITERATIONS = 2**16 - 1
"""Iterations are median sub-rounds, numbered as they are."""


class InvalidSgdModel(InvalidDocument):
    """Raised for a model document whose body is malformed."""


@dataclass(frozen=True)
class SgdModel:
    """The coefficients every peer of ``iteration`` computes its gradient at (``iteration`` = the number of steps
    already taken, so iteration 0's model is the starting point and the last iteration's the round's result)."""

    iteration: int
    coefficients: tuple[float, ...]

    def __post_init__(self) -> None:
        if isinstance(self.iteration, bool) or not 0 <= self.iteration <= MAX_SGD_ITERATIONS:
            raise InvalidSgdModel("iteration", f"expected an integer in [0, {MAX_SGD_ITERATIONS}], got {self.iteration!r}")
        if not 1 <= len(self.coefficients) <= MAX_SGD_DIMENSION:
            raise InvalidSgdModel("coefficients", f"expected 1 to {MAX_SGD_DIMENSION} coefficients, got {len(self.coefficients)}")
        if not all(math.isfinite(c) for c in self.coefficients):
            raise InvalidSgdModel("coefficients", "every coefficient must be a finite number")

    def to_body(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "coefficients": list(self.coefficients)}

    def sign(self, signing_key: SigningKey, round_id: bytes) -> SignedDocument:
        return SignedDocument.create(signing_key, DocumentKind.SGD_MODEL, round_id, self.to_body())

    @classmethod
    def from_document(cls, document: SignedDocument) -> SgdModel:
        """The model in a verified envelope's body; raises InvalidSgdModel naming the bad field."""
        reader = document.fields(InvalidSgdModel)
        iteration = reader.integer("iteration", 0, MAX_SGD_ITERATIONS)
        raw = reader.items("coefficients", max_items=MAX_SGD_DIMENSION)
        reader.done()
        path = reader.name("coefficients")
        return cls(iteration, tuple(finite_number(reader, value, f"{path}[{index}]") for index, value in enumerate(raw)))
