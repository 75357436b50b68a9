"""User errors: problems the person running ``erg`` can fix, as opposed to bugs.

A user error is a bad conf, a bad input file, a missing table or a step run before the one it needs. The CLI prints
it as one or two lines, the problem and then the fix, and exits with status 2; ``--debug`` shows the traceback
instead. Anything else is a bug and keeps its traceback (exit status 1).

Raise :class:`UserError` or :class:`MissingStepError` (a job needs what an earlier job writes); the readers raise
:class:`readers.errors.InputFileError` (a file named in the conf cannot be read as its format says), a user error
too. :func:`as_user_error` also recognises the errors of the layers below (a :class:`jobs.platform.config.ConfigError`,
Spark's "table or view not found" and SQL syntax errors, and messages that follow the convention "...: run
`erg <job>` first").
"""
from __future__ import annotations

import re

from readers.errors import FixableError, InputFileError


class UserError(FixableError):
    """A problem the user can fix: ``problem`` says what is wrong, ``fix`` what to do about it."""


class MissingStepError(UserError, RuntimeError):
    """A job needs what an earlier job writes (a table's rows, a trained model): run that job first."""


#: Delta's optimistic-concurrency conflicts: another writer committed to a table this job read or wrote
_CONCURRENT = re.compile(r"\b(Concurrent(Append|DeleteRead|DeleteDelete|Transaction|Write)Exception|"
                         r"MetadataChangedException|ProtocolChangedException|DELTA_CONCURRENT_[A-Z_]+|"
                         r"DELTA_METADATA_CHANGED|DELTA_PROTOCOL_CHANGED)\b")
_TABLE_IN = re.compile(r"\b[Tt]able\s+[`']?((?:\w+\.)+\w+)")  # a qualified name: schema.table


def is_concurrent_write(exc: BaseException) -> bool:
    """Whether ``exc`` is Delta refusing a commit because another writer committed first."""
    return bool(_CONCURRENT.search(f"{type(exc).__name__} {exc}"))


#: "<problem>: run `erg <job>` ... first": the convention of messages about a step run before the one it needs
_RUN_FIRST = re.compile(r"[:;,]\s+(run `erg [a-z]+[^`]*`.*\bfirst\b.*)$", re.S)


def as_user_error(exc: BaseException, sql: bool = False) -> FixableError | None:
    """``exc`` as a :class:`UserError` when it is one the user can fix, else None (a bug: keep the traceback).
    ``sql``: the user wrote the query (``erg sql``), so any analysis error of it is theirs."""
    from jobs.platform.config import ConfigError

    if isinstance(exc, FixableError):
        return exc
    if isinstance(exc, ConfigError):
        problem, _, detail = str(exc).partition("\n")
        if not detail:  # the message says what to do (choose a conf, set a variable, fix the YAML)
            return UserError(problem)
        detail = "; ".join(line.strip() for line in detail.splitlines())
        return UserError(f"{problem}: {detail}", "fix the key(s) named above in the conf file or the --set override")
    name = type(exc).__name__
    message = str(exc)
    if is_concurrent_write(exc):
        kind = _CONCURRENT.search(f"{name} {message}").group(1)
        table = _TABLE_IN.search(message)
        where = f" to {table.group(1)}" if table else ""
        return UserError(f"another writer committed{where} while this job ran ({kind}): Delta refused this job's "
                         "commit, so the table holds the other writer's change and none of this one's",
                         "find the other writer (a job outside erg, or one started with lock.enabled off), let it "
                         "finish, then rerun (`erg run --incremental` does only what is missing)")
    if name in ("AnalysisException", "ParseException") or "TABLE_OR_VIEW_NOT_FOUND" in message:
        first = message.strip().splitlines()[0] if message.strip() else name
        first = re.sub(r"\s*SQLSTATE: \w+\.?", "", first)
        if "TABLE_OR_VIEW_NOT_FOUND" in message or "cannot be found" in message:
            return UserError(first, "check the name (`erg sql \"SHOW TABLES IN erg\"` lists the tables) or run the "
                             "job that writes it (`erg run` writes them all)")
        if name == "ParseException":
            return UserError(f"SQL syntax error: {first}", "fix the query")
        return UserError(f"SQL error: {first}", "fix the query") if sql else None
    if isinstance(exc, (RuntimeError, ValueError)) and (m := _RUN_FIRST.search(message.strip())):
        return MissingStepError(message[:m.start()], " ".join(m.group(1).split()))
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return InputFileError(f"{exc.filename}: no such file or folder",
                              "fix the path in the conf (ingest.sources) or create the file")
    return None
