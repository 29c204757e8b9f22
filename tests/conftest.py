"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.helpers.fixtures_s3", "tests.helpers.fixtures_mlflow", "tests.helpers.references"]

import os

import pytest

# The longest tests, longest first (seconds in the last whole-suite run, stop 34's: `--durations=0`): pytest-xdist
# hands tests out in collection order, so these start first, one per worker in turn, instead of being the run's tail.
SLOWEST_FIRST = [
    "test_sweep_mlflow_e2e.py::test_a_sweep_is_one_parent_run_with_a_child_run_per_trial",  # 198
    "test_multinode_e2e.py::test_losing_either_node_restarts_the_world_bit_identical",  # ZeRO-2 120, FSDP 118, DDP 117
    "test_slurm_multinode_e2e.py::",  # 114 (one xdist group)
    "test_storage_outage_e2e.py::",  # 91, 87
    "test_distributed.py::test_two_process_run_resumes_bit_identical",  # ZeRO-2 91, DDP 68
    "test_preemption_e2e.py::test_ten_random_interruptions_end_with_the_uninterrupted_weights",  # 90
    "test_sweep_e2e.py::test_an_asha_sweep_killed_everywhere_decides_as_the_uninterrupted_one",  # 84
    "test_tampered_bucket.py::",  # 79, 53
    "test_multinode_e2e.py::",  # 77, 64, 57
    "test_slurm_e2e.py::",  # 64, 36 and the rest of the "slurm" group
    "test_bench_e2e.py::",  # 63
    "test_spend_e2e.py::",  # 62
    "test_recipes.py::test_default_job_improves_held_out_accuracy",  # 57
    "test_spend_trust_e2e.py::",  # 56
    "test_bench_eval_job.py::",  # 54
    "test_tracking_e2e.py::",  # 54, 34
    "test_preemption_e2e.py::",  # 49
    "test_datacache.py::test_jobs_on_a_bad_then_unsigned_cache_entry_complete_and_replace_it",  # 48
    "test_exact_resume.py::test_sigkilled_three_times_ends_bit_identical",  # 48, 38, 37, 35
    "test_budget.py::test_a_real_overrun_gets_exactly_one_projection_alert_near_the_truth",  # 46
    "test_checkpoint_integrity.py::test_a_kill_during_a_multipart_upload_leaves_no_checkpoint_and_no_orphans",  # 43
    "test_grpo_resume_e2e.py::test_grpo_sigkilled_five_times_ends_bit_identical_with_no_reward_called_twice",  # 43
]


def _rank(item) -> int:
    nodeid = item.nodeid.rpartition("tests/")[2]
    return next((i for i, prefix in enumerate(SLOWEST_FIRST) if nodeid.startswith(prefix)), len(SLOWEST_FIRST))


def pytest_collection_modifyitems(items):
    """A module named ``*_e2e.py`` is end-to-end as a whole (its fixtures run jobs), whatever its tests' own marks;
    the slowest tests are moved to the front (a stable sort: everything else keeps its order)."""
    for item in items:
        if item.module.__name__.endswith("_e2e"):
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_rank)


def pytest_collection_finish(session):
    """Jobs are forked from a warm interpreter (``tests/helpers/zygote.py``) in a run with end-to-end tests, which
    launch a few hundred; not in the inner loop, where starting it would cost each worker the stack's import.
    It starts here, importing while the first tests start their servers. ``ORCH_TEST_ZYGOTE=0`` starts every job
    fresh."""
    if any(item.get_closest_marker("e2e") for item in session.items):
        os.environ.setdefault("ORCH_TEST_ZYGOTE", "1")
        from tests.helpers import jobs

        warm = jobs.zygote()
        if warm is not None:
            warm.launch()
