"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.helpers.fixtures_s3", "tests.helpers.fixtures_mlflow", "tests.helpers.references"]

import os

import pytest

# The longest tests, longest first (seconds in the last whole-suite run, stop 36's fresh clone, `--durations=25`):
# pytest-xdist hands tests out in collection order, so these start first, one per worker in turn, instead of being
# the run's tail.
SLOWEST_FIRST = [
    "test_slurm_multinode_e2e.py::",  # 99 (one xdist group with the rest of "slurm")
    "test_storage_outage_e2e.py::",  # 77, 75
    "test_multinode_e2e.py::test_losing_either_node_restarts_the_world_bit_identical",  # ZeRO-2 63, FSDP 52, DDP 49
    "test_spend_e2e.py::",  # 59
    "test_slurm_e2e.py::",  # 58, 27 and the rest of the "slurm" group
    "test_preemption_e2e.py::test_ten_random_interruptions_end_with_the_uninterrupted_weights",  # 57
    "test_sweep_budget_e2e.py::",  # 56
    "test_sweep_mlflow_e2e.py::test_a_sweep_is_one_parent_run_with_a_child_run_per_trial",  # 51
    "test_budget.py::test_a_real_overrun_gets_exactly_one_projection_alert_near_the_truth",  # 46
    "test_tracking_e2e.py::",  # 45, 26
    "test_spend_trust_e2e.py::",  # 44
    "test_sweep_e2e.py::test_an_asha_sweep_killed_everywhere_decides_as_the_uninterrupted_one",  # 42
    "test_recipes.py::test_default_job_improves_held_out_accuracy",  # 41
    "test_bench_eval_job.py::",  # 40
    "test_preemption_e2e.py::",  # 39
    "test_bench_e2e.py::",  # 33
    "test_tampered_bucket.py::",  # 30
    "test_multinode_e2e.py::",  # 29 and less
    "test_datacache.py::test_a_dpo_job_whose_stored_reference_log_probs_turned_nan_computes_them_again",  # 27
    "test_warm_start.py::test_requeued_attempts_are_forked_workers_that_skip_the_import_and_resume_bit_identical",  # 26
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
    ``ORCH_TEST_ZYGOTE=0`` starts every job fresh."""
    if any(item.get_closest_marker("e2e") for item in session.items):
        os.environ.setdefault("ORCH_TEST_ZYGOTE", "1")
