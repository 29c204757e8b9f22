"""Inputs and money (issue 20): numbers that are not numbers, a deadline already past, and what a render copies
from storage. Each launch here is refused before anything trains: exit 4, one line naming the key and the fix."""
from __future__ import annotations

import pytest

from tests.helpers import jobs
from tests.helpers.launcher import launch

FAST = [o for o in jobs.FAST if not o.startswith("requeue.")] + ["requeue.max_failures=1"]


def _refused(args: list[str], tmp_path, needles: list[str], monkeypatch, capsys) -> str:
    """The launcher's checks in-process (``tests/helpers/launcher.py``): refused, exit 4, one line, nothing written."""
    done = launch(FAST + [f"storage.uri={tmp_path / 'runs'}", "run.name=refused", *args], tmp_path, monkeypatch, capsys)
    return jobs.assert_refused_at_launch(done, needles, tmp_path / "runs")


@pytest.mark.parametrize("args,needles", [
    (["budget.max_usd=nan"], ["budget.max_usd=nan", "finite number"]),
    (["budget.monthly_max_usd=nan"], ["budget.monthly_max_usd=nan", "finite number"]),
    (["compute.price_per_hour=nan"], ["compute.price_per_hour=nan", "finite number"]),
    (["compute.price_per_hour=-1"], ["compute.price_per_hour=-1", "at least 0", "compute.price_per_hour=2.5"]),
    (["compute.preemptions_per_hour=nan"], ["compute.preemptions_per_hour=nan", "finite number"]),
    (["compute.restart_seconds=nan"], ["compute.restart_seconds=nan", "finite number"]),
    (["budget.alert_thresholds=[1.5,-1,nan]"], ["budget.alert_thresholds[2]=nan", "finite number"]),
    (["budget.alert_thresholds=[1.5,-1]"], ["budget.alert_thresholds[0]=1.5", "budget.alert_thresholds[1]=-1",
                                            "at most 1", "budget.alert_thresholds=[0.5,0.8,1.0]"]),
    (["recipe=dpo", "recipe.dpo_beta=-inf"], ["recipe.dpo_beta=-inf", "finite number"]),
], ids=lambda v: " ".join(v) if "=" in v[0] else "")
def test_a_float_key_that_is_not_a_finite_number_in_range_is_refused_at_launch(args, needles, tmp_path, monkeypatch,
                                                                              capsys):
    _refused(args, tmp_path, needles, monkeypatch, capsys)


def test_a_mix_weight_of_infinity_is_refused_naming_the_entry(tmp_path, monkeypatch, capsys):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"prompt": "1+1=", "completion": "2"}\n' * 20)
    mix = f"data.mix=[{{path: {tmp_path / 'a.jsonl'}, weight: 1}}, {{path: {tmp_path / 'b.jsonl'}, weight: inf}}]"
    _refused(["data=mix", mix], tmp_path, ["data.mix[1].weight=inf", "finite number"], monkeypatch, capsys)


TRACE = '{"metadata": {"gap_seconds": GAP}, "data": [0, 0, 0, 1, 0, 0, 1]}'


