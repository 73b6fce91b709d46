"""A study's claims, stated so that a rerun can confirm them: paired per seed, with the verdict rule part of the claim.

Seed s of every arm starts from the same model, data order and rollout seeds, so each claim compares an arm (its
`method`) with its baseline *within* a seed: a ratio for KLs (which span orders of magnitude between seeds), a
difference in points for accuracies. A claim holds in a seed when that paired value is on the claimed side of its
bound. Seeds are paired by number: a seed one of the two arms did not run is left out.

Verdict rules (`Claim.rule`):
- `KOfN` (the toy study's): with n seeds, k of which hold, `holds` when k ≥ ⌈0.8 n⌉, `fails` when k ≤ ⌊0.2 n⌋ (the
  opposite holds in nearly every seed), `mixed` otherwise.
- `MeanMargin` (a pre-registered rule): the margin of a seed is how far its paired value is on the claimed side of
  the bound. `confirmed` when every seed's margin is positive and their mean is at least `confirm_mean`; `refuted`
  when the mean is at most `refute_mean` and no seed's margin exceeds `refute_seed`; `inconclusive` otherwise.
- `SignTest` (the overfitting study's): the seeds decide the direction by a one-sided sign test, a bootstrap interval
  of the mean margin decides the size: `confirmed`, `refuted` or `inconclusive` (its docstring).
A claim's baseline may be the base model (`BASE_ARM`), when the study's table carries its row (one value repeated for
every seed: the base model is swept once).
Every rule gives `n/a` when an arm or metric is missing, and `undefined` when both arms ran but no seed's paired value
is a number (a ratio against a baseline of 0: an arm that never moved from θ0). A seed whose paired value is not a
number counts in neither k nor n; the result lists it in `undefined_seeds`. Gates (`Claim.gates`) are checked first:
a claim whose gate fails gets the gate's verdict (`invalid` for a study's validity gate, `untestable` for a claim's
testability gate, `confounded` for a `LearningGuard`: the method learned too little for its win to mean anything). A
failed learning guard discounts only a win: a `refuted` or `inconclusive` claim keeps its verdict and records the
guard beside it (`apply_gates`; until 2026-12-07 the guard overwrote every verdict, issue 68).

A rerun confirms a claim the study found firm (`holds` / `confirmed`: it held; `fails` / `refuted`: it did not) when
it agrees in more than half of the rerun's seeds; other verdicts are not checked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

Check = Literal["held", "not held", "not checked"]
# A firm verdict -> whether the claim held in the study (what a rerun's majority of seeds must agree with).
FIRM: dict[str, bool] = {"holds": True, "confirmed": True, "fails": False, "refuted": False}


GUARD_VERDICT = "confounded"  # what a failed learning guard makes of a win (apply_gates)
BASE_ARM = "base model"  # the base model's row of a study's table (studies.engine.report.with_base_model)


def is_accuracy(quantity: str) -> bool:
    """Whether a quantity of the per-seed table is an accuracy or a share in [0, 1] (held-out, training, their gap,
    high-temperature retention; a training reward over a window of steps, `reward ...`; the share of correct answers
    reached through wrong steps, `wrong steps ...`), which claims and gates compare in points."""
    return quantity.startswith(("T", "gap", "train T", "retention", "reward", "wrong steps"))


@dataclass(frozen=True)
class KOfN:
    """The claim holds in at least `holds_share` of the seeds (`holds`), in at most `fails_share` (`fails`), or
    neither (`mixed`)."""

    holds_share: float = 0.8
    fails_share: float = 0.2

    def verdict(self, margins: np.ndarray) -> str:
        k, n = int((margins > 0).sum()), int(margins.size)
        if n == 0:
            return "n/a"
        if k >= math.ceil(self.holds_share * n):
            return "holds"
        return "fails" if k <= math.floor(self.fails_share * n) else "mixed"

    def extra(self, margins: np.ndarray) -> dict:
        """Fields this rule adds to a claim's result: none (the toy study's claims file keeps its shape)."""
        return {}

    def describe(self) -> str:
        return f"holds in ≥ {self.holds_share:.0%} of seeds, fails in ≤ {self.fails_share:.0%}"


@dataclass(frozen=True)
class MeanMargin:
    """Confirmed when every seed's margin is positive with a mean ≥ `confirm_mean`; refuted when the mean is
    ≤ `refute_mean` and no seed's margin exceeds `refute_seed`; inconclusive otherwise (margins in the claim's
    units: points for accuracies)."""

    confirm_mean: float = 3.0
    refute_mean: float = 0.0
    refute_seed: float = 2.0

    def verdict(self, margins: np.ndarray) -> str:
        if margins.size == 0:
            return "n/a"
        if (margins > 0).all() and margins.mean() >= self.confirm_mean:
            return "confirmed"
        if margins.mean() <= self.refute_mean and not (margins > self.refute_seed).any():
            return "refuted"
        return "inconclusive"

    def extra(self, margins: np.ndarray) -> dict:
        """The mean margin (what the rule reads), whether the seeds split (some hold, some not: add a seed), and the
        rule in words."""
        split = bool(margins.size and (margins > 0).any() and not (margins > 0).all())
        mean = float(margins.mean()) if margins.size else None
        return {"rule": self.describe(), "mean_margin": mean, "seeds_split": split}

    def describe(self) -> str:
        return (
            f"confirmed if the margin is positive in every seed with a mean ≥ {self.confirm_mean:g}; refuted if the "
            f"mean is ≤ {self.refute_mean:g} and no seed exceeds {self.refute_seed:g}; else inconclusive"
        )


@dataclass(frozen=True)
class SignTest:
    """Direction by a sign test, size by a bootstrap interval (pre-registered in studies/overfit/overfit_plan.md).

    With k of n seeds' margins positive, the one-sided sign test's p-value is P(X ≥ k) for X ~ Binomial(n, 1/2)
    (7 of 8 seeds: p = 9/256 ≈ 0.035). The interval is the percentile bootstrap of the mean margin (`resamples`
    resamples of the n seeds with replacement, generator seed 0, so that it recomputes exactly), at `level`.
    - `confirmed`: p ≤ `alpha` and the mean margin ≥ `effect` (the seeds agree, and the effect is large enough);
    - `refuted`: the interval's upper end < `effect` (the seeds rule out an effect of that size);
    - `inconclusive` otherwise.
    Margins are in the claim's units (points for accuracies).
    """

    effect: float
    alpha: float = 0.05
    resamples: int = 10_000
    level: float = 0.95

    def sign_test_p(self, margins: np.ndarray) -> float:
        n, k = int(margins.size), int((margins > 0).sum())
        return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n

    def interval(self, margins: np.ndarray) -> tuple[float, float]:
        """The bootstrap interval of the mean margin, (low, high)."""
        draws = np.random.default_rng(0).integers(0, margins.size, size=(self.resamples, margins.size))
        means = margins[draws].mean(axis=1)
        tail = (1 - self.level) / 2
        return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))

    def verdict(self, margins: np.ndarray) -> str:
        if margins.size == 0:
            return "n/a"
        if self.sign_test_p(margins) <= self.alpha and margins.mean() >= self.effect:
            return "confirmed"
        return "refuted" if self.interval(margins)[1] < self.effect else "inconclusive"

    def extra(self, margins: np.ndarray) -> dict:
        """The mean margin, the sign test's p, the bootstrap interval, whether the seeds split, and the rule."""
        if not margins.size:
            return {"rule": self.describe(), "mean_margin": None, "sign_test_p": None, "interval": None,
                    "seeds_split": False}  # fmt: skip
        split = bool((margins > 0).any() and not (margins > 0).all())
        return {"rule": self.describe(), "mean_margin": float(margins.mean()),
                "sign_test_p": self.sign_test_p(margins), "interval": list(self.interval(margins)),
                "seeds_split": split}  # fmt: skip

    def describe(self) -> str:
        return (
            f"confirmed if a one-sided sign test gives p ≤ {self.alpha:g} and the mean margin is ≥ {self.effect:g}; "
            f"refuted if the {self.level:.0%} bootstrap interval of the mean margin lies below {self.effect:g}; "
            f"else inconclusive"
        )


