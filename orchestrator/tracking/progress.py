"""What someone watching a job sees while it trains: a progress bar in a terminal, a line at a time in a log.

In a terminal (``tracking.progress=auto`` with stderr a TTY, or ``bar``): the
Trainer's own tqdm bar (transformers' ``ProgressCallback``: step/total, steps/s,
ETA), with the job's dollars so far and its projected total beside them. The
Trainer's logs are written above the bar by that callback, so the plain printer
that ``disable_tqdm=True`` installs is taken out.

Anywhere else (Slurm, Kubernetes, a file; or ``lines``): one line through the
``orchestrator.tracking.progress`` logger at the attempt's first step, then at most every
``tracking.job_metrics_every``, with the same figures and the latest loss -- a bar redrawn with
carriage returns is unreadable in a log file. The Trainer's raw log dicts (its ``PrinterCallback``;
above the bar, were stdout a terminal) go through the ``orchestrator.tracking.trainer_logs`` logger
instead, which reaches the job's log file, not the console (``orchestrator.core.logsetup``).

The dollars come from the attempt's money watch (``orchestrator/attempt/money.py``:
its meter and the budget's projection); nothing here prices anything.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Optional

from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback

log = logging.getLogger(__name__)
trainer_logs = logging.getLogger("orchestrator.tracking.trainer_logs")  # the job's log file only (core.logsetup)

MODES = ("auto", "bar", "lines", "off")
# (step, total steps) -> (dollars so far, projected total or None while there is too little to project from)
Dollars = Callable[[int, int], "tuple[float, Optional[float]]"]


def format_usd(value: Optional[float]) -> str:
    """Cents from $100 up, four decimals below, six below a cent (a small job's first minutes cost that)."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"${value:,.2f}"
    return f"${value:,.4f}" if abs(value) >= 0.01 else f"${value:.6f}"


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    from tqdm import tqdm

    return tqdm.format_interval(seconds)


def progress_line(
    *,
    step: int,
    total: int,
    steps_per_second: Optional[float],
    spent_usd: float,
    projected_usd: Optional[float],
    loss: Optional[float] = None,
) -> str:
    """The figures of a progress line, e.g.
    ``step 40/100 (40%), 4.00 steps/s, ETA 00:15, cost so far $0.0100, projected total $0.0250`` (``, loss 1.234``
    once the Trainer has logged one)."""
    eta = (max(0, total - step) / steps_per_second) if steps_per_second and total > 0 else None
    share = f" ({step / total:.0%})" if total > 0 else ""
    rate = "-" if steps_per_second is None else f"{steps_per_second:.2f}"
    return (
        f"step {step}/{total if total > 0 else '?'}{share}, {rate} steps/s, ETA {format_duration(eta)}, "
        f"cost so far {format_usd(spent_usd)}, projected total {format_usd(projected_usd)}"
        + ("" if loss is None else f", loss {loss:.4g}")
    )


def quiet_data_progress(show: bool, environ=os.environ) -> bool:
    """Turn off the datasets library's per-``map`` bars (TRL's tokenizing, the splits) unless asked for:
    ``tracking.data_progress_bars=true``, or ``HF_DATASETS_DISABLE_PROGRESS_BARS`` set (datasets' own
    switch, which wins). Returns whether they were turned off."""
    if show or environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") is not None:
        return False
    import datasets

    datasets.disable_progress_bars()
    return True


class TrainingProgress(ProgressCallback):
    """The Trainer callback behind both displays.

    Args:
        dollars: ``(step, total) -> (spent, projected)``, the job's figures (all attempts).
        bar: a tqdm bar (True) or progress lines (False).
        every_s: lines at most this often (0: at every step); the bar redraws as tqdm sees fit.
    """

    def __init__(self, dollars: Dollars, *, bar: bool, every_s: float, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.dollars = dollars
        self.bar = bar
        self.every_s = every_s
        self.clock = clock
        self._first: Optional[tuple[int, float]] = None  # (step, time) at the end of this attempt's first step
        self._last_line: Optional[float] = None
        self._redirect = None  # tqdm's logging redirect while the bar is up
        self._loss: Optional[float] = None  # the Trainer's latest, for the lines

    def on_train_begin(self, args, state, control, **kwargs):
        self.current_step = state.global_step
        if self.bar and state.is_world_process_zero:
            from tqdm.auto import tqdm  # what transformers' own bar uses

            # initial: a resumed attempt starts at its checkpoint's step, and tqdm's rate and ETA
            # count only the steps it has made since
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.training_bar = tqdm(total=state.max_steps, initial=state.global_step, unit="step", dynamic_ncols=True)
            # the job's log lines go above the bar (through tqdm.write) instead of through it
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        now = self.clock()
        step, total = state.global_step, state.max_steps
        if self._first is None:
            self._first = (step, now)
        if self.bar:
            spent, projected = self.dollars(step, total)
            if self.training_bar is not None:
                self.training_bar.set_postfix_str(
                    f"{format_usd(spent)} so far, {format_usd(projected)} projected", refresh=False
                )
            super().on_step_end(args, state, control, **kwargs)
            return
        if self._last_line is not None and now - self._last_line < self.every_s:
            return
        self._last_line = now
        log.info("progress: %s", self.line(step, total, now))

    def line(self, step: int, total: int, now: float) -> str:
        """The progress line at ``step`` (the rate is over this attempt's steps after its first: the first one
        carries the warm-up)."""
        first_step, first_time = self._first or (step, now)
        rate = (step - first_step) / (now - first_time) if step > first_step and now > first_time else None
        spent, projected = self.dollars(step, total)
        return progress_line(
            step=step, total=total, steps_per_second=rate, spent_usd=spent, projected_usd=projected, loss=self._loss
        )

    # the bar's own hooks; in line mode there is no bar to feed
    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar and _is_tty(sys.stdout):  # above the bar (tqdm.write: stdout)
            super().on_log(args, state, control, logs=logs, **kwargs)
        elif state.is_world_process_zero and logs:
            loss = logs.get("loss")
            self._loss = float(loss) if isinstance(loss, (int, float)) else self._loss
            trainer_logs.info("%s", logs)  # what PrinterCallback printed, to the job's log file

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if self.bar:
            super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar and self.training_bar is not None:
            super().on_train_end(args, state, control, **kwargs)
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


class LogsToFile(TrainerCallback):
    """The Trainer's log dicts to the job's log file (``trainer_logs``), where ``PrinterCallback`` printed them."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            trainer_logs.info("%s", logs)


def _is_tty(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


def wants_bar(mode: str, stream=None) -> Optional[bool]:
    """``tracking.progress`` -> a bar (True), lines (False), or nothing (None); ``auto``: a bar on a terminal."""
    if mode == "off":
        return None
    if mode == "auto":
        return _is_tty(sys.stderr if stream is None else stream)
    return mode == "bar"


def attach_progress(
    trainer: Any,
    tracking_cfg: Any,
    *,
    main: bool,
    dollars: Callable[[int, int], tuple[float, Optional[float]]],
    every_s: Optional[float] = None,
) -> Optional[TrainingProgress]:
    """Add the display to ``trainer`` on the main rank (``tracking_cfg``: ``cfg.tracking``; ``dollars(step, total)``:
    spent so far and the projected total, the money watch's; ``every_s``: ``tracking.job_metrics_every`` as the typed
    view parsed it, else parsed here). Returns the callback, or None."""
    from orchestrator.core.durations import parse_duration

    bar = wants_bar(tracking_cfg.progress)
    if bar is None and main and not _is_tty(sys.stdout):  # no display, but no raw log dicts in a log either
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(LogsToFile())
    if bar is None or not main:
        return None
    if every_s is None:
        every_s = parse_duration(tracking_cfg.job_metrics_every, key="tracking.job_metrics_every")
    progress = TrainingProgress(dollars, bar=bar, every_s=every_s)
    trainer.remove_callback(ProgressCallback)  # the Trainer's own bar, were disable_tqdm off: one display only
    # the bar writes the Trainer's logs above itself; the lines carry the loss and the log file the rest
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(progress)
    return progress
