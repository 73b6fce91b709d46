"""The good-lr study's portability part (studies/good_lr/portability.py): the plan's arms, seeds and sweeps; its gates
and claims on hand-made per-seed tables; no full run before every core run has finished."""

import pytest

from studies.brake.study import DAPO_ROLLOUT
from studies.engine.claims import BASE_ARM, evaluate_all
from studies.good_lr import portability, study


def test_the_definition_is_the_plans():
    definition = portability.portability_study()
    definition.check()  # every arm is a preset `erpo fit` accepts
    assert set(definition.arms) == {"dapo", "dapo_erpo", "rloo", "rloo_erpo"}
    for label, flags in definition.arms.items():
        assert flags[flags.index("--model.algorithm") + 1] == label
        assert flags[flags.index("--model.learning_rate") + 1] == "0.0003"
        assert (" ".join(DAPO_ROLLOUT) in " ".join(flags)) == label.startswith("dapo")
    full = definition.full
    assert (full.steps, full.sweep_every, full.temperatures, full.eval_k) == (150, 10, (0.6, 1.0, 1.5), 4)
    assert full.seeds == tuple(range(810, 818)) == study.PORTABILITY_SEEDS
    assert definition.fit_flags == study.regime_flags()  # the first 32 training queries, Policy-KL monitored
    keys = [claim.key for claim in definition.claims]
    assert keys == [f"{key}.{b}_erpo_vs_{b}" for b in ("dapo", "rloo") for key in ("low_t", "final", "high_t")]


def per_seed_table(baseline_end: list[float], base: float = 0.50, erpo_gain: float = 0.05, train_gap: float = 0.0):
    """A per-seed table for the dapo pair: dapo's `T=... end` values per seed, dapo_erpo `erpo_gain` above them, the
    base model at `base`; training accuracy 0.9 for dapo and 0.9 - `train_gap` for dapo_erpo."""
    seeds = list(range(810, 810 + len(baseline_end)))

    def row(values: list[float], train: float) -> dict:
        ends = {portability.end(t): list(values) for t in portability.TEMPERATURES}
        return {"seed": seeds, **ends, "train T=1 end": [train] * len(seeds)}

    return {
        BASE_ARM: row([base] * len(seeds), 0.2),
        "dapo": row(baseline_end, 0.9),
        "dapo_erpo": row([v + erpo_gain for v in baseline_end], 0.9 - train_gap),
    }


def verdicts(table: dict) -> dict[str, str]:
    claims = tuple(claim for claim in portability.CLAIMS if claim.baseline == "dapo")
    results = evaluate_all(table, {"dapo": "k3", "dapo_erpo": "k3"}, claims)
    return {result["key"].split(".")[0]: result["verdict"] for result in results}


def test_a_baseline_that_memorises_in_every_seed_makes_the_claims_testable():
    ends = [0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.46, 0.47]  # all below the base model's 0.50; erpo +5 points each
    assert verdicts(per_seed_table(ends)) == {"low_t": "confirmed", "final": "confirmed", "high_t": "confirmed"}
    assert verdicts(per_seed_table(ends, erpo_gain=0.0)) == dict.fromkeys(("low_t", "final", "high_t"), "refuted")


def test_a_baseline_that_ties_or_beats_the_base_model_in_one_seed_is_untestable():
    tied = [0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.46, 0.50]  # one seed ends exactly at the base model's accuracy
    assert set(verdicts(per_seed_table(tied)).values()) == {"untestable"}
    above = [0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.46, 0.51]
    assert set(verdicts(per_seed_table(above)).values()) == {"untestable"}


def test_the_learning_guard_discounts_a_win_only():
    ends = [0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.46, 0.47]
    assert set(verdicts(per_seed_table(ends, train_gap=0.04)).values()) == {"confounded"}  # won, learned 4 less
    assert set(verdicts(per_seed_table(ends, train_gap=0.02)).values()) == {"confirmed"}  # 2 less: within 3
    lost = per_seed_table(ends, erpo_gain=-0.05, train_gap=0.04)
    assert set(verdicts(lost).values()) == {"refuted"}  # a refutation stands beside a failed guard


def test_no_portability_run_before_every_core_run_has_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(portability, "REPO", tmp_path)
    with pytest.raises(SystemExit, match=r"32 core runs not finished, first grpo seed 810"):
        portability.main([])
    assert len(portability.unfinished_core_runs(tmp_path)) == 32
