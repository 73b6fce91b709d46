"""Verifiable rewards for RL post-training: the reward protocol, the default math reward, a weighted sum of rewards and
the think-format reward of the `erpo-paper` template."""

from erpo_lightning.rewards.combined import CombinedReward
from erpo_lightning.rewards.conventions import CONVENTIONS, GraderSettings
from erpo_lightning.rewards.extraction import extract_answer
from erpo_lightning.rewards.math_reward import MathReward, Verdict, verify_answer
from erpo_lightning.rewards.protocol import Reward, RewardSignature
from erpo_lightning.rewards.think_format import ThinkFormatReward, format_status

__all__ = [
    "CONVENTIONS",
    "CombinedReward",
    "GraderSettings",
    "MathReward",
    "Reward",
    "RewardSignature",
    "ThinkFormatReward",
    "Verdict",
    "extract_answer",
    "format_status",
    "verify_answer",
]
