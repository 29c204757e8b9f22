"""The progress display (orchestrator/tracking/progress.py) in-process: the line's figures, its rate limit, the bar on a
terminal, and the datasets library's bars kept quiet. The line in a real job's log is asserted in
tests/e2e/test_tracking_e2e.py (the MLflow outage job), the bar's choice of stream here."""
from __future__ import annotations

import io
import logging
import re
from types import SimpleNamespace

import pytest

from orchestrator.tracking.progress import TrainingProgress, progress_line, quiet_data_progress, wants_bar


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Tty(io.StringIO):
    def isatty(self):
        return True


def _state(step, total=100):
    return SimpleNamespace(global_step=step, max_steps=total, is_world_process_zero=True, is_local_process_zero=True)


def test_progress_line_has_step_rate_eta_cost_so_far_and_projected_total():
    line = progress_line(step=40, total=100, steps_per_second=4.0, spent_usd=0.01, projected_usd=0.025)
    assert line == ("step 40/100 (40%), 4.00 steps/s, ETA 00:15, cost so far $0.0100, "
                    "projected total $0.0250")
    early = progress_line(step=1, total=100, steps_per_second=None, spent_usd=0.0002, projected_usd=None)
    assert early == "step 1/100 (1%), - steps/s, ETA -, cost so far $0.000200, projected total -"
    assert "$1,234.50" in progress_line(step=1, total=2, steps_per_second=1.0, spent_usd=1234.5, projected_usd=2469)


def test_lines_go_at_most_every_interval_with_the_money_watch_figures(caplog):
    clock = Clock()
    asked = []

    def dollars(step, total):
        asked.append((step, total))
        return 0.5 * step / total, 0.5

    progress = TrainingProgress(dollars, bar=False, every_s=2.0, clock=clock)
    progress.on_train_begin(None, _state(10), None)
    with caplog.at_level(logging.INFO, logger="orchestrator.tracking.progress"):
        for step in range(11, 31):  # a step every 0.5 s from step 10 (a resumed attempt)
            clock.now += 0.5
            progress.on_step_end(None, _state(step), None)
    lines = [r.getMessage() for r in caplog.records if r.name == "orchestrator.tracking.progress"]
    # the attempt's first step, then one line per 2 s (every 4th step)
    assert [int(re.search(r"step (\d+)/", x).group(1)) for x in lines] == [11, 15, 19, 23, 27]
    assert lines[1] == ("progress: step 15/100 (15%), 2.00 steps/s, ETA 00:42, cost so far $0.0750, "
                        "projected total $0.5000")
    assert (15, 100) in asked


def test_a_terminal_gets_one_bar_with_the_dollars_and_the_trainer_logs_above_it(monkeypatch):
    stream = Tty()  # a terminal: tqdm draws on stderr, writes the logs above the bar on stdout
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setattr("sys.stdout", stream)
    assert wants_bar("auto") is True
    assert wants_bar("auto", io.StringIO()) is False  # a log file: lines
    assert wants_bar("lines", stream) is False and wants_bar("bar", io.StringIO()) is True
    assert wants_bar("off", stream) is None

    progress = TrainingProgress(lambda step, total: (0.0123, 0.0456), bar=True, every_s=30)
    progress.on_train_begin(None, _state(20, 60), None)
    progress.training_bar.fp = stream
    progress.training_bar.mininterval = 0
    for step in range(21, 31):
        progress.on_step_end(None, _state(step, 60), None)
    progress.on_log(None, _state(30, 60), None, logs={"loss": 1.23456})
    progress.training_bar.refresh()
    shown = stream.getvalue()
    assert "30/60" in shown and "step/s" in shown, shown
    assert "$0.0123 so far, $0.0456 projected" in shown, shown
    assert "'loss': '1.235'" in shown, shown
    progress.on_train_end(None, _state(30, 60), None)
    assert progress.training_bar is None


@pytest.mark.parametrize("show, environ, quieted", [(False, {}, True), (True, {}, False),
                                                   (False, {"HF_DATASETS_DISABLE_PROGRESS_BARS": "0"}, False)])
def test_datasets_bars_are_quiet_unless_asked_for(show, environ, quieted):
    import datasets

    datasets.enable_progress_bars()
    try:
        assert quiet_data_progress(show, environ) is quieted
        assert datasets.is_progress_bar_enabled() is (not quieted)
    finally:
        datasets.enable_progress_bars()


def test_an_unknown_progress_mode_is_refused_at_launch_naming_the_choices():
    from orchestrator.app.compose import compose_config
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tracking.progress='fancy' is not a valid choice; choose one of: "
                                          r"auto, bar, lines, off"):
        compose_config(["tracking.progress=fancy"])
