"""What several test files share, imported as `helpers.<module>` (pytest puts tests/ on the import path through
tests/conftest.py; tests/scaleout_run.py, run as a script, finds it beside itself). Test files import from here,
never from each other.

- `batches`: rollout batches built through the package's own constructor;
- `fit_configs`: `erpo fit` configs written to files, and the `erpo` command run in a subprocess;
- `grading`: grading one response at a time, as a reference for the batched grader;
- `module_steps`: ERPOModule on a hand-built batch (prompts, responses, rewards, reference scores, one fit);
- `policies`: a policy LightningModule, a parity reward, a query loader and a short fit for callback tests;
- `docs`: the code examples of docs/ pages, by the name of their `<!-- example: NAME -->` comment;
- `cli_runs`: `erpo` in this process on a tiny config, and its one-line errors;
- `resume_runs`: a resumable fit in this process, its logged metrics and weights;
- `quickstart`: the quickstart's inputs copied into a work directory;
- `recomputed`: numbers recomputed from committed files compared with them as any CPU reproduces them;
- `healthy_run`: one healthy toy run, trained once per session (the `healthy_toy_run` fixture), read by many tests;
"""
