"""The brake study (issue 50): is ERPO's held-out gain in the overfitting regime more than a brake?

The overfitting study (studies/overfit) found erpo ending 6.4 points above grpo held-out at T = 1.0, but erpo also
trailed grpo's training reward early, its pre-clip gradient norm was 5× grpo's (so clipping shrank its early
updates), and it ended with half of grpo's Policy-KL. This study runs the same regime with controls for each of
those explanations, trajectories (a sweep every 10 steps) and a direct memorisation measure (correct answers reached
through wrong steps, studies/engine/worked_steps.py); its plan, with every rule, is studies/brake/brake_plan.md.

    python -m studies.brake.pilot                    # the pilot: fixes the matched controls (brake_plan.md, "Pilot")
    python -m studies.brake --arms <CORE_ARMS>       # the core arms, seeds 300-315 (brake_plan.md, "Plan")
    python -m studies.brake --arms <MAY_WAIT_ARMS> --seeds 300 ... 307
    python -m studies.brake --report-only            # the report from every finished run
    python -m studies.brake --quick                  # smoke test: every arm, 1 seed, 4 steps, the pilot's stand-ins

The matched controls' settings (MATCHED) come from the pilot and are written here, with the plan's "Pilot result",
before any main run; until then only `--quick` runs, on stand-in values (PLACEHOLDER).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from studies.engine.claims import BASE_ARM, Claim, Gate, LearningGuard
from studies.engine.definition import ALL_QUERIES, StudySettings
from studies.engine.paired import MeanCheck, PairedInterval
from studies.engine.runs import run_slug
from studies.overfit.study import TRAIN_FILE

BASE_CONFIG = "configs/quickstart.yaml"
TRAIN_QUERIES = 32  # the overfitting study's regime, q32_lr0.0003_s150
LEARNING_RATE = 3e-4
STEPS = 150
SWEEP_EVERY = 10
EARLY_WINDOW = (10, 49)  # steps whose mean training reward shows erpo's early lag (issue 50)
EARLY_REWARD = "reward 10-49"  # its quantity in the per-seed table
LEVEL = 0.70  # the fixed training-reward level (10-step running mean) of the "at equal progress" comparison
ROLLING = 10


@dataclass(frozen=True)
class Matched:
    """The matched controls' settings, fixed by the pilot (studies/brake/pilot.py, brake_plan.md "Pilot"):
    `low_lr`, grpo's lower learning rate; `kl_beta`, grpo_kl's Policy-KL coefficient; `stop_step`, the step at
    which the early-stopped grpo is read off grpo's trajectory."""

    low_lr: float
    kl_beta: float
    stop_step: int


MATCHED: Matched | None = Matched(low_lr=7e-5, kl_beta=0.03, stop_step=140)  # pilot_runs/pilot.json (pilot at 00cf7d3)
PLACEHOLDER = Matched(low_lr=1.5e-4, kl_beta=0.01, stop_step=140)  # --quick only: stand-ins, never a main run's
SETTINGS = MATCHED or PLACEHOLDER


def regime_flags() -> tuple[str, ...]:
    """`erpo fit` flags of the regime every run shares but its learning rate (an arm's own flag: the engine puts the
    study's flags after the arm's, so a learning rate there would override the lower-lr arm's)."""
    train = [{"path": TRAIN_FILE, "label": "toy_train", "limit": TRAIN_QUERIES}]
    return ("--data.train", json.dumps(train), "--data.cache_dir", f".cache/brake/q{TRAIN_QUERIES}/reference",
            "--model.monitor_policy_kl", "true")  # fmt: skip


def arm(algorithm: str, *flags: str, learning_rate: float = LEARNING_RATE) -> list[str]:
    """An arm's `erpo fit` flags: its preset, its learning rate, then its own overrides."""
    return ["--model.algorithm", algorithm, "--model.learning_rate", f"{learning_rate:g}", *flags]