@dataclass(frozen=True)
class Gate:
    """A precondition of a claim, checked in every seed the claim pairs: `quantity` of `arm` (minus its `minus`
    quantity, when given; minus the same quantity of `minus_arm`, when given: the base model's, say) lies within
    [low, high] (points for accuracies; None: no bound). A failed gate gives the claim the verdict `fails_as`."""

    key: str
    text: str
    arm: str
    quantity: str
    minus: str | None = None
    low: float | None = None
    high: float | None = None
    fails_as: str = "untestable"
    minus_arm: str | None = None

    def arms(self) -> tuple[str, ...]:
        """The arms the gate reads."""
        return (self.arm,) + ((self.minus_arm,) if self.minus_arm else ())

    def check(self, table: dict, seeds: list[int], method: str) -> dict:
        """The gate's per-seed values and whether it passed (False too when its arm or a seed is missing); a gate
        against no other arm records no `minus_arm` (the claims files of earlier studies keep their shape)."""
        fields = {key: value for key, value in asdict(self).items() if key != "minus_arm" or value is not None}
        result = {**fields, "per_seed": [], "passed": False}
        if not seeds or any(arm not in table or not set(seeds) <= set(table[arm]["seed"]) for arm in self.arms()):
            return result
        values = seed_values(table, self.arm, self.quantity, seeds)
        if self.minus is not None:
            values = values - seed_values(table, self.arm, self.minus, seeds)
        if self.minus_arm is not None:
            values = values - seed_values(table, self.minus_arm, self.quantity, seeds)
        values = values * points(self.quantity)
        low, high = -math.inf if self.low is None else self.low, math.inf if self.high is None else self.high
        inside = np.isfinite(values) & (values >= low) & (values <= high)
        result.update(per_seed=[float(v) if np.isfinite(v) else None for v in values], passed=bool(inside.all()))
        return result


