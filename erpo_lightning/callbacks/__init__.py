"""Lightning callbacks: rollouts every step, temperature sweeps during fit, Hugging Face export, preemption, the
final step's checkpoint, progress lines, sampled completions and where each step's time goes."""

from erpo_lightning.callbacks.completions import SampledCompletions
from erpo_lightning.callbacks.export import HFExportCallback
from erpo_lightning.callbacks.final_checkpoint import FinalStepCheckpoint
from erpo_lightning.callbacks.phase_times import PhaseTimes
from erpo_lightning.callbacks.preemption import PreemptionCheckpoint
from erpo_lightning.callbacks.progress import ProgressLines
from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.callbacks.temperature_sweep import TemperatureSweepCallback

__all__ = [
    "FinalStepCheckpoint",
    "HFExportCallback",
    "PhaseTimes",
    "PreemptionCheckpoint",
    "ProgressLines",
    "RolloutCallback",
    "SampledCompletions",
    "TemperatureSweepCallback",
]