# DAPO's rollout side (configs/paper/dapo.yaml), its overlong zone scaled to the toy's 48-token cap as the paper's 512
# of 2,048. Its loss side alone (clip_high 0.28) cannot act here: every step is one on-policy update, so the
# importance ratio is 1 and no token is clipped (the overfitting study's clip fractions are 0 in every step).
DAPO_ROLLOUT = ("--rollout.dynamic_sampling", "true", "--rollout.max_refill_rounds", "3", "--rollout.overlong_buffer",
                "12", "--rollout.overlong_penalty_factor", "1.0")  # fmt: skip
LOWER_LR, KL_MATCHED, STOPPED, PEAK = "grpo (lower lr)", "grpo_kl (matched)", "grpo (stopped)", "grpo (peak)"
NO_CLIP, NO_WQ, ALPHA_LOW, ALPHA_HIGH = "erpo (no clip)", "erpo (no w(q))", "erpo (alpha 0.003)", "erpo (alpha 0.03)"
ARMS: dict[str, list[str]] = {
    "grpo": arm("grpo"),
    "erpo": arm("erpo"),
    LOWER_LR: arm("grpo", learning_rate=SETTINGS.low_lr),  # the brake as a smaller step
    KL_MATCHED: arm("grpo_kl", "--model.policy_kl_coef", f"{SETTINGS.kl_beta:g}"),  # erpo's final Policy-KL
    NO_CLIP: arm("erpo", "--model.gradient_clip_norm", "null"),  # the norm is measured, never clipped
    NO_WQ: arm("erpo", "--model.use_query_weights", "false"),  # Query-KL alone
    ALPHA_LOW: arm("erpo", "--model.query_kl_coef", "0.003"),
    ALPHA_HIGH: arm("erpo", "--model.query_kl_coef", "0.03"),
    "dapo": arm("dapo", *DAPO_ROLLOUT),
    "dapo_erpo": arm("dapo_erpo", *DAPO_ROLLOUT),
    "rloo": arm("rloo"),
    "rloo_erpo": arm("rloo_erpo"),
}
CORE_ARMS = ("grpo", "erpo", LOWER_LR, KL_MATCHED)  # the brake and Policy-KL controls with their references
MAY_WAIT_ARMS = tuple(label for label in ARMS if label not in CORE_ARMS)
DERIVED_ARMS = (STOPPED, PEAK)  # read off grpo's trajectory (studies/brake/report.py), never trained
CORE_SEEDS = tuple(range(300, 316))
MAY_WAIT_SEEDS = tuple(range(300, 308))

FULL = StudySettings(steps=STEPS, seeds=CORE_SEEDS, temperatures=(1.0, 1.5), eval_problems=200, eval_k=4,
                     train_sample_size=ALL_QUERIES, sweep_every=SWEEP_EVERY, save_completions=True)  # fmt: skip
QUICK = StudySettings(steps=4, seeds=(300,), temperatures=(1.0, 1.5), eval_problems=16, eval_k=2,
                      train_sample_size=ALL_QUERIES, sweep_every=2, save_completions=True)  # fmt: skip

# Decision rule (brake_plan.md, "Decision rules"): the 95% t interval of the mean paired margin must clear a 2-point
# minimum effect on all seeds and with any one seed left out.
BEATS = PairedInterval(effect=2.0)
VALIDITY = Gate("valid.grpo_overfits", "grpo's held-out Avg@4 at T = 1.0 ends below the base model's", "grpo", "T=1",
                high=0.0, fails_as="invalid", minus_arm=BASE_ARM)  # fmt: skip
LEARNS = LearningGuard("guard.learns", "the method's mean gain on the training queries at T = 1.0 over the base "
                       "model is at least half of grpo's", "grpo")  # fmt: skip
