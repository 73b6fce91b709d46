"""The research home: studies of what ERPO does, run on the erpo_lightning package but not part of it (not shipped
in the wheel).

- `studies.engine`: the study engine (runs, claims, report pieces, figures) shared by every study;
- `studies.toy`: the toy study (`python -m studies.toy`), its report, claims and figures;
- `studies.real_model`: the real-model study on SmolLM2-135M-Instruct (`python -m studies.real_model`), its plan,
  pilot, report, claims, figures and committed runs;
- `studies.overfit`: the overfitting-regime study (32 training queries), its plan, pilot, report and committed runs;
- `studies.brake`: is ERPO more than a brake? grpo controls at a lower learning rate and stopped early, dapo/rloo
  portability, held-out sweeps during training (`brake_plan.md`, pilot first);
- `studies.long_horizon`: the 1,000-step degradation claim, gated on a grpo pilot (`long_horizon_plan.md`);
- `studies.tasks`: the seeded arithmetic tasks the real-model study trains on (`studies/tasks/shipped`);
- `studies.graded_pairs`: a reward that logs every graded pair, for comparing grader presets on a real run.

Run every study from the repository root (`python -m studies.<name>`), which puts `studies` on the import path.
"""
