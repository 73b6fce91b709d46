"""`QueryDataModule` (`data/datamodule.py`): its constructor checks the settings and loads nothing."""

from erpo_lightning.data import QueryDataModule


def test_constructing_the_datamodule_loads_nothing(tmp_path, tiny_model_path):
    """Settings are checked in the constructor; the tokenizer loads on first use (a missing model is not read yet)."""
    absent = QueryDataModule(str(tmp_path / "no_model_here"))
    assert "tokenizer" not in vars(absent)
    datamodule = QueryDataModule(str(tiny_model_path), template="plain", max_prompt_length=77)
    prompts = datamodule.prompt_format()
    assert prompts.tokenizer is datamodule.tokenizer and prompts.max_prompt_length == 77
    assert prompts.template == datamodule.template
