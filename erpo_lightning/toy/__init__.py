"""The quickstart's embedded task and model: two-step integer arithmetic and a tiny Qwen2 pre-trained on it here.

`ensure_toy_assets()` builds (once) and returns the model directory and the JSONL splits; `toy_template()` is the
prompt template the model was trained on, which the quickstart's data config must reproduce
(`template: plain`, `suffix: TOY_TEMPLATE_SUFFIX`).
"""

from erpo_lightning.toy.assets import ToyAssets, ToyConfig, default_root, ensure_toy_assets
from erpo_lightning.toy.pretrain import MAX_NEW_TOKENS, PretrainConfig
from erpo_lightning.toy.task import TOY_TEMPLATE_SUFFIX, make_problems, toy_template

__all__ = [
    "MAX_NEW_TOKENS",
    "TOY_TEMPLATE_SUFFIX",
    "PretrainConfig",
    "ToyAssets",
    "ToyConfig",
    "default_root",
    "ensure_toy_assets",
    "make_problems",
    "toy_template",
]