@dataclass(frozen=True)
class LearningGuard:
    """The claim's method must have learned: its mean gain in `quantity` over the base model (BASE_ARM) is at least
    `min_share` of the reference `arm`'s mean gain, over the seeds the claim pairs. A method that learned less can
    look better on a gap or on held-out accuracy only because it moved less; its claim is then `fails_as`."""

    key: str
    text: str
    arm: str  # the reference arm (grpo)
    quantity: str = "train T=1"
    min_share: float = 0.5
    fails_as: str = "confounded"

    def arms(self) -> tuple[str, ...]:
        """The arms the guard reads besides the claim's method."""
        return (self.arm, BASE_ARM)

    def check(self, table: dict, seeds: list[int], method: str) -> dict:
        """Per seed, the method's gain (points); `share`: its mean gain over the reference's; whether it passed."""
        result = {**asdict(self), "per_seed": [], "reference_gain": None, "share": None, "passed": False}
        arms = (method, *self.arms())
        if not seeds or any(arm not in table or not set(seeds) <= set(table[arm]["seed"]) for arm in arms):
            return result
        base = seed_values(table, BASE_ARM, self.quantity, seeds)
        gain, reference = (points(self.quantity) * (seed_values(table, arm, self.quantity, seeds) - base)
                           for arm in (method, self.arm))  # fmt: skip
        share = float(gain.mean() / reference.mean()) if reference.mean() > 0 else float("nan")
        result.update(per_seed=[float(v) for v in gain], reference_gain=float(reference.mean()), share=share,
                      passed=bool(np.isfinite(share) and share >= self.min_share))  # fmt: skip
        return result


@dataclass(frozen=True)
class Claim:
    """One paired comparison: `quantity` of `method` against `baseline`, seed by seed.

    Attributes:
        key: stable identifier (the compare command matches claims by it).
        text: the claim as the report states it.
        quantity: a quantity of the study's per-seed table (`Query-KL`, `Policy-KL`, `T=1.5`, `T>1.0`, `gap`, ...).
            `Query-KL` is compared on the runs' own estimator when both runs optimise the same one, else on the
            common estimator.
        method, baseline: arm labels of the study.
        paired: `ratio` (method / baseline) or `difference` (method − baseline, in points for accuracies).
        side: the claim holds in a seed when the paired value is `below` (or `above`) `bound`, strictly.
        bound: the threshold of the paired value.
        rule: the verdict rule (KOfN, MeanMargin, SignTest, or studies.engine.paired.PairedInterval).
        gates: preconditions (a study's validity gates, the claim's testability gates, a learning guard), checked
            in order.
    """

    key: str
    text: str
    quantity: str
    method: str
    baseline: str
    paired: Literal["ratio", "difference"]
    side: Literal["below", "above"]
    bound: float
    rule: KOfN | MeanMargin | SignTest = KOfN()
    gates: tuple[Gate | LearningGuard, ...] = ()

    def record(self) -> dict:
        """The claim's definition as its result starts (no rule or gates: those add their own fields)."""
        return {key: value for key, value in asdict(self).items() if key not in ("rule", "gates")}


