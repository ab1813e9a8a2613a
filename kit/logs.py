"""The bot's log lines: text (``TIME LOGGER MESSAGE``) or JSON, one object per line with time,
level, logger, message, and the execution and runbook in hand (``execution()``, a context
variable the engine sets while it drives a run, so an adapter's lines carry them too).
``install`` sends the bot's loggers to stderr at INFO; in JSON other libraries' warnings
too, so that every line there is an object. ``liner`` and ``reporter`` are `runbook serve`'s
own lines: printed on stdout in text, records in JSON."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

FORMAT_ENV = "RUNBOOK_LOG_FORMAT"
LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT = "%(asctime)s %(name)s %(message)s"
FIELDS = ("execution_id", "runbook")  # a record's own (logging's extra=) win over the context
_CURRENT: ContextVar[Mapping[str, Any] | None] = ContextVar("runbook_log_execution",
                                                            default=None)
_ACTIVE: list[LogFormat] = []  # what install() set up, while it holds
_MARK = "_runbook_logs"  # on the handlers install() added, so a second call replaces them


@contextmanager
def execution(execution_id: int, runbook: str | None = None) -> Iterator[None]:
    """Lines logged in this block (in this thread or a context copied from it) name the
    execution, and its runbook when given."""
    fields: dict[str, Any] = {"execution_id": execution_id}
    if runbook:
        fields["runbook"] = runbook
    token = _CURRENT.set(fields)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> Mapping[str, Any]:
    """The execution fields in hand (empty outside an execution)."""
    return _CURRENT.get() or {}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The execution fields of a record: its own (extra=), else the context's; the
    context's runbook is dropped when the record names another execution."""
    fields = dict(current())
    own = {name: getattr(record, name) for name in FIELDS
           if getattr(record, name, None) is not None}
    if "execution_id" in own and own["execution_id"] != fields.get("execution_id"):
        fields = {}
    return {**fields, **own}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a newline in a message is escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        out.update(fields_of(record))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def chosen(configured: str, environ: Mapping[str, str]) -> LogFormat:
    """RUNBOOK_LOG_FORMAT wins over the configuration's logging.format; ValueError when the
    variable names no format."""
    value = environ.get(FORMAT_ENV, "").strip().lower() or configured
    for known in FORMATS:
        if value == known:
            return known
    raise ValueError(f"{FORMAT_ENV}={value!r}: the log format is text or json")


def uninstall() -> None:
    """Take away the handlers install() added (tests, and a process that logs no more)."""
    for logger in (logging.getLogger("bot"), logging.getLogger()):
        for old in [h for h in logger.handlers if getattr(h, _MARK, False)]:
            logger.removeHandler(old)
    _ACTIVE.clear()


def _bot_only(record: logging.LogRecord) -> bool:
    return record.name == "bot" or record.name.startswith("bot.")


def install(fmt: LogFormat, stream: TextIO | None = None) -> None:
    """The bot's loggers to ``stream`` (stderr) at INFO in ``fmt``; in JSON, other libraries'
    warnings too, so that every line of stderr is an object. Replaces what it installed."""
    uninstall()
    bot, root = logging.getLogger("bot"), logging.getLogger()
    formatter = JsonFormatter() if fmt == "json" else logging.Formatter(TEXT)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    setattr(handler, _MARK, True)
    bot.addHandler(handler)
    bot.setLevel(logging.INFO)
    _ACTIVE.append(fmt)
    if fmt == "json":
        others = logging.StreamHandler(stream or sys.stderr)
        others.setFormatter(formatter)
        others.setLevel(logging.WARNING)
        others.addFilter(lambda record: not _bot_only(record))
        setattr(others, _MARK, True)
        root.addHandler(others)


def active() -> LogFormat | None:
    """The format install() set up in this process (None before, or after uninstall())."""
    return _ACTIVE[0] if _ACTIVE else None


def liner(logger: str, prefix: str = "", level: int = logging.INFO,
          stream: TextIO | None = None) -> Callable[[str], None]:
    """How `runbook serve` says its own lines (serving on, the scheduler's, the leadership's):
    a record of ``logger`` at ``level`` once JSON is installed; else ``prefix + line``
    printed on ``stream`` (stdout), as always."""
    log = logging.getLogger(logger)

    def say(line: str) -> None:
        if active() == "json":
            log.log(level, "%s", line)
        else:
            print(f"{prefix}{line}", file=stream or sys.stdout, flush=True)

    return say


def report(execution_id: int, line: str) -> None:
    """The engine's progress lines: ``[ID] line`` on stdout; once JSON is installed a record
    of bot.engine naming the execution."""
    if active() == "json":
        logging.getLogger("bot.engine").info("%s", line, extra={"execution_id": execution_id})
    else:
        print(f"[{execution_id}] {line}", flush=True)
