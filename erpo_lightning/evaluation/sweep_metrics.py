"""Sweep metrics: Avg@k, Pass@1 and unbiased Pass@k per (benchmark, temperature), as one torchmetrics Metric.

Every state is a [B, T] sum (B benchmarks, T temperatures) reduced with `sum` across ranks, so ranks may evaluate
disjoint shards of the problems and `compute()` still returns the global numbers. `compute()` returns a flat dict
of scalars named `<prefix>/<stat>/<benchmark>[/<temperatures>]` (see `metric_name`), ready for `log_dict`.
"""

from __future__ import annotations

from math import comb, nan

import torch
from torchmetrics import Metric

STATS = ("avg@k", "pass@1", "pass@k", "length", "truncated")
MEAN = "mean"  # pseudo-benchmark: the unweighted mean over benchmarks (the paper's "Avg." column)
ALL = "all"
LOW, HIGH = "T<=1.0", "T>1.0"  # the paper's split of the sweep


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (requires k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def temperature_label(temperature: float) -> str:
    """`T=0.6`: how one temperature appears in metric names and tables."""
    return f"T={temperature:g}"


def temperature_groups(temperatures: list[float]) -> dict[str, list[int]]:
    """Indices of the temperatures in each aggregate: `all`, and `T<=1.0` / `T>1.0` when the group is non-empty."""
    groups = {ALL: list(range(len(temperatures)))}
    low = [i for i, t in enumerate(temperatures) if t <= 1.0]
    high = [i for i, t in enumerate(temperatures) if t > 1.0]
    groups.update({name: ids for name, ids in ((LOW, low), (HIGH, high)) if ids})
    return groups


def metric_name(prefix: str, stat: str, benchmark: str, temperatures: str = ALL) -> str:
    """`val/avg@k/math500/T=0.6`; the aggregate over all temperatures drops the suffix: `val/avg@k/math500`."""
    name = f"{prefix}/{stat}/{benchmark}"
    return name if temperatures == ALL else f"{name}/{temperatures}"


class SweepMetric(Metric):
    """Accumulates graded samples of a temperature sweep; `update` once per (benchmark, temperature, batch).

    Args:
        benchmarks: benchmark labels, in the order of the `benchmark` index of `update`.
        temperatures: the sweep's temperatures, in the order of the `temperature` index of `update`.
        pass_ks: the k of Pass@k for each benchmark (at most its number of samples per problem).
        mean_over: labels averaged into the `mean` pseudo-benchmark (default: all), e.g. eval sets but not a
            sample of training queries.
        prefix: first part of every name in `compute()`.

    Stats (per benchmark and temperature; aggregates are unweighted means over temperatures, then benchmarks):
        avg@k: correct samples / samples (the accuracy of one sample, averaged over the k samples of each problem).
        pass@1: mean over problems of c/n (the unbiased Pass@1; equals avg@k when every problem has k samples).
        pass@k: mean over problems of `pass_at_k(n, c, k)`.
        length: mean response length in tokens; truncated: share of responses that hit max_new_tokens.
    A cell without any problem is NaN.
    """

    full_state_update = False

    def __init__(
        self,
        benchmarks: list[str],
        temperatures: list[float],
        pass_ks: list[int],
        mean_over: list[str] | None = None,
        prefix: str = "val",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if len(pass_ks) != len(benchmarks) or len(set(benchmarks)) != len(benchmarks) or MEAN in benchmarks:
            raise ValueError(f"benchmarks must be distinct, not {MEAN!r}, one pass_k each: {benchmarks}, {pass_ks}")
        self.benchmarks = list(benchmarks)
        self.temperatures = list(temperatures)
        self.pass_ks = list(pass_ks)
        self.mean_over = [self.benchmarks.index(label) for label in (mean_over or benchmarks)]
        self.prefix = prefix
        shape = (len(benchmarks), len(temperatures))
        for state in ("problems", "samples", "correct", "pass1", "passk", "tokens", "truncated"):
            self.add_state(state, default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def update(
        self, benchmark: int, temperature: int, correct: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor
    ) -> None:
        """Add P problems of one cell: `correct` [P, n] bool, `lengths` [P, n] tokens, `truncated` [P, n] bool."""
        n = correct.shape[1]
        k = self.pass_ks[benchmark]
        if k > n:
            raise ValueError(f"pass@{k} of {self.benchmarks[benchmark]!r} needs at least {k} samples, got {n}")
        hits = correct.sum(dim=1).tolist()
        cell = (benchmark, temperature)
        self.problems[cell] += correct.shape[0]
        self.samples[cell] += correct.numel()
        self.correct[cell] += sum(hits)
        self.pass1[cell] += sum(c / n for c in hits)
        self.passk[cell] += sum(pass_at_k(n, c, k) for c in hits)
        self.tokens[cell] += lengths.sum().item()
        self.truncated[cell] += truncated.sum().item()

    def compute(self) -> dict[str, torch.Tensor]:
        """Every stat per benchmark (and `mean`) × temperature (and `all`, `T<=1.0`, `T>1.0`), as flat names."""
        problems = self.problems.where(self.problems > 0, nan)
        samples = self.samples.where(self.samples > 0, nan)
        cells = {
            "avg@k": self.correct / samples,
            "pass@1": self.pass1 / problems,
            "pass@k": self.passk / problems,
            "length": self.tokens / samples,
            "truncated": self.truncated / samples,
        }
        groups = {temperature_label(t): [i] for i, t in enumerate(self.temperatures)}
        groups.update(temperature_groups(self.temperatures))
        values: dict[str, torch.Tensor] = {}
        for stat, table in cells.items():
            for group, columns in groups.items():
                per_benchmark = table[:, columns].mean(dim=1)  # [B]
                for label, value in zip(self.benchmarks, per_benchmark, strict=True):
                    values[metric_name(self.prefix, stat, label, group)] = value.float()
                values[metric_name(self.prefix, stat, MEAN, group)] = per_benchmark[self.mean_over].mean().float()
        return values
