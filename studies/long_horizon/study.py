"""The long-horizon study (issue 51, item 1): over 1,000 steps, does GRPO's held-out accuracy fall from its best
while it goes on learning, and does ERPO fall less?

The paper's stability claim is about time (GRPO degrades at high temperature after about 400 steps, ERPO less); no
run of this project went past 400 steps. A GRPO-only pilot (studies/long_horizon/pilot.py) tries the regimes of
PILOT_REGIMES in order under a gate committed before it runs; the first that passes in both pilot seeds is the
study's regime. If none passes, the study's result is that the claim is untestable here, and no ERPO arm runs. The
plan, with every rule: studies/long_horizon/long_horizon_plan.md.

    python -m studies.long_horizon.pilot          # the pilot and its gate (long_horizon_plan.md, "Pilot")
    python -m studies.long_horizon                # the main runs, only after the pilot passed (REGIME set)
    python -m studies.long_horizon --report-only  # the report from the finished runs
    python -m studies.long_horizon --quick        # smoke test: every arm, 1 seed, 4 steps, the first regime
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from studies.engine.claims import BASE_ARM, Claim
from studies.engine.definition import StudySettings
from studies.engine.paired import MeanCheck, PairedInterval

BASE_CONFIG = "configs/quickstart.yaml"
TRAIN_FILE = "erpo_lightning/toy/shipped/train.jsonl"
STEPS = 1000
SWEEP_EVERY = 50
GUARD_STEP = 400  # the learning guard's step, and where the area under the held-out curve starts
WINDOW = 3  # sweeps averaged: one sweep of 200 problems moves by a few points on its own
PEAK_RANGE = (50, 850)  # the sweeps the best window may use; the last three (900-1000) are the end


@dataclass(frozen=True)
class Regime:
    """A long-horizon setting: the quickstart's toy model and batches (16 queries × 8 rollouts), `learning_rate`,
    on the first `train_queries` rows of the toy training file (None: all of them, the quickstart's)."""

    learning_rate: float
    train_queries: int | None = None

    @property
    def name(self) -> str:
        data = "full" if self.train_queries is None else f"q{self.train_queries}"
        return f"{data}_lr{self.learning_rate:g}_s{STEPS}"

    def describe(self) -> str:
        """The regime in words, as the report states it."""
        data = "every row" if self.train_queries is None else f"the first {self.train_queries} rows"
        return f"{data} of `{TRAIN_FILE}` as the training set, learning rate {self.learning_rate:g}"

    def flags(self) -> tuple[str, ...]:
        """`erpo fit` flags of the regime but its learning rate (an arm's: the lower-lr arm sets its own), with its
        own reference cache."""
        train = {"path": TRAIN_FILE, "label": "toy_train"}
        if self.train_queries is not None:
            train["limit"] = self.train_queries
        data = "full" if self.train_queries is None else f"q{self.train_queries}"
        return ("--data.train", json.dumps([train]), "--data.cache_dir", f".cache/long_horizon/{data}/reference",
                "--model.monitor_policy_kl", "true")  # fmt: skip


# The pilot's regimes, in the order it tries them (long_horizon_plan.md, "Pilot"), fixed before it runs.
PILOT_REGIMES = (Regime(1e-4), Regime(2e-4), Regime(3e-4), Regime(1e-4, train_queries=32))
REGIME: Regime | None = Regime(1e-4, train_queries=32)  # the pilot's choice (the plan's "Pilot result")
LOWER_LR_FACTOR = 0.5  # the brake control's learning rate, as a share of the regime's (fixed in advance)
MAIN_SEEDS = tuple(range(500, 508))


def arms(regime: Regime) -> dict[str, list[str]]:
    """The main arms in `regime`: grpo, erpo, erpo_released and grpo at LOWER_LR_FACTOR of the learning rate."""
    lr, low = f"{regime.learning_rate:g}", f"{LOWER_LR_FACTOR * regime.learning_rate:g}"
    return {
        "grpo": ["--model.algorithm", "grpo", "--model.learning_rate", lr],
        "erpo": ["--model.algorithm", "erpo", "--model.learning_rate", lr],
        "erpo_released": ["--model.algorithm", "erpo_released", "--model.learning_rate", lr],
        "grpo (lower lr)": ["--model.algorithm", "grpo", "--model.learning_rate", low],
    }


FULL = StudySettings(steps=STEPS, seeds=MAIN_SEEDS, temperatures=(1.0, 1.5), eval_problems=200, eval_k=4,
                     train_sample_size=200, sweep_every=SWEEP_EVERY)  # fmt: skip
QUICK = StudySettings(steps=4, seeds=(500,), temperatures=(1.0, 1.5), eval_problems=16, eval_k=2,
                      train_sample_size=16, sweep_every=2)  # fmt: skip

# Decision rule (long_horizon_plan.md, "Decision rules"): the brake study's, a 95% t interval of the mean paired
# margin clearing a 2-point minimum effect on all seeds and with any one seed left out.
BEATS = PairedInterval(effect=2.0)
LEARNS = MeanCheck("valid.grpo_learns", "grpo's training-query Avg@4 at T = 1.0 ends at least 10 points above the "
                   "base model's (mean over seeds)", "train T=1", arm="grpo", minus_arm=BASE_ARM, low=10.0,
                   fails_as="invalid")  # fmt: skip


def slug(temperature: str) -> str:
    """A temperature column as a claim key's part: `T=1.5` -> `t1.5`."""
    return temperature.replace("T=", "t")


def degrades(temperature: str) -> MeanCheck:
    """Testability of a degradation claim: grpo's drop from its best window at `temperature` is at least 3 points
    (mean over seeds)."""
    return MeanCheck(f"testable.grpo_degrades_{slug(temperature)}", f"grpo's held-out Avg@4 at {temperature} falls "
                     "at least 3 points from its best three-sweep mean (mean over seeds)", f"{temperature} drop",
                     arm="grpo", low=3.0, fails_as="untestable")  # fmt: skip


def guard(baseline: str) -> MeanCheck:
    """The learning guard at GUARD_STEP: the method's training-query Avg@4 at T = 1.0 there is at most 3 points below
    `baseline`'s (mean over seeds); else `confounded`."""
    return MeanCheck(f"guard.learns_by_{GUARD_STEP}", f"the method's training-query Avg@4 at T = 1.0 at step "
                     f"{GUARD_STEP} is at most 3 points below {baseline}'s", f"train T=1 at {GUARD_STEP}",
                     minus_arm=baseline, low=-3.0)  # fmt: skip


def claims_for(method: str, baseline: str, key: str) -> tuple[Claim, ...]:
    """The five claims of one pair: smaller degradation at T = 1.5 and 1.0, higher final T = 1.5 accuracy, larger
    area under the held-out curve after GUARD_STEP at T = 1.0 and 1.5."""
    low, high = PEAK_RANGE

    def claim(name: str, text: str, quantity: str, side: str, gates: tuple) -> Claim:
        return Claim(f"{name}.{key}", text, quantity, method, baseline, "difference", side, 0.0, BEATS, gates)

    claims = [
        claim(
            f"degradation_{slug(t)}",
            f"{method}'s held-out Avg@4 at {t} falls less from its best three-sweep mean "
            f"(over steps {low}–{high}) to its last three sweeps than {baseline}'s",
            f"{t} drop",
            "below",
            (LEARNS, degrades(t), guard(baseline)),
        )
        for t in ("T=1.5", "T=1")
    ]
    claims.append(
        claim(
            "final_high_t",
            f"{method}'s held-out Avg@4 at T = 1.5 over the last three sweeps is above {baseline}'s",
            "T=1.5 end",
            "above",
            (LEARNS, guard(baseline)),
        )
    )
    claims += [
        claim(
            f"area_{slug(t)}",
            f"{method}'s held-out Avg@4 at {t}, averaged over steps {GUARD_STEP}–{STEPS}, is above {baseline}'s",
            f"{t} area",
            "above",
            (LEARNS, guard(baseline)),
        )
        for t in ("T=1", "T=1.5")
    ]
    return tuple(claims)


CLAIMS: tuple[Claim, ...] = (
    *claims_for("erpo", "grpo", "erpo_vs_grpo"),
    *claims_for("erpo_released", "grpo", "erpo_released_vs_grpo"),
    *claims_for("erpo", "grpo (lower lr)", "erpo_vs_lower_lr"),
)
