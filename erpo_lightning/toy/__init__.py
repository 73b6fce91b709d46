"""The quickstart's embedded task and model: two-step integer arithmetic and a tiny Qwen2 pre-trained on it.

The model and its splits are shipped as package data (`SHIPPED_DIR`, identified by the sha256 in its manifest):
`shipped_assets()` returns them, checked. `ensure_toy_assets()` rebuilds them (`python -m erpo_lightning.toy`, which
also says whether the rebuild equals the shipped files). `toy_template()` is the prompt template the model was trained
on, which the quickstart's data config must reproduce (`template: plain`, `suffix: TOY_TEMPLATE_SUFFIX`).
"""

from erpo_lightning.toy.assets import ToyAssets, ToyConfig, default_root, ensure_toy_assets
from erpo_lightning.toy.pretrain import MAX_NEW_TOKENS, PretrainConfig
from erpo_lightning.toy.ship import SHIPPED_DIR, compare_with_shipped, shipped_assets, verify_shipped
from erpo_lightning.toy.task import TOY_TEMPLATE_SUFFIX, make_problems, toy_template

__all__ = [
    "MAX_NEW_TOKENS",
    "SHIPPED_DIR",
    "TOY_TEMPLATE_SUFFIX",
    "PretrainConfig",
    "ToyAssets",
    "ToyConfig",
    "compare_with_shipped",
    "default_root",
    "ensure_toy_assets",
    "make_problems",
    "shipped_assets",
    "toy_template",
    "verify_shipped",
]
