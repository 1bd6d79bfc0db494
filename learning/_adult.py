"""The Adult task's declared feature specification (thesis §8.1.2).

The thesis buckets high-cardinality categoricals ("nation of origin" into US /
non-US) and drops two redundant or unnecessary columns; we drop ``education``
(the same information as ``education-num``) and ``fnlwgt`` (a census sampling
weight, not a property of the person). Every remaining feature is binary, as
in the thesis (§7.2, "we reduced all ordinal features to binary variables"):
numeric features are split at their privately estimated median, and each
categorical is grouped by domain meaning, not by looking at the labels.
``?`` (missing) is declared too, so every raw value has a bin: in
workclass and occupation it joins the larger, lower-income group; in
native-country it counts as non-US (the thesis's split has no third bin).
"""

from __future__ import annotations

from anonml.protocol import CategoricalFeature, FeatureSpec, LabelSpec, NumericFeature

_WORKCLASS = ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov", "Without-pay", "Never-worked", "?")
_MARITAL = ("Married-civ-spouse", "Married-AF-spouse", "Never-married", "Divorced", "Separated", "Widowed", "Married-spouse-absent")
_OCCUPATION = (
    "Exec-managerial", "Prof-specialty", "Tech-support", "Sales", "Protective-serv", "Adm-clerical", "Craft-repair",
    "Other-service", "Machine-op-inspct", "Transport-moving", "Handlers-cleaners", "Farming-fishing", "Priv-house-serv",
    "Armed-Forces", "?",
)
_RELATIONSHIP = ("Husband", "Wife", "Not-in-family", "Own-child", "Unmarried", "Other-relative")
_RACE = ("White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other")
_COUNTRIES = (
    "United-States", "Cambodia", "Canada", "China", "Columbia", "Cuba", "Dominican-Republic", "Ecuador", "El-Salvador",
    "England", "France", "Germany", "Greece", "Guatemala", "Haiti", "Holand-Netherlands", "Honduras", "Hong", "Hungary",
    "India", "Iran", "Ireland", "Italy", "Jamaica", "Japan", "Laos", "Mexico", "Nicaragua", "Outlying-US(Guam-USVI-etc)",
    "Peru", "Philippines", "Poland", "Portugal", "Puerto-Rico", "Scotland", "South", "Taiwan", "Thailand",
    "Trinadad&Tobago", "Vietnam", "Yugoslavia", "?",
)


def adult_spec(quantiles: int = 1) -> FeatureSpec:
    """The Adult specification; ``quantiles`` cut points per numeric feature
    (1 = the thesis's median binning). Bounds are the public ranges a census
    form allows (Algorithm 1's "educated guess")."""
    def numeric(name: str, low: float, high: float) -> NumericFeature:
        return NumericFeature(name, low, high, quantiles)

    return FeatureSpec(
        features=(
            numeric("age", 17, 90),
            CategoricalFeature("workclass", _WORKCLASS, (
                ("self-employed-or-government", ("Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov")),
                ("private-or-none", ("Private", "Without-pay", "Never-worked", "?")),
            )),
            numeric("education-num", 1, 16),
            CategoricalFeature("marital-status", _MARITAL, (
                ("married-spouse-present", ("Married-civ-spouse", "Married-AF-spouse")),
                ("other", ("Never-married", "Divorced", "Separated", "Widowed", "Married-spouse-absent")),
            )),
            CategoricalFeature("occupation", _OCCUPATION, (
                ("professional-managerial-technical", ("Exec-managerial", "Prof-specialty", "Tech-support", "Sales", "Protective-serv")),
                ("other", ("Adm-clerical", "Craft-repair", "Other-service", "Machine-op-inspct", "Transport-moving",
                           "Handlers-cleaners", "Farming-fishing", "Priv-house-serv", "Armed-Forces", "?")),
            )),
            CategoricalFeature("relationship", _RELATIONSHIP, (
                ("spouse", ("Husband", "Wife")),
                ("other", ("Not-in-family", "Own-child", "Unmarried", "Other-relative")),
            )),
            CategoricalFeature("race", _RACE, (
                ("white", ("White",)),
                ("other", ("Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other")),
            )),
            CategoricalFeature("sex", ("Male", "Female")),
            numeric("capital-gain", 0, 99999),
            numeric("capital-loss", 0, 4356),
            numeric("hours-per-week", 1, 99),
            CategoricalFeature("native-country", _COUNTRIES, (
                ("US", ("United-States", "Outlying-US(Guam-USVI-etc)")),
                ("non-US", tuple(c for c in _COUNTRIES if c not in ("United-States", "Outlying-US(Guam-USVI-etc)"))),
            )),
        ),
        label=LabelSpec(name="income", positive=(">50K",), negative=("<=50K",)),
    )
