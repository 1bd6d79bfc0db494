"""An SGD round's pieces (``[task] kind = "sgd"``, issue 28): Harmony's LDP
gradient descent (``learning._linear``) for the loss the manifest signs
(``[task] loss``: logistic regression, linear SVM's hinge or linear
regression's squared loss; logistic when unset), one gradient step per
median sub-round of the schedule.

* **Iterations** are the schedule's median sub-rounds, and the peers of an
  iteration are the peers of the partitions that answer it
  (``RoundManifest.median_partitions``): the partition assignment every peer
  already derives from the seed, the roster and the relays' beacon values, so
  neither the aggregator nor a Sybil chooses who takes which step. Every data
  peer is in exactly one partition, hence in exactly one iteration.
* **The peer** encodes its record from the public feature spec alone
  (:class:`LinearEncoding`), takes its loss's gradient at the published
  model of its iteration, clips it to ``[-1, 1]^d`` and releases it with the
  1-bit mechanism at the round's whole ε_T (:class:`OneBitMean`: one
  coordinate ``j`` uniformly at random and one bit, ``2j + u`` in
  ``bytes_for(2d - 1)`` bytes: 1 byte for Adult's d = 13, 2 up to
  d = 32768). That is the
  peer's one release: its ledger holds one gradient at ε_T.
* **The aggregator** averages an iteration's reports (Harmony's unbiased
  estimate), takes step ``k`` of Algorithm 4 (:func:`harmony_step`) and
  publishes the next model as a signed :class:`protocol.SgdModel`. An
  iteration without reports leaves the model as it was. The round's model is
  the mean of the second half of the iterates, as ``LDPGradientDescent``
  predicts by default; the published documents are public, so this is
  post-processing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from anonml.learning._linear import FloatArray, LinearEncoding, Loss, clipped_gradients, harmony_step, wide_range_features
from anonml.mechanisms import OneBitMean, Release, ReleaseKind
from anonml.protocol import FeatureSpec, RoundManifest, SgdModel

SGD_LEARNING_RATE = 1.0
"""γ0 of a round's steps unless its manifest signs another (``[task] learning_rate``; ``anonml experiment``'s
default for LDP SGD); the peers' privacy does not depend on it."""
SGD_REGULARIZATION = 1e-4
"""λ of the round's steps (``LDPGradientDescent``'s default)."""


def sgd_iteration(manifest: RoundManifest, partition: int) -> int:
    """The one iteration the peers of ``partition`` take part in: the median sub-round it answers."""
    if manifest.comparison_pool:
        raise ValueError("an SGD round has no comparison pool: every partition takes one gradient step")
    return manifest.median_sub_round(partition)


def sgd_encoding(spec: FeatureSpec) -> LinearEncoding:
    """The vector encoding every party derives from the signed feature spec (wide amounts on a log scale)."""
    return LinearEncoding(spec, wide_range_features(spec))


@dataclass(frozen=True)
class SgdRule:
    """What the peers and the aggregator of one SGD round compute alike, from the manifest alone."""

    encoding: LinearEncoding
    epsilon: float
    """Each peer's one release: the round's ε_T."""
    learning_rate: float = SGD_LEARNING_RATE
    regularization: float = SGD_REGULARIZATION
    loss: Loss = Loss.LOGISTIC
    """Whose gradient the peers release (``[task] loss``): the model the round trains, as ``anonml experiment``'s
    ``ldp-sgd-lr``, ``ldp-sgd-svm`` or ``ldp-sgd-linreg`` trains it."""

    @classmethod
    def of(cls, manifest: RoundManifest) -> SgdRule:
        rate = SGD_LEARNING_RATE if manifest.sgd_learning_rate is None else manifest.sgd_learning_rate
        loss = Loss.LOGISTIC if manifest.sgd_loss is None else Loss(manifest.sgd_loss)
        return cls(sgd_encoding(FeatureSpec.from_dict(dict(manifest.features))), manifest.eps_total, learning_rate=rate, loss=loss)

    @property
    def mechanism(self) -> OneBitMean:
        return OneBitMean(self.epsilon, self.encoding.dimension)

    def release(self) -> Release:
        """What one gradient report reveals, for the ledger: every feature and the label, at ε_T."""
        return Release.about(ReleaseKind.GRADIENT, tuple(f.name for f in self.encoding.spec.features), self.epsilon)

    def initial_model(self) -> SgdModel:
        """Iteration 0's model: every coefficient 0 (Algorithm 4, line 1)."""
        return SgdModel(0, (0.0,) * self.encoding.dimension)

    def _coefficients(self, model: SgdModel) -> FloatArray:
        if len(model.coefficients) != self.encoding.dimension:
            raise ValueError(f"the model of iteration {model.iteration} has {len(model.coefficients)} coefficients; "
                             f"the round's encoding has {self.encoding.dimension}")
        return np.asarray(model.coefficients, dtype=np.float64)

    def gradient_report(self, model: SgdModel, features: Mapping[str, float | str], label: int,
                        rng: np.random.Generator) -> bytes:
        """A peer's one report: its clipped gradient of the round's loss at ``model``, through the 1-bit mechanism.

        ``label`` is the encoded label (0 or 1, ``LabelSpec.encode``)."""
        if label not in (0, 1):
            raise ValueError(f"label must be the encoded label, 0 or 1, got {label!r}")
        x = self.encoding.record(features)[None, :]
        gradient = clipped_gradients(self.loss, self._coefficients(model), x, np.asarray([2.0 * label - 1.0]))
        mechanism = self.mechanism
        return mechanism.encode_report(mechanism.privatize(gradient, rng)[0])

    def step(self, model: SgdModel, reports: Sequence[bytes]) -> SgdModel:
        """The next iteration's model from this iteration's reports (InvalidReport for a malformed one)."""
        beta = self._coefficients(model)
        if reports:
            mechanism = self.mechanism
            noisy_mean = mechanism.estimate(mechanism.decode_reports(list(reports)))
            beta = harmony_step(beta, noisy_mean, model.iteration + 1, self.learning_rate, self.regularization)
        return SgdModel(model.iteration + 1, tuple(float(b) for b in beta))

    def replay(self, reports_by_iteration: Sequence[Sequence[bytes]]) -> list[SgdModel]:
        """Every published model, iteration 0 to the last, from the stored reports: a restarted aggregator
        publishes the same documents."""
        models = [self.initial_model()]
        for reports in reports_by_iteration:
            models.append(self.step(models[-1], reports))
        return models


def averaged_model(models: Sequence[SgdModel]) -> FloatArray:
    """The round's model: the mean of the iterates after the first half of the steps (``LDPGradientDescent``'s
    ``average``), taken over the models published after each step."""
    stepped = models[1:]
    if not stepped:
        raise ValueError("the round took no step: at least one iteration's model is needed")
    steps = len(stepped)
    tail = [np.asarray(m.coefficients) for k, m in enumerate(stepped, start=1) if 2 * k > steps]
    averaged: FloatArray = np.mean(tail, axis=0)
    return averaged
