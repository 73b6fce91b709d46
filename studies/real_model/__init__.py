"""The real-model study (`study`) on SmolLM2-135M-Instruct: its pre-registered plan (plan.md), task pilot (`pilot`,
real_model_pilot.json), report writer (`report`), its committed runs (runs/), report, claims and figures; `table`
prints the real-model example's table (docs/real_model.md) from a run's logs."""