POLICY_KL_MATCH = MeanCheck("matched.policy_kl", f"{KL_MATCHED}'s final Policy-KL is within a factor of 1.5 of "
                            "erpo's (mean log ratio over seeds)", "log Policy-KL", arm=KL_MATCHED, minus_arm="erpo",
                            low=-math.log(1.5), high=math.log(1.5), fails_as="untestable")  # fmt: skip
MEMORISES = MeanCheck("testable.grpo_memorises", "grpo's share of correct training answers reached through wrong "
                      "steps (T = 1.0) ends at least 5 points above the base model's (mean over seeds)",
                      "wrong steps train T=1", arm="grpo", minus_arm=BASE_ARM, low=5.0,
                      fails_as="untestable")  # fmt: skip


def early_guard(baseline: str) -> MeanCheck:
    """The learning guard on the curve: the method's mean training reward over EARLY_WINDOW is at most 2 points below
    `baseline`'s (mean over seeds); else its win may be a brake: `confounded`."""
    low, high = EARLY_WINDOW
    text = f"the method's mean training reward over steps {low}–{high} is at most 2 points below {baseline}'s"
    return MeanCheck(f"guard.early_lag_vs_{run_slug(baseline)}", text, EARLY_REWARD, minus_arm=baseline, low=-2.0)


def end_guard(baseline: str) -> MeanCheck:
    """The method's training-query accuracy at T = 1.0 at its end is at most 2 points below `baseline`'s at its own
    (the early-stopped grpo's: at its stop step); else it learned less than the control: `confounded`."""
    text = f"the method's training-query Avg@4 at T = 1.0 ends at most 2 points below {baseline}'s"
    return MeanCheck(f"guard.learned_as_much_as_{run_slug(baseline)}", text, "train T=1", minus_arm=baseline, low=-2.0)


def guards(baseline: str) -> tuple:
    """The gates of an accuracy claim against `baseline`, in order (brake_plan.md, "Gates"): validity, the
    baseline's own testability (the Policy-KL match; dapo and rloo overfitting), the learning guard, then the curve
    guard (against the early-stopped grpo: the end guard, since a stopped run lags nothing early)."""
    testable: tuple = ()
    if baseline == KL_MATCHED:
        testable = (POLICY_KL_MATCH,)
    elif baseline in ("dapo", "rloo"):
        testable = (MeanCheck(f"testable.{baseline}_overfits", f"{baseline}'s held-out Avg@4 at T = 1.0 ends below "
                              "the base model's (mean over seeds)", "T=1", arm=baseline, minus_arm=BASE_ARM, high=0.0,
                              fails_as="untestable"),)  # fmt: skip
    curve = end_guard(STOPPED) if baseline == STOPPED else early_guard(baseline)
    return (VALIDITY, *testable, LEARNS, curve)


def accuracy_claim(key: str, method: str, baseline: str, quantity: str = "T=1") -> Claim:
    """`method` ends more accurate held-out than `baseline` (Avg@4 at the quantity's temperature), by 2 points."""
    where = "at T = 1.5" if quantity == "T=1.5" else "at T = 1.0"
    text = f"{method}'s held-out Avg@4 {where} ends above {baseline}'s"
    return Claim(key, text, quantity, method, baseline, "difference", "above", 0.0, BEATS, guards(baseline))


def memorisation_claim(key: str, method: str, baseline: str, held_out: bool = False) -> Claim:
    """A smaller share of `method`'s correct answers (T = 1.0, final sweep) comes through wrong steps than
    `baseline`'s, by 2 points; testable where grpo's share rises 5 points above the base model's."""
    where = "held-out" if held_out else "training"
    text = f"fewer of {method}'s correct {where} answers (T = 1.0) come through wrong steps than {baseline}'s"
    quantity = "wrong steps T=1" if held_out else "wrong steps train T=1"
    gates = (VALIDITY, MEMORISES, LEARNS) + ((end_guard(STOPPED),) if baseline == STOPPED else ())
    return Claim(key, text, quantity, method, baseline, "difference", "below", 0.0, BEATS, gates)


