"""The steering callbacks' ports (``orchestrator.attempt.ports``): one step clock, one checkpoint interval."""
from __future__ import annotations

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from orchestrator.attempt.ports import CheckpointInterval, StepClock
from orchestrator.checkpoint.callback import OrchestratorCallback


class Hooks:
    def __init__(self):
        self.committed = []

    def stop_reason(self):
        return None

    def commit(self, folder, step, *, wait):
        self.committed.append(step)

    def on_metrics(self, metrics, step):
        pass

    def on_step(self, step):
        pass


def test_off_and_not_yet_decided_are_two_states_and_only_auto_is_set():
    off, auto, fixed = CheckpointInterval.fixed(0), CheckpointInterval.derived(), CheckpointInterval.fixed(90)
    assert (off.seconds, off.decided, auto.seconds, auto.decided, fixed.seconds) == (None, True, None, False, 90.0)
    auto.set(42.0)
    assert (auto.seconds, auto.decided) == (42.0, True)
    with pytest.raises(ValueError, match="fixed checkpoint interval"):
        fixed.set(10.0)


def test_the_trainer_callback_measures_each_step_once_for_every_reader_and_saves_when_the_interval_is_set(tmp_path):
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    steps, interval = StepClock(clock=clock), CheckpointInterval.derived()
    cb = OrchestratorCallback(Hooks(), interval=interval, steps=steps, clock=clock)
    args, state = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]), TrainerState()

    def step(seconds, wait=0.0):
        now[0] += wait
        cb.on_step_begin(args, state, TrainerControl())
        now[0] += seconds
        state.global_step += 1
        return cb.on_step_end(args, state, TrainerControl())

    assert not step(5.0).should_save  # the first step (warm-up) is not measured; auto not decided: no timed save
    assert steps.last_step_seconds is None and steps.timing_metrics() == {}
    step(1.0, wait=0.5)
    assert steps.last_step_seconds == pytest.approx(1.5)
    assert steps.timing_metrics(reset=False) == pytest.approx({"step_time_s": 1.5, "data_wait_s": 0.5})
    interval.set(3.0)  # the schedule decides: 7.5 s since training began, so the next step saves
    control = step(1.0)
    assert control.should_save
    now[0] += 0.25  # the save's stall
    cb.on_save(args, state, control)
    assert steps.save_stall_seconds == [pytest.approx(0.25)] and cb.hooks.committed == [3]
    step(1.0)  # measured from the save's end: the stall is not a step's
    assert steps.last_step_seconds == pytest.approx(1.0)
    assert steps.steady_seconds_per_step() == pytest.approx((1.5 + 1.0 + 1.0) / 3)
