"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.helpers.fixtures_s3", "tests.helpers.fixtures_mlflow", "tests.helpers.references"]

import os

import pytest

# The suite never reaches the real Hugging Face hub: the launch check of a hub model (orchestrator/app/hub_access.py)
# and the revision pins ask HF_ENDPOINT, which a test that needs a hub sets to its stand-in (tests/helpers/fake_hub.py).
# Elsewhere nothing listens here, so they warn and go on, as they do without a network; with one, a test's made-up
# commit would be asked of huggingface.co (and refused). Set before any test imports huggingface_hub.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
# The plan never fetches current prices in a test (as HF_HUB_OFFLINE: the answer would move with the market);
# tests/unit/money/test_prices.py turns it off against its local fake of the clouds' price APIs.
os.environ.setdefault("ORCH_PRICES_OFFLINE", "1")

# The longest tests, longest first (seconds in a whole-suite run of stop 38, four workers on two cores,
# `--durations=25`): pytest-xdist hands tests out in collection order, so these start first, one per worker in
# turn, instead of being the run's tail. The ones that mostly wait (a start-up delay, an outage) lead: their
# waiting overlaps the others' work. xdist groups of several tests (Slurm's) are handed out before all of these.
SLOWEST_FIRST = [
    "test_sweep_budget_e2e.py::",  # 83 (8 s start-up delays)
    "test_storage_outage_e2e.py::",  # 73, 72 (30-s outages)
    "test_spend_e2e.py::",  # 58
    "test_slurm_multinode_e2e.py::",  # 64 (an xdist group of one test: it is handed out as any test is)
    "test_multinode_e2e.py::test_losing_either_node_restarts_the_world_bit_identical",  # ZeRO-2 51, FSDP 49, DDP 47
    "test_sweep_e2e.py::test_an_asha_sweep_killed_everywhere_decides_as_the_uninterrupted_one",  # 51
    "test_budget.py::test_a_real_overrun_gets_exactly_one_projection_alert_near_the_truth",  # 46
    "test_sweep_mlflow_e2e.py::test_a_sweep_is_one_parent_run_with_a_child_run_per_trial",  # 45
    "test_preemption_e2e.py::test_ten_random_interruptions_end_with_the_uninterrupted_weights",  # 45
    "test_tracking_e2e.py::",  # 44
    "test_bench_eval_job.py::",  # 43
    "test_spend_trust_e2e.py::",  # 43
    "test_recipes.py::test_default_job_improves_held_out_accuracy",  # 42
    "test_preemption_e2e.py::",  # 36
    "test_sweep_adopt_e2e.py::",  # 35
    "test_remote_inputs.py::test_rendered_skypilot_task_runs_and_recovers_in_copies_of_the_workdir_elsewhere",  # 31
    "test_recipes.py::test_a_job_loads_bitsandbytes_and_deepspeed_only_when_it_uses_them",  # 30
    "test_sweep_e2e.py::",  # 28
    "test_tampered_bucket.py::",  # 27
    "test_multinode_e2e.py::",  # 26
    "test_distributed.py::test_two_process_run_resumes_bit_identical",
    "test_bench_e2e.py::",
    "test_exact_resume.py::test_sigkilled_three_times_ends_bit_identical",
    "test_checkpoint_integrity.py::test_a_kill_during_a_multipart_upload_leaves_no_checkpoint_and_no_orphans",
    "test_grpo_resume_e2e.py::test_grpo_sigkilled_five_times_ends_bit_identical_with_no_reward_called_twice",
    # the inner loop's longest (`-n 2 -m "not e2e" --durations=15`, load 0.6 to 2.9): first there, after the above here
    "test_tiny_model.py::test_a_build_by_rank_one_of_a_distributed_job_holds_the_weights",  # 8.3
    "test_backends_hub_token.py::test_skypilot_passes_hf_token_as_a_secret_by_name",  # 4.1
    "test_cli_ls_logs_cancel.py::test_logs_follows_a_local_job_log_until_its_supervisor_ends",  # 4.1
    "test_multinode.py::test_every_rank_is_asked_whether_it_sees_rank_zeros_folder",  # 4.1
    "test_recipes.py::test_nf4_under_sft_and_dpo_trains_on_a_4bit_base",  # 3.8
]


def _rank(item) -> int:
    """``item``'s place in SLOWEST_FIRST, by its module's file name and test name (wherever the module sits)."""
    path, _, test = item.nodeid.partition("::")
    nodeid = f"{path.rpartition('/')[2]}::{test}"
    return next((i for i, prefix in enumerate(SLOWEST_FIRST) if nodeid.startswith(prefix)), len(SLOWEST_FIRST))


def pytest_collection_modifyitems(items):
    """A module named ``*_e2e.py`` is end-to-end as a whole (its fixtures run jobs), whatever its tests' own marks;
    the slowest tests are moved to the front (a stable sort: everything else keeps its order)."""
    for item in items:
        if item.module.__name__.endswith("_e2e"):
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_rank)


UNGROUPED: set[str] = set()  # tests whose xdist_group this run does not keep on one worker (``_check_groups``)


def _check_groups(session) -> None:
    """Find the tests that ``--dist loadgroup`` would not keep on their ``xdist_group``'s one worker.

    pytest-xdist 3.8 marks each grouped test by a suffix it writes into the test's node id, which pytest 9.2
    ignores (pytest-dev/pytest-xdist#1386): the run would go on, and the tests of one group (the one-node Slurm
    cluster's) run at once on different workers and fail by chance. Each such test fails instead, saying why."""
    if not getattr(session.config.option, "loadgroup", False):  # set in an xdist worker under --dist loadgroup
        return
    UNGROUPED.update(item.nodeid for item in session.items
                     if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid)


def pytest_runtest_setup(item):
    if item.nodeid in UNGROUPED:
        pytest.fail(f"--dist loadgroup does not keep this test's xdist_group on one worker with pytest "
                    f"{pytest.__version__} (pytest-dev/pytest-xdist#1386): install the versions in constraints.txt "
                    "(bash scripts/setup.sh)", pytrace=False)


def pytest_collection_finish(session):
    """Jobs are forked from a warm interpreter (``tests/helpers/zygote.py``) in a run with end-to-end tests, which
    launch a few hundred; not in the inner loop, where starting it would cost each worker the stack's import.
    It starts here, importing while the first tests start their servers. ``ORCH_TEST_ZYGOTE=0`` starts every job
    fresh. First, the xdist groups are checked (``_check_groups``)."""
    _check_groups(session)
    if any(item.get_closest_marker("e2e") for item in session.items):
        os.environ.setdefault("ORCH_TEST_ZYGOTE", "1")
        from tests.helpers import jobs

        warm = jobs.zygote()
        if warm is not None:
            warm.launch()


@pytest.fixture(autouse=True)
def _root_logging_as_it_was():
    """A command run in-process (``orchestrator eval``'s ``logging.basicConfig``, the launcher's log set-up) leaves
    the root logger a handler on that test's captured stderr, closed once the test ends; a later test's log line
    would then print "--- Logging error ---" with a traceback into its own output. Each test gets the root logger
    back as it found it."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
