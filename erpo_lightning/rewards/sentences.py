"""Reduce the prose after an answer marker ("The final answer is ...") to the answer itself."""

from __future__ import annotations

import re

# Math delimiters, line breaks and sentence ends, scanned left to right.
_TOKEN = re.compile(r"\$\$|\$|\\\(|\\\)|\\\[|\\\]|\n|[.!?](?=\s|$)")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[^{}]*\}")
_IS = re.compile(r"\s(?:is|are|equals|=)\s", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*(?:\\?%|percent))?")
_DECORATION = ' \t\n*"`,;:'
_HEDGE = re.compile(
    r"\b(?:unless|otherwise|or|else|except|but|alternatively|instead|maybe|perhaps|possibly)\b",
    re.IGNORECASE,
)


def sentence_prefix(text: str) -> str:
    """``text`` up to the end of its first sentence, never cutting inside a math span."""
    text = text.lstrip()
    closer: str | None = None
    for m in _TOKEN.finditer(text):
        token = m.group()
        if closer is not None:
            closer = None if token == closer else closer
        elif token in _CLOSER:
            closer = _CLOSER[token]
        elif m.start() > 0 and token not in ("\\)", "\\]"):
            return text[: m.start()]
    return text


def _strip_decoration(text: str) -> str:
    text = text.replace("**", "").replace('\\"', "").strip(_DECORATION).rstrip(".")
    while text.endswith("\\") and not text.endswith("\\\\"):
        text = text[:-1].strip(_DECORATION).rstrip(".")
    return text


def _is_prose(text: str) -> bool:
    return len(_WORD.findall(_ENVIRONMENT.sub(" ", _MATH_SPAN.sub(" ", text)))) >= 2


def _has_value(text: str) -> bool:
    return bool(_MATH_SPAN.search(text) or _NUMBER.search(text) or not _is_prose(text))


def _last_math(text: str) -> str | None:
    spans = list(_MATH_SPAN.finditer(text))
    if not spans:
        return None
    return next(g for g in spans[-1].groups() if g is not None).strip() or None


def reduce_to_answer(sentence: str, allow_number: bool = True) -> str | None:
    """The answer inside one sentence, e.g. ``"The volume of $V$ is 120"`` -> ``"120"``.

    A sentence that is not prose is returned as is. In prose, the part after the last
    " is "/" = " wins when it holds a value, then the last math span, then (if
    ``allow_number``) the last number; prose that still offers two different values
    ("either 7 or 19", "7 or possibly 19") has no answer.
    """
    text = _strip_decoration(sentence)
    while text and _is_prose(text):
        outside = _MATH_SPAN.sub(lambda m: "\0" * len(m.group()), text)
        tails = list(_IS.finditer(outside))
        tail = _strip_decoration(text[tails[-1].end() :]) if tails else ""
        if not tail or not _has_value(tail):
            break
        if _hedges(text[: tails[-1].start()]):
            return None  # "7 unless it is 19", "7, but maybe it is 19": the value before is still offered
        text = tail
    else:
        return text or None
    if len(_candidates(text)) > 1:
        return None  # "either 7 or 19", "7 or possibly 19": a hedge between values is no answer
    if (math := _last_math(text)) is not None:
        return math
    numbers = _NUMBER.findall(text) if allow_number else []
    return numbers[-1].strip() if numbers else None


def _hedges(head: str) -> bool:
    """Whether the prose before a sentence's last " is " offers a value of its own and then hedges or retracts it
    ("7 unless it", "7, but maybe it"): the sentence names two values, so it gives no answer."""
    return bool(_candidates(head)) and _HEDGE.search(_MATH_SPAN.sub(" ", head)) is not None


def _candidates(prose: str) -> set[str]:
    """The distinct values a sentence of prose offers: its math spans (a lone letter names, it is not a value) and
    the numbers outside them."""
    spans = {re.sub(r"\s+", "", next(g for g in m.groups() if g is not None)) for m in _MATH_SPAN.finditer(prose)}
    outside = _MATH_SPAN.sub(" ", prose)
    numbers = {re.sub(r"[\s,]", "", number) for number in _NUMBER.findall(outside)}
    return {span for span in spans if span and not re.fullmatch(r"[A-Za-z]", span)} | numbers