def points(quantity: str) -> float:
    """The scale of a quantity's paired differences: 100 for accuracies (points), 1 otherwise."""
    return 100.0 if is_accuracy(quantity) else 1.0


def seed_values(table: dict, arm: str, quantity: str, seeds: list[int]) -> np.ndarray:
    """`quantity` of `arm` in each of `seeds` (table: arm -> quantity -> one value per seed, `seed` the seeds)."""
    by_seed = dict(zip(table[arm]["seed"], table[arm][quantity], strict=True))
    return np.asarray([by_seed[seed] for seed in seeds], dtype=float)


def common_seeds(table: dict, *arms: str) -> list[int]:
    """The seeds every one of `arms` ran, in order."""
    return sorted(set.intersection(*(set(table[arm]["seed"]) for arm in arms)))


def quantity_values(table: dict, estimators: dict[str, str], claim: Claim) -> tuple[np.ndarray, np.ndarray, str]:
    """Per-seed values of the claim's quantity for method and baseline (on the seeds both ran), and the name of the
    column used.

    Args:
        table: arm -> quantity -> one value per seed (studies.engine.report.collect).
        estimators: arm -> the Query-KL estimator its runs optimise.
    """
    name = claim.quantity
    if name == "Query-KL" and estimators.get(claim.method) != estimators.get(claim.baseline):
        name = "Query-KL (common)"
    seeds = common_seeds(table, claim.method, claim.baseline)
    method, baseline = (seed_values(table, arm, name, seeds) for arm in (claim.method, claim.baseline))
    return method, baseline, name


def evaluate(claim: Claim, table: dict, estimators: dict[str, str]) -> dict:
    """The claim's per-seed paired values, k of n and verdict on one study (a JSON-ready dict)."""
    result = {**claim.record(), "column": None, "per_seed": [], "k": 0, "n": 0, "median": None, "verdict": "n/a"}
    if claim.method not in table or claim.baseline not in table:
        return result
    method, baseline, result["column"] = quantity_values(table, estimators, claim)
    with np.errstate(divide="ignore", invalid="ignore"):
        paired = method / baseline if claim.paired == "ratio" else points(claim.quantity) * (method - baseline)
    finite = paired[np.isfinite(paired)]
    margins = finite - claim.bound if claim.side == "above" else claim.bound - finite
    seeds = common_seeds(table, claim.method, claim.baseline)
    if not np.isfinite(paired).all():  # only then: the claims files of studies without such seeds keep their shape
        result["undefined_seeds"] = [seed for seed, value in zip(seeds, paired, strict=True) if not np.isfinite(value)]
    result.update(
        per_seed=[float(v) if np.isfinite(v) else None for v in paired],
        k=int((margins > 0).sum()),
        n=int(finite.size),
        median=float(np.median(finite)) if finite.size else None,
        verdict=claim.rule.verdict(margins) if finite.size or not paired.size else "undefined",
        **claim.rule.extra(margins),
    )
    if claim.gates:
        result["gates"] = [gate.check(table, seeds, claim.method) for gate in claim.gates]
        result.update(apply_gates(result["verdict"], result["gates"]))
    return result


def apply_gates(verdict: str, gates: list[dict]) -> dict:
    """The verdict after the claim's checked gates, in order, and (when one is) the learning guard that failed but
    left the verdict standing.

    A validity or testability gate that failed replaces any verdict the rule reached. A failed learning guard
    (`fails_as` "confounded") discounts only a win (`confirmed`, `holds`): it exists so that an arm that learned late
    cannot claim a better end state, and says nothing against a claim the rule refuted or left open; that verdict
    stands and the guard is recorded beside it (`guard_failed`).
    """
    if verdict in ("n/a", "undefined"):
        return {"verdict": verdict}
    kept = None
    for gate in gates:
        if gate["passed"]:
            continue
        if gate["fails_as"] == GUARD_VERDICT and not FIRM.get(verdict, False):
            kept = kept or gate["key"]
            continue
        return {"verdict": gate["fails_as"]}
    return {"verdict": verdict} if kept is None else {"verdict": verdict, "guard_failed": kept}


