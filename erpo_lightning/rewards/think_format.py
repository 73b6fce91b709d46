"""``ThinkFormatReward``: pays for the response format the `erpo-paper` prompt template asks for.

That template (`data/templates.py`, `ERPO_SUFFIX`) asks the model to think first, inside `<think> </think>` tags, and
then to give the final answer in `\\boxed{}`. `format_status` reads a response against that request, by these rules
(tags are the exact, lower-case strings `<think>` and `</think>`):

1. the response is text (bytes are decoded as UTF-8) of at most `max_response_chars` characters;
2. it holds exactly one `<think>` and exactly one `</think>`: no second block, no nested or stray tag;
3. nothing but whitespace comes before `<think>`;
4. the thought between the tags is not empty (whitespace and invisible characters do not count);
5. an answer follows `</think>` and shows something (not only spaces, math delimiters, an empty `\\text{}` or an empty
   box), and (with `require_boxed`, the default) its last `\\boxed{...}` is complete and shows something too.

When the prompt itself ends with `<think>` (chat templates of reasoning models open the block for the model), the
response is read as if it began with that tag. Everything here is a linear scan of at most `max_response_chars`
characters: no input raises, and none is parsed or evaluated.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, get_args

from erpo_lightning.rewards.extraction import find_boxes
from erpo_lightning.rewards.normalize import shows_nothing, strip_invisible

FormatStatus = Literal[
    "well_formed",
    "not_text",
    "too_long",
    "no_think",
    "several_tags",
    "unpaired",
    "text_before_think",
    "empty_thought",
    "no_answer",
    "no_boxed_answer",
]
OPEN_TAG, CLOSE_TAG = "<think>", "</think>"
MAX_RESPONSE_CHARS = 200_000
MAX_MARKUP_CHARS = 1_000


def _empty(text: str) -> bool:
    return not strip_invisible(text).strip()


def _shows_nothing(text: str) -> bool:
    """Whether an answer shows nothing though it is not blank (`\\boxed{}`, `\\text{ }`, `$ $`), judged on answers of
    at most `MAX_MARKUP_CHARS` characters: the markup is stripped by regular expressions, which a long run of spaces and
    dots would make slow; a longer answer that is not blank counts as showing something."""
    return len(text) <= MAX_MARKUP_CHARS and shows_nothing(text)


def opens_think(prompt: object) -> bool:
    """Whether a prompt text ends by opening the think block (`<think>`, then only whitespace)."""
    return isinstance(prompt, str) and prompt.rstrip().endswith(OPEN_TAG)


def format_status(
    response: object,
    require_boxed: bool = True,
    max_response_chars: int = MAX_RESPONSE_CHARS,
    opened_by_prompt: bool = False,
) -> FormatStatus:
    """How `response` meets the think format (module docstring): "well_formed", or the first rule it breaks.

    Args:
        response: the response text (anything else is "not_text"; bytes are decoded).
        require_boxed: the answer after `</think>` must end in a complete, non-empty `\\boxed{...}`.
        max_response_chars: longer responses are "too_long", unread.
        opened_by_prompt: the prompt ended with `<think>`: the response is read as if it began with it.
    """
    if isinstance(response, bytes):
        response = response.decode("utf-8", "replace")
    if not isinstance(response, str):
        return "not_text"
    if len(response) > max_response_chars:
        return "too_long"
    text = OPEN_TAG + response if opened_by_prompt else response
    opens, closes = text.count(OPEN_TAG), text.count(CLOSE_TAG)
    if opens == 0 and closes == 0:
        return "no_think"
    if opens > 1 or closes > 1:
        return "several_tags"
    if opens != closes:
        return "unpaired"
    if not text.lstrip().startswith(OPEN_TAG):
        return "text_before_think"  # also a `</think>` written before the `<think>`
    thought, answer = text.lstrip()[len(OPEN_TAG) :].split(CLOSE_TAG, 1)
    if _empty(thought):
        return "empty_thought"
    if _empty(answer):
        return "no_answer"
    if require_boxed:
        boxes = find_boxes(answer)
        if not boxes or boxes[-1][2] is None or _shows_nothing(boxes[-1][2]):
            return "no_boxed_answer"
    elif _shows_nothing(answer):
        return "no_answer"  # `\\boxed{}`, `$ $`: an answer that shows nothing, though not blank
    return "well_formed"


class ThinkFormatReward:
    """1.0 for a response in the `erpo-paper` template's format (`format_status` is "well_formed"), else 0.0.

    It pays for the format alone, not for the answer: combine it with `MathReward` through `CombinedReward`, with a
    small weight, so that a well-formed wrong answer earns less than a correct one. The gold answers are not read.

    Args:
        require_boxed: the answer after `</think>` must end in a complete, non-empty `\\boxed{...}` (the template
            asks for it); False accepts any answer that shows something.
        max_response_chars: a longer response scores 0 unread (counted in `too_long`).

    `counters()` returns `items`, `well_formed` and one count per rule broken (`no_think`, `several_tags`, ...)
    since the previous call.
    """

    def __init__(self, require_boxed: bool = True, max_response_chars: int = MAX_RESPONSE_CHARS) -> None:
        if max_response_chars <= 0:
            raise ValueError(f"max_response_chars={max_response_chars}: must be positive")
        self.require_boxed = require_boxed
        self.max_response_chars = max_response_chars
        self._counts: Counter[str] = Counter()

    def __call__(self, responses: list[str], golds: list[str], prompts: list[str] | None = None) -> list[float]:
        """One value per response: 1.0 well-formed, 0.0 otherwise; `prompts` (one per response) tell whether the
        prompt opened the think block."""
        return [float(status == "well_formed") for status in self.statuses(responses, prompts)]

    def statuses(self, responses: list[str], prompts: list[str] | None = None) -> list[FormatStatus]:
        """`format_status` of each response (with its prompt, when given)."""
        if prompts is not None and len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        opened = [opens_think(p) for p in prompts] if prompts is not None else [False] * len(responses)
        found = [
            format_status(response, self.require_boxed, self.max_response_chars, prompt_opened)
            for response, prompt_opened in zip(responses, opened, strict=True)
        ]
        self._counts["items"] += len(found)
        self._counts.update(found)
        return found

    def describe(self) -> dict[str, object]:
        """The reward's settings by name, as results files record them."""
        return {
            "class": f"{type(self).__module__}.{type(self).__name__}",
            "require_boxed": self.require_boxed,
            "max_response_chars": self.max_response_chars,
        }

    def counters(self) -> dict[str, float]:
        """Counts since the previous call (then reset): items, well-formed responses and each rule broken."""
        counts = {name: float(self._counts[name]) for name in ("items", *get_args(FormatStatus))}
        self._counts.clear()
        return counts
