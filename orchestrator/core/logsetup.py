"""One logging set-up for every entry point (launch, worker, supervisor): a console someone can watch, and
the job's log file with everything.

The console (stderr) leaves out what buries the progress bar: the records of ``FILE_ONLY`` loggers below
ERROR (lm-evaluation-harness's own, a hundred lines an evaluation; the Trainer's raw log dicts), once a log
file takes them, and shows the ``THROTTLED`` ones (every checkpoint's save, commit and retention lines) at
most once per ``THROTTLE_SECONDS``; warnings and the attempt's restore always. The job's log file (``log_to_file``, the worker's
``<run.work_dir>/<run.name>/job.log``) gets every record, and, during a benchmark evaluation, what the
harness writes to stderr (its progress bars: ``library_output_to_file``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# the loggers whose records below ERROR go to the job's log file only (once there is one)
FILE_ONLY = ("lm_eval", "orchestrator.tracking.trainer_logs")
FILE_ONLY_BELOW = logging.ERROR
# the loggers whose INFO lines reach the console at most once per THROTTLE_SECONDS, all of them together
THROTTLED = ("orchestrator.checkpoint",)
THROTTLE_SECONDS = 60.0
# ...but the attempt's restore (``checkpoint.store.announce_restore``), once an attempt, always shows
ALWAYS_SHOWN = ("announce_restore",)


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class ConsoleFilter(logging.Filter):
    """What the console shows of the records (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = THROTTLE_SECONDS):
        super().__init__()
        self.clock, self.every_s = clock, every_s
        self.file_takes_the_rest = False  # set once the job's log file has a handler
        self._last_throttled: Optional[float] = None

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if self.file_takes_the_rest and record.levelno < FILE_ONLY_BELOW and _under(name, FILE_ONLY):
            return False
        if record.levelno >= logging.WARNING or not _under(name, THROTTLED) or record.funcName in ALWAYS_SHOWN:
            return True
        now = self.clock()
        if self._last_throttled is not None and now - self._last_throttled < self.every_s:
            return False
        self._last_throttled = now
        return True


_console: Optional[logging.Handler] = None
_file: Optional[logging.FileHandler] = None


def setup_logging(stream: Optional[IO[str]] = None, *, clock: Callable[[], float] = time.monotonic) -> None:
    """The console handler on the root logger at ``$ORCH_LOG_LEVEL`` (INFO); called again, it replaces its own."""
    global _console
    root = logging.getLogger()
    if _console is not None:
        root.removeHandler(_console)
    _console = logging.StreamHandler(sys.stderr if stream is None else stream)
    _console.setFormatter(logging.Formatter(FORMAT))
    _console.addFilter(ConsoleFilter(clock))
    root.addHandler(_console)
    root.setLevel(os.environ.get("ORCH_LOG_LEVEL", "INFO"))


def log_to_file(path: Path) -> Path:
    """Every record from now on also to ``path`` (appended; its folder made), and the ``FILE_ONLY`` loggers'
    to there only. Returns the path."""
    global _file
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    if _file is not None:
        root.removeHandler(_file)
        _file.close()
    _file = logging.FileHandler(path, mode="a", encoding="utf-8")
    _file.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(_file)
    for f in _console.filters if _console is not None else []:
        if isinstance(f, ConsoleFilter):
            f.file_takes_the_rest = True
    return path


@contextmanager
def library_output_to_file() -> Iterator[None]:
    """Meanwhile, what is written to ``sys.stderr`` (a library's progress bars, its prints) goes to the job's log
    file, when there is one; the console's log lines still reach the console (their handler keeps its stream)."""
    if _file is None or _file.stream is None:
        yield
        return
    _file.flush()
    with redirect_stderr(_file.stream):
        yield
    _file.stream.flush()


def reset_logging() -> None:
    """Take this module's handlers off the root logger (tests)."""
    global _console, _file
    root = logging.getLogger()
    for handler in (_console, _file):
        if handler is not None:
            root.removeHandler(handler)
            handler.close()
    _console = _file = None
