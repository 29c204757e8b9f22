"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.helpers.fixtures_s3", "tests.helpers.fixtures_mlflow", "tests.helpers.references"]

import pytest

# The longest tests, longest first (seconds in the last whole-suite run, stop 31's: `--durations=30`): pytest-xdist
# hands tests out in collection order, so these start first, one per worker in turn, instead of being the run's tail.
SLOWEST_FIRST = [
    "test_sweep_mlflow_e2e.py::test_a_sweep_is_one_parent_run_with_a_child_run_per_trial",  # 172
    "test_preemption_e2e.py::test_ten_random_interruptions_end_with_the_uninterrupted_weights",  # 161
    "test_multinode_e2e.py::test_losing_either_node_restarts_the_world_bit_identical",  # ZeRO-2 154, FSDP 137, DDP 125
    "test_sweep_e2e.py::test_an_asha_sweep_killed_everywhere_decides_as_the_uninterrupted_one",  # 142
    "test_slurm_multinode_e2e.py::",  # 129 (one xdist group)
    "test_slurm_e2e.py::",  # 85 and the rest of the "slurm" group
    "test_grpo_resume_e2e.py::test_grpo_sigkilled_five_times_ends_bit_identical_with_no_reward_called_twice",  # 97
    "test_storage_outage_e2e.py::",  # 89, 85
    "test_exact_resume.py::test_sigkilled_three_times_ends_bit_identical",  # 73, 68, 60, 54
    "test_multinode_e2e.py::",  # 73, 68, 68, 67, 67
    "test_distributed.py::test_two_process_run_resumes_bit_identical",  # ZeRO-2 70, DDP 55
    "test_tampered_bucket.py::",  # 63, 50
    "test_spend_e2e.py::",  # 62
    "test_sweep_budget_e2e.py::",  # 59
    "test_recipes.py::test_default_job_improves_held_out_accuracy",  # 59
    "test_spend_trust_e2e.py::",  # 58
    "test_bench_e2e.py::",  # 58
    "test_tracking_e2e.py::",  # 52
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
