"""What a job prints on its console: a short plan, no library chatter, checkpoint lines at most once a minute,
no raw dicts of the Trainer's logs in a log that is not a terminal; everything in the job's log file."""
from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from orchestrator.config.schema import Config
from orchestrator.planning import plan


def _job(**compute):
    return OmegaConf.merge(OmegaConf.structured(Config), {
        "recipe": {"name": "sft"}, "model": {"name_or_path": "builtin:tiny-llama"},
        "compute": {"gpu_type": "a100-80gb", "gpus_per_node": 1, **compute}})


def test_the_launch_plan_is_five_lines_pointing_at_the_whole_one():
    whole = plan.plan_text(_job()).splitlines()
    short = plan.short_plan_text(_job()).splitlines()
    assert len(whole) > 20 and len(short) == 5, short
    assert short[0] == whole[0] and short[0].startswith("plan: ")
    assert short[1].startswith("fit: OK on a100-80gb")
    assert short[2].startswith("cost: ") and short[3].startswith("recommendation: ")
    assert "orchestrator plan" in short[4]


def test_a_plan_that_will_not_fit_keeps_its_warning_in_the_short_plan():
    short = plan.short_plan_text(_job(gpu_type="t4", memory_gb=0.001)).splitlines()
    assert any(line.startswith("WARNING: will NOT fit on t4") for line in short), short


@pytest.fixture
def console(tmp_path):
    """The job's logging as a worker sets it up: the console (a buffer here) and the job's log file."""
    import io

    from orchestrator.core import logsetup

    clock = [1000.0]
    stream = io.StringIO()
    logsetup.setup_logging(stream=stream, clock=lambda: clock[0])
    path = logsetup.log_to_file(tmp_path / "run" / "job.log")
    yield stream, path, clock
    logsetup.reset_logging()


def test_lm_evals_own_logging_goes_to_the_job_log_and_the_console_gets_one_line_per_evaluation(console):
    stream, path, _ = console
    for i in range(30):
        logging.getLogger("lm_eval.api.task").info("Building contexts for tiny_arith_mc on rank 0... %d", i)
        logging.getLogger("lm_eval.evaluator").warning("generation_kwargs: no until specified %d", i)
    logging.getLogger("orchestrator.evaluation.harness").info("benchmark evaluation took 1.20s: {'tiny': 0.5}")
    logging.getLogger("lm_eval.evaluator").error("the task failed")
    shown = stream.getvalue().splitlines()
    assert len(shown) == 2 and "benchmark evaluation took 1.20s" in shown[0] and "the task failed" in shown[1], shown
    kept = path.read_text()
    assert kept.count("Building contexts") == 30 and kept.count("no until specified") == 30
    assert "benchmark evaluation took" in kept


def test_checkpoint_lines_reach_the_console_at_most_once_a_minute_and_all_reach_the_log(console, tmp_path):
    stream, path, clock = console
    store = logging.getLogger("orchestrator.checkpoint.store")
    callback = logging.getLogger("orchestrator.checkpoint.callback")
    for second in range(0, 180, 3):  # a save every 3 s for three minutes: 60 saves, two lines each
        clock[0] = 1000.0 + second
        callback.info("checkpoint save at step %d stalled training for 0.05s", second)
        store.info("checkpoint ckpt-%d committed (step %d, 1.0 MB, 0.10s)", second, second)
    store.warning("checkpoint ckpt-x has no manifest (an upload was interrupted)")
    from orchestrator.checkpoint.store import announce_restore

    announce_restore(tmp_path / "ckpt-177", {"step": 177, "files": []})  # the next attempt's, within the minute
    shown = stream.getvalue().splitlines()
    assert len(shown) == 5, shown  # one a minute, every warning, the restore
    assert "step 0 stalled" in shown[0] and "step 60 stalled" in shown[1] and "step 120 stalled" in shown[2]
    assert "no manifest" in shown[3] and "restoring checkpoint ckpt-177" in shown[4]
    kept = path.read_text()
    assert kept.count("stalled training") == 60 and kept.count("committed (step") == 60


