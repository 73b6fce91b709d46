"""ERPOModule on a hand-built rollout batch: two prompts with two responses each, reference scores from unpadded
forwards of the initial model, and one fit on that batch."""

import lightning as L
import torch

from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.scoring.logprobs import gather_token_logprobs
from erpo_lightning.scoring.queries import QueryScoringLayout
from helpers.batches import carrying_scores, make_rollout, rollout_loader

PAD = 256


TEMPERATURE = 0.8


PROMPTS = [[10, 11, 12, 13, 14], [20, 21, 22]]


RESPONSES = [[30, 31, 32, 33], [34, 35], [40, 41, 42], [43]]  # G = 2 responses per prompt


REWARDS = [1.0, 0.0, 0.0, 1.0]


class ReferenceLogprobs:
    """Reference query log-probs from unpadded forwards of the initial model, right-aligned like the data cache;
    `nll` (the summed NLL w(q) is made from) is set by hand: 3 and 5 nats give w = 4/3 and 0.8."""

    def __init__(self, model, prompts):
        with torch.no_grad():
            self.rows = [gather_token_logprobs(model(torch.tensor([p])).logits, torch.tensor([p]))[0] for p in prompts]
        self.nll = torch.tensor([3.0, 5.0])

    layout = QueryScoringLayout()  # what the module's exact query pass scores in (these rows are unpadded forwards)

    def row(self, query_index):
        return self.rows[query_index]

    def padded(self, query_index, width):
        out = torch.zeros(len(query_index), width)
        for i, q in enumerate(query_index.tolist()):
            row = self.rows[q]
            out[i, width - len(row) :] = row
        return out


def rollout_batch(model):
    """[prompt; response] rows: prompts left-padded to 5, responses right-padded to 4, on-policy sampling log-probs."""
    logprobs = []
    with torch.no_grad():
        for i, response in enumerate(RESPONSES):
            full = torch.tensor([PROMPTS[i // 2] + response])
            logits = model(full).logits / TEMPERATURE
            logprobs.append(gather_token_logprobs(logits, full)[0, -len(response) :].tolist())
    return make_rollout(PROMPTS, RESPONSES, REWARDS, TEMPERATURE, logprobs, pad_token_id=PAD)


def fit_one_batch(module, batch, steps=1, carry=True, **trainer_kwargs):
    """Fit `module` on `batch` `steps` times; with `carry`, the batch first gets the query scores the query stream
    would carry for the module's reference and rule (`batches.carrying_scores`)."""
    if carry and module.reference_cache is not None:
        batch = carrying_scores(batch, module.algorithm, module.reference_cache.nll)
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, **trainer_kwargs,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=rollout_loader([batch] * steps))
    return trainer


def make_module(path, reference, **kwargs):
    module = ERPOModule(str(path), learning_rate=1e-3, **kwargs)
    module.reference_cache = reference
    return module
