"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.helpers.fixtures_s3", "tests.helpers.fixtures_mlflow", "tests.helpers.references"]

import pytest

# The longest tests, longest first (seconds in the last whole-suite run, docs/measured.md, and issue 19's CI run;
# the bad-then-unsigned cache test halved since, 60 s -> 30 s alone): pytest-xdist hands tests out in collection
# order, so these start first, one per worker in turn, instead of being the run's tail.
SLOWEST_FIRST = [
    "test_distributed.py::test_two_process_run_resumes_bit_identical",  # ZeRO-2 232, DDP
    "test_multinode_e2e.py::test_losing_either_node_restarts_the_world_bit_identical",  # ZeRO-2 224, DDP
    "test_preemption_e2e.py::test_ten_random_interruptions_end_with_the_uninterrupted_weights",  # 211
    "test_sweep_e2e.py::test_an_asha_sweep_killed_everywhere_decides_as_the_uninterrupted_one",  # 160
    "test_exact_resume.py::test_sigkilled_three_times_ends_bit_identical",  # 159, 128, 114, 103
    "test_slurm_multinode_e2e.py::",  # 145 (one xdist group)
    "test_slurm_e2e.py::",  # 126 (one xdist group)
    "test_remote_inputs.py::test_rendered_skypilot_task_runs_and_recovers_in_copies_of_the_workdir_elsewhere",
    "test_storage_outage_e2e.py::",  # 117, 100
    "test_datacache.py::test_a_dpo_job_whose_stored_reference_log_probs_turned_nan_computes_them_again",  # 112
    "test_bench_eval_job.py::",  # 99
    "test_tracking_e2e.py::",  # 91
    "test_datacache.py::test_jobs_on_a_bad_then_unsigned_cache_entry_complete_and_replace_it",  # 149 before, ~half now
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
