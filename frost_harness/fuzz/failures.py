"""How a property reports a failure: one message that names the problem and replays it.

Every property raises ``PropertyFailure`` (an AssertionError, so pytest and Hypothesis
treat it as a plain test failure). Its message starts with the property, the engine
and what broke, and ends with a one-line shell command that replays the exact
problem on its own (``python -m frost_harness.fuzz.replay``): the Case's repr holds every size,
feature and the seed its tensors are drawn from, so no Hypothesis database or blob is
needed to get the failure back.
"""
from __future__ import annotations

import shlex

from frost_harness.suites.harness import Case


def reproduce_command(prop: str, case: Case, engine: str | None = None) -> str:
    """``python -m frost_harness.fuzz.replay PROPERTY "Case(...)" [--engine NAME]``, quoted for a POSIX shell."""
    words = ["python", "-m", "frost_harness.fuzz.replay", prop, repr(case)] + (["--engine", engine] if engine else [])
    return " ".join(_quote(word) for word in words)


def _quote(word: str) -> str:
    """Double quotes where they suffice (a Case repr reads better without shlex's ``'"'"'``)."""
    if word and not any(c in word for c in '"$`\\!'):
        return f'"{word}"' if any(c in word for c in " '()*?[]<>|&;~#") else word
    return shlex.quote(word)


class PropertyFailure(AssertionError):
    """A property that does not hold for one problem (and, where it applies, one engine)."""

    def __init__(self, prop: str, case: Case, engine: str | None, details: str):
        self.prop, self.case, self.engine = prop, case, engine
        self.command = reproduce_command(prop, case, engine)
        who = f" on engine {engine!r}" if engine else ""
        super().__init__(f"{prop} failed{who}: {details}\ncase: {case.id}\nreproduce: {self.command}")