CLAIMS: tuple[Claim, ...] = (
    # central: erpo beats each brake and the Policy-KL control held-out (T = 1.0, then T = 1.5)
    accuracy_claim("accuracy.erpo_vs_lower_lr", "erpo", LOWER_LR),
    accuracy_claim("accuracy.erpo_vs_stopped", "erpo", STOPPED),
    accuracy_claim("accuracy.erpo_vs_grpo_kl_matched", "erpo", KL_MATCHED),
    Claim("accuracy.erpo_vs_grpo_at_level", f"at equal training progress (the first sweep after its {ROLLING}-step "
          f"training reward reaches {LEVEL:g}) erpo's held-out Avg@4 at T = 1.0 is above grpo's", "T=1 at level",
          "erpo", "grpo", "difference", "above", 0.0, BEATS, (VALIDITY, LEARNS)),
    accuracy_claim("high_t.erpo_vs_lower_lr", "erpo", LOWER_LR, "T=1.5"),
    accuracy_claim("high_t.erpo_vs_stopped", "erpo", STOPPED, "T=1.5"),
    accuracy_claim("high_t.erpo_vs_grpo_kl_matched", "erpo", KL_MATCHED, "T=1.5"),
    # the references: the overfitting study's claim under this rule, and grpo at its best step (an oracle stop)
    accuracy_claim("accuracy.erpo_vs_grpo", "erpo", "grpo"),
    Claim("accuracy.erpo_vs_grpo_peak", "erpo's final held-out Avg@4 at T = 1.0 is above grpo's best over its steps "
          "(the highest mean of three consecutive sweeps: early stopping on the held-out problems themselves)", "T=1",
          "erpo", PEAK, "difference", "above", 0.0, BEATS, (VALIDITY, LEARNS)),
    # mechanism: clipping, w(q), the dose α
    accuracy_claim("accuracy.no_clip_vs_grpo", NO_CLIP, "grpo"),
    accuracy_claim("accuracy.erpo_vs_no_clip", "erpo", NO_CLIP),
    accuracy_claim("accuracy.query_kl_alone_vs_grpo", NO_WQ, "grpo"),
    accuracy_claim("accuracy.erpo_vs_query_kl_alone", "erpo", NO_WQ),
    accuracy_claim("accuracy.alpha_low_vs_grpo", ALPHA_LOW, "grpo"),
    accuracy_claim("accuracy.alpha_high_vs_grpo", ALPHA_HIGH, "grpo"),
    accuracy_claim("accuracy.alpha_high_vs_erpo", ALPHA_HIGH, "erpo"),
    # portability: the ERPO terms on DAPO and RLOO
    accuracy_claim("accuracy.dapo_erpo_vs_dapo", "dapo_erpo", "dapo"),
    accuracy_claim("high_t.dapo_erpo_vs_dapo", "dapo_erpo", "dapo", "T=1.5"),
    accuracy_claim("accuracy.rloo_erpo_vs_rloo", "rloo_erpo", "rloo"),
    accuracy_claim("high_t.rloo_erpo_vs_rloo", "rloo_erpo", "rloo", "T=1.5"),
    # the direct memorisation measure
    memorisation_claim("memorisation.erpo_vs_grpo", "erpo", "grpo"),
    memorisation_claim("memorisation.erpo_vs_lower_lr", "erpo", LOWER_LR),
    memorisation_claim("memorisation.erpo_vs_stopped", "erpo", STOPPED),
    memorisation_claim("memorisation.erpo_vs_grpo_kl_matched", "erpo", KL_MATCHED),
    memorisation_claim("memorisation_held_out.erpo_vs_grpo", "erpo", "grpo", held_out=True),
)  # fmt: skip
CENTRAL = ("accuracy.erpo_vs_lower_lr", "accuracy.erpo_vs_stopped", "accuracy.erpo_vs_grpo_kl_matched",
           "accuracy.erpo_vs_grpo_at_level")  # fmt: skip