def test_without_a_terminal_the_trainers_log_dicts_go_to_the_job_log_not_the_console(console):
    from transformers.trainer_callback import PrinterCallback

    from orchestrator.config.schema import TrackingConfig
    from orchestrator.tracking.progress import attach_progress

    stream, path, _ = console

    class Trainer:
        def __init__(self):
            self.callbacks = [PrinterCallback]

        def remove_callback(self, cb):
            self.callbacks = [c for c in self.callbacks if c is not cb and not isinstance(c, cb)]

        def add_callback(self, cb):
            self.callbacks.append(cb)

    trainer = Trainer()
    progress = attach_progress(trainer, TrackingConfig(progress="lines"), main=True, dollars=lambda s, t: (0.01, 0.02))
    assert PrinterCallback not in trainer.callbacks and progress in trainer.callbacks
    state = type("S", (), {"global_step": 10, "max_steps": 60, "is_world_process_zero": True})()
    progress.on_log(None, state, None, logs={"loss": 1.2345, "learning_rate": 1e-4})
    progress.on_step_end(None, state, None)
    shown = stream.getvalue()
    assert "{'loss'" not in shown and "'learning_rate'" not in shown, shown
    assert "progress: step 10/60" in shown and "loss 1.234" in shown, shown
    assert "'loss': 1.2345" in path.read_text()


@pytest.mark.e2e
def test_a_job_with_benchmark_evaluations_keeps_its_console_short_and_its_log_whole(tmp_path):
    from tests.helpers import jobs

    overrides = [o for o in jobs.FAST if not o.startswith(("checkpoint.every", "train.max_steps"))] + [
        "run.name=quiet", f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}",
        "eval.tasks=[tiny_arith_mc]", "eval.every=2", "eval.limit=20", "checkpoint.every=off",
        "checkpoint.every_steps=5", "train.max_steps=20", "tracking.progress=lines"]
    done = jobs.run_job(overrides, tmp_path, timeout=600)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-4000:]
    whole = (tmp_path / "work" / "quiet" / "job.log").read_text()
    assert "lm_eval" not in console and "lm_eval" in whole, console[-4000:]
    # the harness's own progress bars too (tqdm on stderr, not logging)
    assert "Running loglikelihood requests" not in console and "Running loglikelihood requests" in whole
    evaluations = console.count("benchmark evaluation took")
    assert evaluations >= 2 and whole.count("benchmark evaluation took") == evaluations
    assert "{'loss'" not in console and "'loss':" in whole
    assert console.count("committed (step") <= 2 < whole.count("committed (step"), console[-4000:]
    assert "progress: step" in console and str(tmp_path / "work" / "quiet" / "job.log") in console


def test_a_bar_on_a_terminal_with_stdout_redirected_writes_no_log_dicts_to_stdout(console, monkeypatch):
    import io

    from orchestrator.tracking.progress import TrainingProgress

    _, path, _ = console
    stdout = io.StringIO()  # `orchestrator.launch ... > out.txt`: the bar on the terminal's stderr, stdout a file
    monkeypatch.setattr("sys.stdout", stdout)
    progress = TrainingProgress(lambda step, total: (0.01, 0.02), bar=True, every_s=30)
    state = type("S", (), {"global_step": 10, "max_steps": 60, "is_world_process_zero": True,
                           "is_local_process_zero": True})()
    progress.on_train_begin(None, state, None)
    progress.training_bar.fp = io.StringIO()
    progress.on_log(None, state, None, logs={"loss": 1.2345})
    progress.on_train_end(None, state, None)
    assert "loss" not in stdout.getvalue(), stdout.getvalue()
    assert "'loss': 1.2345" in path.read_text()


def test_with_progress_off_and_stdout_not_a_terminal_the_log_dicts_still_go_to_the_file(console, monkeypatch):
    import io

    from transformers.trainer_callback import PrinterCallback

    from orchestrator.config.schema import TrackingConfig
    from orchestrator.tracking.progress import attach_progress

    _, path, _ = console
    monkeypatch.setattr("sys.stdout", io.StringIO())

    class Trainer:
        callbacks = [PrinterCallback]

        def remove_callback(self, cb):
            self.callbacks = [c for c in self.callbacks if c is not cb]

        def add_callback(self, cb):
            self.callbacks = self.callbacks + [cb]

    trainer = Trainer()
    assert attach_progress(trainer, TrackingConfig(progress="off"), main=True, dollars=lambda s, t: (0, 0)) is None
    assert PrinterCallback not in trainer.callbacks
    state = type("S", (), {"global_step": 5, "is_world_process_zero": True})()
    for cb in trainer.callbacks:
        cb.on_log(None, state, None, logs={"loss": 2.5})
    assert "'loss': 2.5" in path.read_text()
