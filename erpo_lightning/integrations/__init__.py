"""Bridges from erpo_lightning's objectives to other trainers.

    trl             `ERPOTrainer` (TRL's `GRPOTrainer` whose loss is `objectives.rl_loss`) and `QueryKLCallback`
                    (a Query-KL monitor for any `GRPOTrainer` run); needs the `trl` extra
    reference_scores  θ0 query scores for those two, with the project's cache code (no TRL import)

Nothing here is imported by `import erpo_lightning`: importing `erpo_lightning.integrations.trl` is what imports TRL.
"""
