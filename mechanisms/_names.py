"""The oracles' and the post-processing methods' names: a module without numpy, so a command's help lists them quickly."""

from __future__ import annotations

from enum import StrEnum


class OracleName(StrEnum):
    """The frequency oracles by their wire name; ``AUTO`` lets :func:`make_oracle` choose."""

    GRR = "grr"
    SUE = "sue"
    PQ = "pq"
    OUE = "oue"
    OLH = "olh"
    SS = "ss"
    HR = "hr"
    AUTO = "auto"


class PostprocessMethod(StrEnum):
    """The post-processing methods (:mod:`mechanisms._postprocess` describes each)."""

    CLIP = "clip"
    NORM_SUB = "norm-sub"
    PROJECT = "project"
    IBU = "ibu"
