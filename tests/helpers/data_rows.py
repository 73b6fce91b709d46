"""Query-source rows for the data tests: the shipped toy task's problems, chat rows, and JSON Lines files written
as given (one good row, raw lines)."""

import json
from pathlib import Path

from erpo_lightning.data.templates import resolve_template

SHIPPED = Path(__file__).resolve().parents[2] / "erpo_lightning" / "toy" / "shipped"
PLAIN = resolve_template("plain", suffix="\n")


def shipped_rows(count: int) -> list[dict]:
    """The first `count` rows of the shipped training problems."""
    lines = (SHIPPED / "train.jsonl").read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


def chat(problem: str) -> list[dict]:
    """A one-turn conversation asking `problem`."""
    return [{"role": "user", "content": problem}]


def write(path: Path, rows: list[dict]) -> Path:
    """`rows` as a JSON Lines file at `path`."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_lines(path: Path, lines: list[bytes]) -> Path:
    """The raw `lines` (each without its newline) as a file at `path`."""
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def good(problem: str, answer: str = "1") -> bytes:
    """One well-formed JSON Lines row."""
    return json.dumps({"problem": problem, "answer": answer}).encode()
