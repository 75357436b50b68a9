"""The readers' error: an input file that cannot be read as its format says (imports nothing), and its base, the
problem-and-fix error every ``erg`` user error is.

The ``erg`` CLI shows it as a user error, the problem and then the fix, exit status 2
(:func:`jobs.platform.errors.as_user_error`).
"""
from __future__ import annotations


class FixableError(Exception):
    """A problem the person running ``erg`` can fix: ``problem`` says what is wrong, ``fix`` what to do about it
    (the base of :class:`InputFileError` here and of the jobs' ``UserError``)."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem.strip()
        self.fix = fix.strip() if fix else None
        super().__init__(self.problem if not self.fix else f"{self.problem}; {self.fix}")

    def lines(self) -> list[str]:
        """The one or two lines the CLI prints."""
        return [self.problem] + ([f"fix: {self.fix}"] if self.fix else [])


class InputFileError(FixableError, ValueError):
    """An input file cannot be read as its format says: ``problem`` names the file and what is wrong with it, ``fix``
    what to do about it."""
