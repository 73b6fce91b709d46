"""Lightning callbacks: rollouts every step, temperature sweeps during fit, Hugging Face export, preemption, the
final step's checkpoint, progress lines and sampled completions."""

from erpo_lightning.callbacks.completions import SampledCompletions
from erpo_lightning.callbacks.export import HFExportCallback
from erpo_lightning.callbacks.final_checkpoint import FinalStepCheckpoint
from erpo_lightning.callbacks.preemption import PreemptionCheckpoint
from erpo_lightning.callbacks.progress import ProgressLines
from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.callbacks.temperature_sweep import TemperatureSweepCallback

__all__ = [
    "FinalStepCheckpoint",
    "HFExportCallback",
    "PreemptionCheckpoint",
    "ProgressLines",
    "RolloutCallback",
    "SampledCompletions",
    "TemperatureSweepCallback",
]
