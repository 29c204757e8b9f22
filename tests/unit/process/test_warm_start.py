"""Attempts forked from the supervisor (``orchestrator.process.warm_start``): when a fork is safe, and what a forked attempt is."""
from __future__ import annotations

import random
import sys
import threading

import pytest

from orchestrator.process import forked_ranks, warm_start
from orchestrator.app.compose import compose_config
from orchestrator.process.distributed import worker_argv
from tests.helpers import jobs

CLEAN_MAPS = ("7f00-7f10 r-xp 00000000 08:01 1 /usr/lib/python3.11/lib-dynload/_json.so\n"
              "7f20-7f30 r-xp 00000000 08:01 2 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so\n"
              "7f40-7f50 rw-p 00000000 00:00 0 \n")


def test_a_second_thread_or_a_loaded_gpu_driver_makes_a_fork_unsafe(tmp_path):
    clean = tmp_path / "maps"
    clean.write_text(CLEAN_MAPS)
    only_main = [threading.main_thread()]  # this test process may hold other tests' threads (tqdm's monitor)
    assert warm_start.unsafe_reason(clean, only_main) is None
    driver = tmp_path / "maps-cuda"
    driver.write_text(CLEAN_MAPS + "7f60-7f70 r-xp 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n")
    assert warm_start.unsafe_reason(driver, only_main) == "the GPU driver is loaded in the supervisor"
    assert warm_start.unsafe_reason(tmp_path / "missing", only_main) == "the GPU driver is loaded in the supervisor"
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="uploader")
    thread.start()
    try:
        reason = warm_start.unsafe_reason(clean)  # the live threads: the one started here among them
        assert reason.startswith("the supervisor runs threads (") and "uploader" in reason
    finally:
        stop.set()
        thread.join()


def test_only_the_worker_command_is_forked_and_only_where_fork_attempts_is_on():
    assert warm_start.is_worker_command(worker_argv(["run.name=x"]))
    assert not warm_start.is_worker_command([sys.executable, "-c", "print(1)"])
    assert not warm_start.is_worker_command(["/other/python", "-m", "orchestrator.worker"])
    for cfg in (compose_config(["requeue.fork_attempts=false"]),
                compose_config(["requeue.fork_attempts=false", "distributed=ddp", "distributed.processes_per_node=2"])):
        refused, inherited = warm_start.prepare(cfg)
        assert refused == "requeue.fork_attempts=false" and inherited.cpu_s == 0.0  # nothing was imported for it
        assert forked_ranks.refusal(cfg) == "requeue.fork_attempts=false"  # the ranks: the torchrun command


@pytest.mark.e2e
def test_requeued_attempts_are_forked_workers_that_skip_the_import_and_resume_bit_identical(tmp_path, references):
    """A job whose worker is SIGKILLed twice: every attempt is forked from the supervisor (the ledger's restart split
    says so), each under the worker's own command line (the kill finds it by that), the first carries the stack's
    import it inherited, the requeued ones start without it, and the weights are the uninterrupted run's."""
    storage = jobs.Storage(str(tmp_path / "runs"))
    overrides = [*jobs.FAST, "train.max_steps=60", *storage.overrides(), "run.name=forked",
                 f"run.work_dir={tmp_path / 'work'}"]
    proc = jobs.start_job(overrides, tmp_path, fresh=True)  # the first attempt's import is what it measures
    rng = random.Random(7)
    for _ in range(2):
        jobs.interrupt_worker(proc, storage, "forked", rng)
    assert proc.wait(600) == 0, (tmp_path / "job.log").read_text()[-3000:]
    attempts = jobs.ledger(storage, "forked")["attempts"]
    splits = [a["extra"]["restart"] for a in attempts]
    assert len(attempts) == 3 and [a["exit_class"] for a in attempts] == ["vanished", "vanished", "completed"]
    assert [s["forked"] for s in splits] == [1.0, 1.0, 1.0]
    first, *requeued = [s["cpu_s"] for s in splits]
    assert all(cpu < 0.6 * first for cpu in requeued), splits  # the import is paid once, by the first attempt
    assert "attempts are forked from this supervisor" in (tmp_path / "job.log").read_text()
    assert jobs.final_digest(storage, "forked") == references.digest(overrides)


def test_a_forked_childs_title_fills_the_argv_memory_it_was_forked_with(tmp_path):
    """A title shorter than the parent's argv memory would read back as one argument followed by empty ones (no
    ``run.name=...`` among a process's arguments for ``ps``, psutil or a relaunched sweep driver)."""
    stat = tmp_path / "stat"
    fields = ["S"] + ["0"] * 44 + ["1000", "1783"] + ["0"] * 5  # arg_start, arg_end: fields 48 and 49
    stat.write_text("4242 (python -m x) " + " ".join(fields) + "\n")
    title = warm_start.process_title([sys.executable, "-m", "orchestrator.launch", "run.name=sw-t0"], stat)
    assert len(title) == 783 and title.split() == [sys.executable, "-m", "orchestrator.launch", "run.name=sw-t0"]
    assert warm_start.process_title(["a", "b"], tmp_path / "missing") == "a b"


def test_a_forked_agents_rendezvous_names_its_events_as_torch_does_without_reading_the_stack(monkeypatch):
    """torch names each rendezvous event by the method two frames up, through ``inspect.stack()`` (~95 CPU-ms per
    event in an agent forked with the stack imported); the forked agent's name is the same, read from the frame."""
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from orchestrator.process.forked_ranks import cheap_rendezvous_event_names

    class Executor:  # as torch's _record is called: from a method of the executor, which names its caller
        def _record(self):
            return dynamic_rendezvous.get_method_name()

        def _keep_alive(self):
            return self._record()

    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    torch_names = Executor()._keep_alive()
    assert torch_names == "_keep_alive"
    cheap_rendezvous_event_names()

    def no_stack(*_args, **_kwargs):
        raise AssertionError("inspect.stack() read")

    monkeypatch.setattr(inspect, "stack", no_stack)
    assert Executor()._keep_alive() == torch_names
    assert dynamic_rendezvous.get_method_name(depth=10_000) == "no_method_name"
