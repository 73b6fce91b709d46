"""Rollout engines (vLLM in-process, Hugging Face generate) behind one protocol, the sampler that generates and grades
through them (training and evaluation alike), and batch assembly."""

from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch, assemble_batch, informative_groups, overlong_penalty
from erpo_lightning.rollout.engine import RolloutEngine, Sample, SamplingSettings
from erpo_lightning.rollout.hf_engine import HFEngine
from erpo_lightning.rollout.sampler import GradedGroups, RolloutSampler
from erpo_lightning.rollout.vllm_engine import VLLMEngine

__all__ = [
    "GradedGroups",
    "QueryBatch",
    "HFEngine",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutSampler",
    "Sample",
    "SamplingSettings",
    "VLLMEngine",
    "assemble_batch",
    "informative_groups",
    "overlong_penalty",
]
