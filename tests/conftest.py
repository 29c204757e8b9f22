"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.helpers.fixtures_s3", "tests.helpers.fixtures_mlflow", "tests.helpers.references"]

import pytest

# The longest tests, longest first (seconds in CI's last run, issue 19): pytest-xdist hands tests out in
# collection order, so these start first, one per worker in turn, instead of being the run's tail.
SLOWEST_FIRST = [
    "test_distributed.py::test_two_process_run_resumes_bit_identical",  # ZeRO-2 230, DDP
    "test_preemption_e2e.py::test_ten_random_interruptions_end_with_the_uninterrupted_weights",  # 211
    "test_datacache.py::test_jobs_on_a_bad_then_unsigned_cache_entry_complete_and_replace_it",  # 183
    "test_exact_resume.py::test_sigkilled_three_times_ends_bit_identical",  # 159, 128, 114, 103
    "test_remote_inputs.py::test_rendered_skypilot_task_runs_and_recovers_in_copies_of_the_workdir_elsewhere",
    "test_storage_outage_e2e.py::",  # 117, 100
    "test_datacache.py::test_a_dpo_job_whose_stored_reference_log_probs_turned_nan_computes_them_again",  # 112
    "test_bench_eval_job.py::",  # 99
    "test_slurm_e2e.py::",  # 92 (one xdist group)
    "test_tracking_e2e.py::",  # 91
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
