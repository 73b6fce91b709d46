"""The export tests' LoRA toy model (tests/export/test_export_guards.py, tests/export/test_export_outputs.py): the
shipped toy model with r = 4 adapters on every linear layer, every B moved off 0 by a fixed draw, and the logits of
one probe prompt to compare exported models by."""

import torch
from transformers import AutoTokenizer

from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.modules.lora import LoraSettings
from erpo_lightning.toy import SHIPPED_DIR

PROBE = "Compute 7 + 8 - 5.\n"
LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "seed": 0}


def probe_logits(model: torch.nn.Module) -> torch.Tensor:
    """The logits of PROBE: [1, tokens, vocabulary]."""
    ids = AutoTokenizer.from_pretrained(SHIPPED_DIR)(PROBE, return_tensors="pt").input_ids
    with torch.no_grad():
        return model.eval()(ids).logits


def move_adapters(policy: torch.nn.Module) -> None:
    """Every B off 0 by a fixed draw, as training would move it (so that the adapter changes the model's logits)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))


def lora_module() -> ERPOModule:
    """The module on the shipped toy model with its LORA policy built and the adapters moved (`move_adapters`)."""
    module = ERPOModule(str(SHIPPED_DIR), peft=LoraSettings(**LORA))
    module.configure_model()
    move_adapters(module.policy)
    return module
