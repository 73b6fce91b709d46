"""What `ERPOModule.train_on` checks of each rollout batch before any forward: that the batch carries what the
algorithm's loss and w(q) rule read. Each check raises ValueError naming the setting and how to fix it."""

from __future__ import annotations

from erpo_lightning.objectives.algorithms import Algorithm
from erpo_lightning.rollout.batch import RolloutBatch


def check_loss_constant(algorithm: Algorithm, preset: str, loss_constant: float | None, rollout: RolloutBatch) -> None:
    """Refuse Dr. GRPO's constant normaliser with neither `loss_constant` nor the rollout's response cap.

    Args:
        preset: the `model.algorithm` name, for the message.
    """
    if algorithm.loss_aggregation == "seq_sum_constant" and not (loss_constant or rollout.max_new_tokens):
        raise ValueError(
            f"model.algorithm {preset!r} divides each response's summed loss by a constant "
            "(loss_aggregation seq_sum_constant): set model.loss_constant > 0, or train on rollouts that carry "
            "their response cap (RolloutCallback's; assemble_batch(..., max_new_tokens=...))"
        )


def check_carried_weights(algorithm: Algorithm, rollout: RolloutBatch) -> None:
    """Refuse a rollout batch whose carried query scores do not fit the algorithm's w(q) rule: precomputed w(q)
    comes with a dataset-static rule and only with it; per-step w(q) from the reference needs each s(q)."""
    source, norm = algorithm.query_weight_source, algorithm.query_weight_norm
    static = algorithm.static_query_weights
    rule = f"model.query_weight_source {source!r} and query_weight_norm {norm!r}"
    if static and rollout.query_weights is None:
        raise ValueError(
            f"with {rule}, w(q) is a constant of each query that the query stream carries, but this RolloutBatch "
            "has none: train with QueryDataModule (which makes them at setup), or build the batch with "
            "assemble_batch(..., query_weights=module.algorithm.query_weight_table(cache.nll)[query_index])"
        )
    if not static and rollout.query_weights is not None:
        raise ValueError(
            f"this RolloutBatch carries precomputed w(q), but with {rule} w(q) is made per optimizer step: its "
            "query stream was set up for another algorithm"
        )
    if source == "reference" and not static and rollout.reference_nll is None:
        raise ValueError(
            f"with {rule}, w(q) is normalised per optimizer step from each query's reference NLL s(q), which "
            "this RolloutBatch does not carry: train with QueryDataModule, or build the batch with "
            "assemble_batch(..., reference_nll=cache.nll[query_index])"
        )
