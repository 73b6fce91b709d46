"""The toy study (`study`): GRPO, ERPO and GRPO + Policy-KL on the quickstart's shipped toy model and task; its report
writer (`report`), rerun check (`compare`) and its last report, claims and figures (toy_study.md and beside it)."""
