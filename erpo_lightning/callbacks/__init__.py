"""Lightning callbacks."""

from erpo_lightning.callbacks.rollout import RolloutCallback

__all__ = ["RolloutCallback"]
