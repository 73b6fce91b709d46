"""Verifiable rewards for RL post-training: the reward protocol and the default math reward."""

from erpo_lightning.rewards.extraction import extract_answer
from erpo_lightning.rewards.math_reward import MathReward, verify_answer
from erpo_lightning.rewards.protocol import RewardFn

__all__ = ["MathReward", "RewardFn", "extract_answer", "verify_answer"]
