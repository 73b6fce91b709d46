"""The toy study's claims, stated so that a rerun can confirm them: paired per seed, counted, never a mean of a
heavy-tailed quantity.

Seed s of every method starts from the same model, data order and rollout seeds, so each claim compares a method
with its baseline *within* a seed: a ratio for the KLs (which span orders of magnitude between seeds), a difference
in points for accuracies. A claim holds in a seed when that paired value is on the claimed side of its bound.

Verdict of a study on a claim with n seeds, k of which hold: `holds` when k ≥ ⌈0.8 n⌉, `fails` when k ≤ ⌊0.2 n⌋
(the opposite holds in nearly every seed), `mixed` otherwise (no claim either way), `n/a` when a method or metric is
missing. A rerun confirms a `holds` claim when it holds in more than half of the rerun's seeds (its median paired
value is on the claimed side), and a `fails` claim when it holds in fewer than half; `mixed` and `n/a` claims are
not checked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

Verdict = Literal["holds", "fails", "mixed", "n/a"]
Check = Literal["held", "not held", "not checked"]


@dataclass(frozen=True)
class Claim:
    """One paired comparison: `quantity` of `method` against `baseline`, seed by seed.

    Attributes:
        key: stable identifier (the compare command matches claims by it).
        text: the claim as the report states it.
        quantity: a quantity of the study's per-seed table (`Query-KL`, `Policy-KL`, `T>1.0`, `gap`, ...).
            `Query-KL` is compared on the runs' own estimator when both runs optimise the same one, else on the
            common estimator.
        method, baseline: method labels of the study.
        paired: `ratio` (method / baseline) or `difference` (method − baseline, in points for accuracies).
        side: the claim holds in a seed when the paired value is `below` (or `above`) `bound`, strictly.
        bound: the threshold of the paired value.
    """

    key: str
    text: str
    quantity: str
    method: str
    baseline: str
    paired: Literal["ratio", "difference"]
    side: Literal["below", "above"]
    bound: float


CLAIMS: tuple[Claim, ...] = (
    Claim("query_kl.erpo", "erpo's final Query-KL is below 1/10 of grpo's", "Query-KL", "erpo", "grpo",
          "ratio", "below", 0.1),
    Claim("query_kl.erpo_released", "erpo_released's final Query-KL is below 1/10 of grpo's", "Query-KL",
          "erpo_released", "grpo", "ratio", "below", 0.1),
    Claim("query_kl.term_alone", "the Query-KL term alone (no w(q)) keeps Query-KL below 1/10 of grpo's", "Query-KL",
          "grpo + Query-KL", "grpo", "ratio", "below", 0.1),
    Claim("query_kl.policy_kl_does_not_hold_it", "grpo_kl (Policy-KL) ends with over 10× erpo's Query-KL",
          "Query-KL", "grpo_kl", "erpo", "ratio", "above", 10.0),
    Claim("policy_kl.grpo_kl", "grpo_kl ends with a lower Policy-KL than grpo", "Policy-KL", "grpo_kl", "grpo",
          "ratio", "below", 1.0),
    Claim("accuracy.erpo_high_t", "erpo is more accurate than grpo at T > 1.0", "T>1.0", "erpo", "grpo",
          "difference", "above", 0.0),
    Claim("accuracy.erpo_low_t", "erpo is more accurate than grpo at T ≤ 1.0", "T≤1.0", "erpo", "grpo",
          "difference", "above", 0.0),
    Claim("accuracy.erpo_released_high_t", "erpo_released is more accurate than grpo at T > 1.0", "T>1.0",
          "erpo_released", "grpo", "difference", "above", 0.0),
    Claim("gap.erpo", "erpo's train-vs-eval gap is smaller than grpo's", "gap", "erpo", "grpo",
          "difference", "below", 0.0),
)  # fmt: skip


def verdict(k: int, n: int) -> Verdict:
    """A study's verdict from k of n seeds holding (module docstring)."""
    if n == 0:
        return "n/a"
    if k >= math.ceil(0.8 * n):
        return "holds"
    return "fails" if k <= math.floor(0.2 * n) else "mixed"


def quantity_values(table: dict, estimators: dict[str, str], claim: Claim) -> tuple[np.ndarray, np.ndarray, str]:
    """Per-seed values of the claim's quantity for method and baseline, and the name of the column used.

    Args:
        table: method -> quantity -> one value per seed (experiments/toy_study_report.collect).
        estimators: method -> the Query-KL estimator its runs optimise.
    """
    name = claim.quantity
    if name == "Query-KL" and estimators.get(claim.method) != estimators.get(claim.baseline):
        name = "Query-KL (common)"
    method, baseline = (np.asarray(table[m][name], dtype=float) for m in (claim.method, claim.baseline))
    return method, baseline, name


def evaluate(claim: Claim, table: dict, estimators: dict[str, str]) -> dict:
    """The claim's per-seed paired values, k of n and verdict on one study (a JSON-ready dict)."""
    result = {**asdict(claim), "column": None, "per_seed": [], "k": 0, "n": 0, "median": None, "verdict": "n/a"}
    if claim.method not in table or claim.baseline not in table:
        return result
    method, baseline, result["column"] = quantity_values(table, estimators, claim)
    scale = 100.0 if claim.quantity.startswith("T") or claim.quantity == "gap" else 1.0  # accuracies in points
    with np.errstate(divide="ignore", invalid="ignore"):
        paired = method / baseline if claim.paired == "ratio" else scale * (method - baseline)
    finite = paired[np.isfinite(paired)]
    holds = finite < claim.bound if claim.side == "below" else finite > claim.bound
    result.update(
        per_seed=[float(v) if np.isfinite(v) else None for v in paired],
        k=int(holds.sum()),
        n=int(finite.size),
        median=float(np.median(finite)) if finite.size else None,
        verdict=verdict(int(holds.sum()), int(finite.size)),
    )
    return result


def evaluate_all(table: dict, estimators: dict[str, str], claims: tuple[Claim, ...] = CLAIMS) -> list[dict]:
    """`evaluate` for every claim, in order."""
    return [evaluate(claim, table, estimators) for claim in claims]


def confirm(shipped: dict, rerun: dict | None) -> Check:
    """Whether a rerun's result on a claim confirms the shipped study's verdict (module docstring)."""
    if shipped["verdict"] not in ("holds", "fails") or rerun is None or rerun["n"] == 0:
        return "not checked"
    majority = rerun["k"] > rerun["n"] / 2 if shipped["verdict"] == "holds" else rerun["k"] < rerun["n"] / 2
    return "held" if majority else "not held"


def describe(result: dict) -> str:
    """One line for the report: verdict, k of n, the per-seed paired values and their median."""
    if result["verdict"] == "n/a":
        return f"- **n/a**: {result['text']} (`{result['method']}` or `{result['baseline']}` not run, or not logged)"
    unit = "ratio" if result["paired"] == "ratio" else "difference (points)"
    values = " / ".join("n/a" if v is None else f"{v:.3g}" for v in result["per_seed"])
    bound = f"{'<' if result['side'] == 'below' else '>'} {result['bound']:g}"
    return (
        f"- **{result['verdict']}** ({result['k']} of {result['n']} seeds): {result['text']}. Per-seed {unit} "
        f"{result['method']} vs {result['baseline']} ({result['column']}): {values}; median {result['median']:.3g}; "
        f"the claim needs {bound}."
    )
