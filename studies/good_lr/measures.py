"""The good-lr study's two measures beyond the engine's (good_lr_plan.md): the bootstrap over seeds and test problems
together, the monitor claim's leave-one-seed-out prediction of grpo's drawdown, and that drawdown at a run length (the
pilot's rule reads it too). Pure numpy and pandas on values the report reads from the runs, so that tests can check
them against hand computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from studies.engine.trajectory import last_mean, peak
from studies.good_lr.study import SWEEP_EVERY, WINDOW

RESAMPLES = 2000
LEVEL = 0.95
KL_FLOOR = 1e-6  # a KL enters the monitor's fit as log(KL + KL_FLOOR): KLs span orders of magnitude
FIRST_SWEEP = SWEEP_EVERY  # the best window starts at the first sweep after step 0
MONITOR_FIRST_STEP = 60  # the first sweep step with three trailing sweeps that exclude the base model's (20, 40, 60)


def seed_problem_interval(differences: np.ndarray, level: float = LEVEL, resamples: int = RESAMPLES) -> list[float]:
    """The percentile interval of the mean paired margin when seeds and problems are both drawn again.

    Args:
        differences: (seeds, problems): per seed, each test problem's value for the method minus the baseline's
            (points). A resample draws seeds and problems with replacement (generator seed 0); one problem draw
            applies to every seed of the resample, as one test set would.
    Returns:
        [low, high] in the margins' units.
    """
    seeds, problems = differences.shape
    generator = np.random.default_rng(0)
    seed_draws = generator.integers(0, seeds, size=(resamples, seeds))
    problem_draws = generator.integers(0, problems, size=(resamples, problems))
    seed_weights = np.zeros((resamples, seeds))
    problem_weights = np.zeros((resamples, problems))
    np.add.at(seed_weights, (np.arange(resamples)[:, None], seed_draws), 1.0 / seeds)
    np.add.at(problem_weights, (np.arange(resamples)[:, None], problem_draws), 1.0 / problems)
    means = np.einsum("rs,sp,rp->r", seed_weights, differences, problem_weights)
    tail = (1 - level) / 2
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))]


def generality(verdict: str, interval: list[float], effect: float) -> str:
    """`general` when a firm verdict's seed-and-problem interval lies on its side of `effect`, `specific to these
    problems` when it does not; `-` for any other verdict."""
    if verdict == "confirmed":
        return "general" if interval[0] > effect else "specific to these problems"
    if verdict == "refuted":
        return "general" if interval[1] < effect else "specific to these problems"
    return "-"


def trailing_mean(series: pd.Series, width: int = 3) -> pd.Series:
    """The mean of each sweep and the `width` − 1 before it (NaN until there are `width`)."""
    return series.rolling(width).mean()


def drawdown_so_far(held_out: pd.Series, first: int = MONITOR_FIRST_STEP) -> pd.Series:
    """d(s) = max over s' ≤ s of m(s') − m(s), m the trailing three-sweep mean, for sweep steps s ≥ `first`
    (held_out: Avg@4 in [0, 1] by sweep step; the result in points)."""
    smooth = trailing_mean(held_out).loc[first:]
    return 100 * (smooth.cummax() - smooth)


@dataclass(frozen=True)
class MonitorRun:
    """One grpo run's monitor pairs: at each sweep step s ≥ MONITOR_FIRST_STEP, the drawdown so far and the four
    signals (`query_kl`, `policy_kl`: log of the mean over the logged steps s − 20 … s − 1 plus KL_FLOOR;
    `train`: training-query Avg@4 at T = 1.0 at s, points; `step`: s)."""

    seed: int
    frame: pd.DataFrame  # index: sweep step; columns: drawdown and the signals


SIGNALS = ("query_kl", "policy_kl", "train", "step")
SIMPLER = ("policy_kl", "train", "step")


def monitor_run(seed: int, held_out: pd.Series, train: pd.Series, metrics: pd.DataFrame, every: int) -> MonitorRun:
    """The monitor pairs of one run.

    Args:
        held_out, train: test-set and training-query Avg@4 at T = 1.0 in [0, 1], by sweep step.
        metrics: per RL step (index), `query_kl` and `policy_kl` columns (token-k3 Query-KL and Policy-KL).
        every: steps between sweeps (the window the KLs are averaged over).
    """
    target = drawdown_so_far(held_out)
    rows = {}
    for step in target.index:
        window = metrics.loc[step - every : step - 1]
        rows[int(step)] = {
            "drawdown": float(target.loc[step]),
            "query_kl": math.log(float(window["query_kl"].mean()) + KL_FLOOR),
            "policy_kl": math.log(float(window["policy_kl"].mean()) + KL_FLOOR),
            "train": 100 * float(train.loc[step]),
            "step": float(step),
        }
    return MonitorRun(seed, pd.DataFrame.from_dict(rows, orient="index"))


def leave_one_seed_out_errors(runs: list[MonitorRun]) -> dict[str, list[float]]:
    """Per signal, per run (in `runs`' order): fit drawdown ~ a + b · signal by least squares on the other runs' pairs
    and take the mean absolute error on this run's (points)."""
    errors: dict[str, list[float]] = {signal: [] for signal in SIGNALS}
    for held in range(len(runs)):
        train = pd.concat([run.frame for i, run in enumerate(runs) if i != held])
        test = runs[held].frame
        for signal in SIGNALS:
            slope, intercept = np.polyfit(train[signal].to_numpy(), train["drawdown"].to_numpy(), 1)
            predicted = intercept + slope * test[signal].to_numpy()
            errors[signal].append(float(np.abs(predicted - test["drawdown"].to_numpy()).mean()))
    return errors


def drawdown(series: pd.Series, length: int) -> float:
    """Points between the best three-sweep mean over steps FIRST_SWEEP..length - 60 and the mean of the last three
    sweeps up to `length` (series: held-out Avg@4 in [0, 1] by sweep step); NaN when the sweeps do not reach it."""
    upto = series.loc[:length]
    if upto.index.max() < length:
        return float("nan")
    best = peak(upto, WINDOW, FIRST_SWEEP, length - WINDOW * SWEEP_EVERY)[1]
    return 100 * (best - last_mean(upto, WINDOW))
