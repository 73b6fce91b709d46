"""The one-line errors a user of `erpo` reads (`common/errors.py`): an exception as one line, whatever its text."""

from erpo_lightning.common.errors import one_line


def test_one_line_messages():
    assert one_line(ValueError("data.train:\n  row 3:   bad")) == "data.train: row 3: bad"
    assert one_line(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    assert one_line(StopIteration()) == "StopIteration"
    assert one_line(KeyError("prompt_ids")) == "KeyError: missing key 'prompt_ids'"
    assert one_line(RuntimeError("x" * 5000)).endswith("x [...]") and len(one_line(RuntimeError("x" * 5000))) < 2100