@pytest.mark.parametrize("args,gap,needles", [
    (["--job-hours", "nan"], "60", ["--job-hours nan", "finite number"]),
    (["--job-hours", "1", "--deadline-hours", "inf"], "60", ["--deadline-hours inf", "finite number"]),
    (["--job-hours", "1", "--min-every", "2h", "--max-every", "1m"], "60", ["--min-every 2h", "--max-every 1m",
                                                                           "--min-every 1m --max-every 1h"]),
    (["--job-hours", "1", "--spot-price", "-1"], "60", ["--spot-price -1", "at least 0"]),
    (["--job-hours", "1", "--restart-minutes", "-5"], "60", ["--restart-minutes -5", "at least 0"]),
    (["--job-hours", "1"], "NaN", ["a.json", "gap_seconds must be a finite number"]),
], ids=["job-hours-nan", "deadline-inf", "min-above-max", "negative-price", "negative-restart", "nan-in-trace"])
def test_simulate_refuses_a_number_that_is_not_one_naming_the_option(args, gap, needles, tmp_path, capsys):
    """``orchestrator simulate``'s own ``main``, in-process: exit 2 and one line naming the option."""
    from orchestrator.cli.main import main

    (tmp_path / "a.json").write_text(TRACE.replace("GAP", gap))
    capsys.readouterr()
    try:
        code = main(["simulate", "--traces", str(tmp_path), "--windows", "2", *args])
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    assert code == 2, (code, out[-1000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


PAST = "2020-01-01T00:00:00Z"


def test_a_deadline_already_past_is_refused_at_a_fresh_launch(tmp_path, monkeypatch, capsys):
    _refused([f"run.deadline={PAST}", "compute.spot=true"], tmp_path,
             [f"run.deadline={PAST} passed", "h ago", "run.deadline=52h"], monkeypatch, capsys)


@pytest.mark.e2e
def test_a_relaunch_whose_deadline_passed_while_it_ran_says_so_and_finishes(tmp_path):
    """The job ran (an attempt in its ledger, then the machine vanished); relaunched after its deadline, it is
    not refused: it says the deadline passed and runs to the end."""
    storage, run = jobs.Storage(str(tmp_path / "runs")), "late-relaunch"
    first = jobs.start_job(jobs.FAST + storage.overrides() + [f"run.name={run}"], tmp_path)
    try:
        jobs.wait_for_new_checkpoint(storage, run, first, 0)
    finally:
        jobs.kill_group(first)
    done = jobs.run_job(jobs.FAST + storage.overrides() + [f"run.name={run}", f"run.deadline={PAST}",
                                                           "compute.spot=true"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"run.deadline={PAST} passed" in done.stderr and "runs on-demand" in done.stderr, done.stderr[-3000:]
    assert jobs.ledger(storage, run)["status"] == "completed"


POISONED = "behind the line\r\x00#SBATCH --wrap=x\x1b[2J\u2028rm -rf ~\u202e by 3.0 h\n"


@pytest.mark.e2e
@pytest.mark.parametrize("backend,extra", [
    ("slurm", ["backend.partition=spot", "backend.on_demand_partition=ondemand"]),
    ("skypilot", ["backend.image=img:1"]),
    ("kubernetes", ["backend.image=img:1"]),
])
def test_a_capacity_reason_from_storage_reaches_the_rendered_text_without_control_characters(
        backend, extra, s3_server, s3_bucket, tmp_path):
    """The ledger is storage, and storage is untrusted: a capacity reason with CR, NUL, an escape, a line
    separator and a bidi override is rendered as one printable comment line by every backend's dry run."""
    from orchestrator.records.ledger import Ledger

    storage, run = jobs.Storage(s3_bucket, s3_server.endpoint_url), "poisoned-reason"
    ledger = Ledger(storage.store(), run)
    ledger.begin_attempt(host="h", pid=1, instance_type="cpu", gpu_type="none", gpus=0, spot=True, checkpoint_step=0)
    ledger.record_capacity({"capacity": "on_demand", "previous": "spot", "reason": POISONED, "locked": False,
                            "at_risk": False, "action": "the next submission", "step": 10})
    done = jobs.run_job(FAST + storage.overrides() + [f"run.name={run}", f"backend={backend}", "backend.dry_run=true",
                                                      "compute.spot=true", "run.deadline=52h", *extra], tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    [line] = [ln for ln in done.stdout.split("\n") if ln.startswith("# capacity:")]
    # the ledger's decode (records/fields.py) shows each control character as "?": one printable line
    assert "on-demand" in line and "behind the line??#SBATCH --wrap=x?[2J rm -rf ~ by 3.0 h?" in line, repr(line)
    for bad in ("\r", "\x00", "\x1b", "\u2028", "\u202e", "\x85"):
        assert bad not in done.stdout, (bad, repr(line))
