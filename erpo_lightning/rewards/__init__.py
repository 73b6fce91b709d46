"""Verifiable rewards for RL post-training: the reward protocol and the default math reward."""

from erpo_lightning.rewards.conventions import CONVENTIONS, GraderSettings
from erpo_lightning.rewards.extraction import extract_answer
from erpo_lightning.rewards.math_reward import MathReward, Verdict, verify_answer
from erpo_lightning.rewards.protocol import Reward

__all__ = ["CONVENTIONS", "GraderSettings", "MathReward", "Reward", "Verdict", "extract_answer", "verify_answer"]
