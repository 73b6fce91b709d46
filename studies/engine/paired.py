"""A verdict rule that one seed cannot flip, and checks on a mean over seeds (studies/brake, studies/long_horizon).

`PairedInterval` decides a claim by the Student-t interval of the mean paired margin, and asks the same verdict of
every subset that leaves one seed out: a rerun on another machine draws new values for a seed, so a verdict that one
seed decides is no verdict. `MeanCheck` is a gate or learning guard on a mean over the claim's seeds (the early
training reward of the method minus its baseline's, the size of grpo's decline), where `claims.Gate` asks every seed.

The t quantile is computed here (Simpson's rule on the t density, then bisection) because the environment carries no
scipy; `t_quantile(0.975, 7)` is 2.3646 to four decimals, as tables give it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from studies.engine.claims import points, seed_values

# Accuracies are multiples of 1/800 or so: a mean that lands on a check's bound must not miss it by rounding.
ROUNDING = 1e-9
SIMPSON_INTERVALS = 4000  # even; the t density is smooth, so this is accurate to ~1e-10 on the quantiles used


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom (x >= 0 is integrated; x < 0 by symmetry)."""
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    grid = np.linspace(0.0, x, SIMPSON_INTERVALS + 1)
    density = scale * (1.0 + grid**2 / df) ** (-(df + 1) / 2)
    weights = np.ones(SIMPSON_INTERVALS + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return 0.5 + float(x / SIMPSON_INTERVALS / 3 * (weights * density).sum())


def t_quantile(p: float, df: int) -> float:
    """The `p` quantile (0.5 <= p < 1) of Student's t with `df` >= 1 degrees of freedom, to ~1e-9."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def t_interval(margins: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The two-sided `level` Student-t interval of the mean of `margins` (n >= 2): mean ± t · sd / √n, with the
    sample standard deviation (ddof 1) and n − 1 degrees of freedom."""
    n = int(margins.size)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {n}")
    half = t_quantile((1 + level) / 2, n - 1) * float(margins.std(ddof=1)) / math.sqrt(n)
    mean = float(margins.mean())
    return mean - half, mean + half


@dataclass(frozen=True)
class PairedInterval:
    """The claim's margins (the paired difference on the claimed side of its bound, points for accuracies) decide by
    the `level` t interval of their mean against the minimum effect `effect`:
    - `confirmed`: the interval lies above `effect` (its lower end > effect), on all n seeds and, with
      `leave_one_out`, on each of the n subsets of n − 1 seeds;
    - `refuted`: the interval lies below `effect` (its upper end < effect) on all of them: an effect that large is
      ruled out;
    - `inconclusive` otherwise, and with fewer than `min_seeds` seeds.
    """

    effect: float
    level: float = 0.95
    leave_one_out: bool = True
    min_seeds: int = 3

    def side(self, margins: np.ndarray) -> str:
        """`above` (the interval clears the effect), `below` (it rules the effect out) or `across`."""
        low, high = t_interval(margins, self.level)
        return "above" if low > self.effect else "below" if high < self.effect else "across"

    def subsets(self, margins: np.ndarray) -> list[np.ndarray]:
        """The margins the rule reads: all of them, then each leave-one-out subset (in seed order)."""
        dropped = [np.delete(margins, i) for i in range(margins.size)] if self.leave_one_out else []
        return [margins, *dropped]

    def verdict(self, margins: np.ndarray) -> str:
        if margins.size == 0:
            return "n/a"
        if margins.size < self.min_seeds:
            return "inconclusive"
        sides = {self.side(subset) for subset in self.subsets(margins)}
        if sides == {"above"}:
            return "confirmed"
        return "refuted" if sides == {"below"} else "inconclusive"

    def extra(self, margins: np.ndarray) -> dict:
        """The mean margin, the interval, the leave-one-out intervals and how many of them land on another side
        than the full interval (`flips`: 0 for a verdict no single seed decides), and the rule in words."""
        result = {"rule": self.describe(), "mean_margin": None, "t_interval": None, "leave_one_out": [],
                  "flips": None, "seeds_split": False}  # fmt: skip
        if margins.size < max(2, self.min_seeds):
            result["summary"] = f"{margins.size} seed(s): too few for an interval; rule: {self.describe()}."
            return result
        full, *dropped = self.subsets(margins)
        side = self.side(full)
        result.update(mean_margin=float(full.mean()), t_interval=list(t_interval(full, self.level)),
                      leave_one_out=[list(t_interval(subset, self.level)) for subset in dropped],
                      flips=sum(self.side(subset) != side for subset in dropped),
                      seeds_split=bool((margins > 0).any() and not (margins > 0).all()))  # fmt: skip
        low, high = result["t_interval"]
        result["summary"] = (f"Mean margin {result['mean_margin']:.3g}, {self.level:.0%} t interval [{low:.3g}, "
                             f"{high:.3g}] against a minimum effect of {self.effect:g}; leaving one seed out moves "
                             f"it to another side in {result['flips']} of {len(dropped)} subsets; rule: "
                             f"{self.describe()}.")  # fmt: skip
        return result

    def describe(self) -> str:
        loo = " and on every subset leaving one seed out" if self.leave_one_out else ""
        return (
            f"confirmed if the {self.level:.0%} t interval of the mean margin lies above {self.effect:g} on all "
            f"seeds{loo}; refuted if it lies below {self.effect:g} on all of them; else inconclusive"
        )


@dataclass(frozen=True)
class MeanCheck:
    """A gate or guard on a mean over the claim's seeds: the mean of `quantity` of `arm` (None: the claim's method)
    minus the same quantity of `minus_arm` (None: nothing subtracted), in points for accuracies, lies within
    [low, high] (None: no bound). A seed where a value is missing counts against it (the check fails). A failed check
    gives the claim the verdict `fails_as` (`confounded` for a learning guard, `untestable` for a gate)."""

    key: str
    text: str
    quantity: str
    arm: str | None = None
    minus_arm: str | None = None
    low: float | None = None
    high: float | None = None
    fails_as: str = "confounded"

    def arms(self) -> tuple[str, ...]:
        """The arms the check reads besides the claim's method."""
        return tuple(arm for arm in (self.arm, self.minus_arm) if arm is not None)

    def check(self, table: dict, seeds: list[int], method: str) -> dict:
        """Per seed, the checked value; `mean`: their mean; whether it lies within the bounds."""
        result = {**asdict(self), "per_seed": [], "mean": None, "passed": False}
        arms = (self.arm or method, *((self.minus_arm,) if self.minus_arm else ()))
        if not seeds or any(arm not in table or not set(seeds) <= set(table[arm]["seed"]) for arm in arms):
            return result
        values = seed_values(table, arms[0], self.quantity, seeds)
        if self.minus_arm is not None:
            values = values - seed_values(table, self.minus_arm, self.quantity, seeds)
        values = values * points(self.quantity)
        result["per_seed"] = [float(v) if np.isfinite(v) else None for v in values]
        if not np.isfinite(values).all():
            return result
        mean = float(values.mean())
        low, high = -math.inf if self.low is None else self.low, math.inf if self.high is None else self.high
        result.update(mean=mean, passed=bool(low - ROUNDING <= mean <= high + ROUNDING))
        return result