def evaluate_all(table: dict, estimators: dict[str, str], claims: tuple[Claim, ...]) -> list[dict]:
    """`evaluate` for every claim, in order."""
    return [evaluate(claim, table, estimators) for claim in claims]


def confirm(shipped: dict, rerun: dict | None) -> Check:
    """Whether a rerun's result on a claim confirms the shipped study's verdict (module docstring)."""
    if shipped["verdict"] not in FIRM or rerun is None or rerun["n"] == 0:
        return "not checked"
    majority = rerun["k"] > rerun["n"] / 2 if FIRM[shipped["verdict"]] else rerun["k"] < rerun["n"] / 2
    return "held" if majority else "not held"


def describe(result: dict) -> str:
    """One line for the report: verdict, k of n, the per-seed paired values and their median (and, for the
    pre-registered rule, the mean margin, the gates' values and whether the seeds split)."""
    if result["verdict"] == "n/a":
        return f"- **n/a**: {result['text']} (`{result['method']}` or `{result['baseline']}` not run, or not logged)"
    unit = (
        "ratio"
        if result["paired"] == "ratio"
        else "difference (points)"
        if is_accuracy(result["quantity"])
        else ("difference")
    )
    if result["verdict"] == "undefined":
        return (
            f"- **undefined**: {result['text']}. The {unit} {result['method']} vs {result['baseline']} "
            f"({result['column']}) is not a number in any seed (seeds {undefined_seeds(result)}: "
            f"{undefined_cause(result)}), so no seed can decide it."
        )
    values = " / ".join("n/a" if v is None else f"{v:.3g}" for v in result["per_seed"])
    bound = f"{'<' if result['side'] == 'below' else '>'} {result['bound']:g}"
    line = (
        f"- **{result['verdict']}** ({result['k']} of {result['n']} seeds): {result['text']}. Per-seed {unit} "
        f"{result['method']} vs {result['baseline']} ({result['column']}): {values}; median {result['median']:.3g}; "
        f"the claim needs {bound}."
    )
    if "sign_test_p" in result:
        low, high = result["interval"]
        line += (f" Mean margin {result['mean_margin']:.3g}, sign test p = {result['sign_test_p']:.3g}, bootstrap "
                 f"interval [{low:.3g}, {high:.3g}]; rule: {result['rule']}.")  # fmt: skip
    elif "summary" in result:  # a rule that words its own values (studies.engine.paired.PairedInterval)
        line += f" {result['summary']}"
    elif "rule" in result:
        line += f" Mean margin {result['mean_margin']:.3g}; rule: {result['rule']}."
    for gate in result.get("gates", []):
        gate_values = " / ".join("n/a" if v is None else f"{v:.3g}" for v in gate["per_seed"]) or "not run"
        share = f", mean gain {gate['share']:.2f} of {gate['arm']}'s" if gate.get("share") is not None else ""
        share += f", mean {gate['mean']:.3g}" if gate.get("mean") is not None else ""
        line += (f" Gate `{gate['key']}` ({gate['text']}): {gate_values}{share}, "
                 f"{'passed' if gate['passed'] else 'FAILED'}.")  # fmt: skip
    if result.get("guard_failed"):
        line += (f" The learning guard `{result['guard_failed']}` failed, which discounts only a win: the rule's "
                 f"verdict stands.")  # fmt: skip
    if result.get("undefined_seeds"):
        line += f" Left out as not a number: seeds {undefined_seeds(result)} ({undefined_cause(result)})."
    if result.get("seeds_split"):
        line += " The seeds split: the margin is positive in some seeds and not in others."
    return line


def undefined_seeds(result: dict) -> str:
    """The seeds whose paired value is not a number, as `0, 3`."""
    return ", ".join(str(seed) for seed in result["undefined_seeds"])


def undefined_cause(result: dict) -> str:
    """Why a seed's paired value is not a number, in words."""
    if result["paired"] == "ratio":
        return f"{result['baseline']}'s value is 0 or missing there, and a ratio against 0 is undefined"
    return "a value is missing there"
