"""The readers' error: an input file that cannot be read as its format says (imports nothing).

The ``erg`` CLI shows it as a user error, the problem and then the fix, exit status 2
(:func:`jobs.platform.errors.as_user_error`).
"""
from __future__ import annotations


class InputFileError(ValueError):
    """An input file cannot be read as its format says: ``problem`` names the file and what is wrong with it, ``fix``
    what to do about it."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem.strip()
        self.fix = fix.strip() if fix else None
        super().__init__(self.problem if not self.fix else f"{self.problem}; {self.fix}")

    def lines(self) -> list[str]:
        """The one or two lines the CLI prints."""
        return [self.problem] + ([f"fix: {self.fix}"] if self.fix else [])
