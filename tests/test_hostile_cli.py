"""Hostile settings, paths and kills against `erpo`: each fails early, in one line, naming the field (issue 18).

Most cases call `erpo_lightning.cli.main` in this process (the console script's own entry point, a second each);
the subprocess tests run the installed `erpo` as a user does.
"""

import pytest
from helpers.cli_runs import fails_in_one_line, tiny_config

from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.data import QueryDataModule
from erpo_lightning.evaluation import SweepConfig
from erpo_lightning.rollout import HFEngine


@pytest.fixture()
def config(tmp_path, tiny_model_path, benchmarks_dir):
    return tiny_config(tmp_path, tiny_model_path, benchmarks_dir / "gsm8k.jsonl")


def test_constructing_the_datamodule_loads_nothing(tmp_path, tiny_model_path):
    """Settings are checked in the constructor; the tokenizer loads on first use (a missing model is not read yet)."""
    absent = QueryDataModule(str(tmp_path / "no_model_here"))
    assert "tokenizer" not in vars(absent)
    datamodule = QueryDataModule(str(tiny_model_path), template="plain", max_prompt_length=77)
    prompts = datamodule.prompt_format()
    assert prompts.tokenizer is datamodule.tokenizer and prompts.max_prompt_length == 77
    assert prompts.template == datamodule.template


def test_sizes_that_cannot_fit_are_refused_before_the_model_loads(config, capsys, tmp_path):
    """Issue 43 item 7: `rollout.group_size: 1000000` ran until the kernel killed it (325 s, no message). 10^8
    responses to each of 2 queries need 192 TiB of KV cache alone: over 4x any machine's memory."""
    line = fails_in_one_line(capsys, "fit", "--config", str(config), "--rollout.group_size", "100000000")
    assert line.startswith(
        "erpo: error: one step needs at least 195.1 TiB per device (rollout batch 3.0 TiB, generation 192.1 TiB, "
        "micro-batch 40.0 MiB, weights 1.3 MiB) for data.batch_size × rollout.group_size = 200000000 rows of up to "
        "1030 tokens (data.max_prompt_length + rollout.max_new_tokens), over 4x the "
    ), line
    assert line.endswith(": lower rollout.group_size, data.batch_size or the lengths or "
                         "rollout.engine.init_args.micro_batch_size")  # fmt: skip
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("name", "bad", "good"), [("top_p", 0.0, 1.0), ("top_p", 1.5, 0.5), ("top_k", -1, 0),
                                                   ("max_new_tokens", 0, 1)])  # fmt: skip
def test_the_rollout_and_the_sweep_check_a_sampling_setting_by_one_rule(name, bad, good):
    """top_p, top_k and max_new_tokens are checked by one entry of `rollout.engine.SAMPLING_RULES` in both owners:
    the same values pass, and a refused one is refused with the same range (the sweep's max_new_tokens may also
    be null: the RolloutCallback's)."""
    reward = lambda responses, golds: [0.0] * len(responses)  # noqa: E731
    RolloutCallback(HFEngine(), reward, **{name: good})
    SweepConfig(**{name: good})
    with pytest.raises(ValueError) as rollout:
        RolloutCallback(HFEngine(), reward, **{name: bad})
    with pytest.raises(ValueError) as sweep:
        SweepConfig(**{name: bad})
    allowed = str(rollout.value).removeprefix(f"rollout.{name} must be ").removesuffix(f", got {bad!r}")
    assert str(rollout.value) == f"rollout.{name} must be {allowed}, got {bad!r}"
    null = " (or null)" if name == "max_new_tokens" else ""
    assert str(sweep.value) == f"sweep.{name} must be {allowed}{null}, got {bad!r}"
