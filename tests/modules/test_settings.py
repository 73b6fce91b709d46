"""The settings ERPOModule owns (`modules/settings.py`, issue 67 item 3): a Query-KL scoring that needs the
reference cache's layout is refused with a vLLM-computed cache, before the cache is started. The refusal runs
`erpo_lightning.cli.main` in this process on a 2-step config of the shipped toy model."""

import pytest
from helpers.cli_runs import fails_in_one_line, tiny_config

from erpo_lightning.modules.settings import check_scoring_cache_engine
from erpo_lightning.toy import SHIPPED_DIR


@pytest.fixture()
def config(tmp_path):
    return str(tiny_config(tmp_path, SHIPPED_DIR, SHIPPED_DIR / "train.jsonl"))


@pytest.mark.parametrize("scoring", ["shared_prompt", "exact"])
def test_layout_scoring_with_a_vllm_cache_is_refused_before_the_cache(capsys, tmp_path, config, scoring):
    line = fails_in_one_line(
        capsys, "fit", "--config", config, "--model.query_kl_scoring", scoring, "--data.cache_engine", "vllm"
    )
    assert line == (
        f"erpo: error: model.query_kl_scoring {scoring!r} cannot be used with data.cache_engine 'vllm': it scores "
        "each query in the layout the reference cache was computed in, to equal it bit for bit, and vLLM's "
        "prompt_logprobs have no such layout (they match to about 1e-6); set data.cache_engine transformers, or "
        "model.query_kl_scoring shared_forward"
    )
    assert not (tmp_path / "cache").exists()  # refused before the reference cache was started
    check_scoring_cache_engine("shared_forward", "vllm")  # the scoring that tolerates vLLM's rounding is let through
    check_scoring_cache_engine(scoring, "transformers")
