"""What a sweep takes from its record in the bucket (docs/trust.md, "The sweep record"): a trial's command carries
the sweep's own values, a trial whose stored values are not those is refused and the others go on, the record is
signed with ORCH_MANIFEST_HMAC_KEY, a swept secret is stored redacted, and what the driver reads of a trial's
ledger is checked. Real records in a local store; the driver launches a shim that writes its command line."""
from __future__ import annotations

import json
import sys

import pytest

from orchestrator import launch
from orchestrator.records.sweep_record import TrialEntry
from orchestrator.sweep import decide, trust
from orchestrator.sweep.space import SearchSpace

SPACE = SearchSpace.from_specs({"train.learning_rate": ["choice", [1e-4, 2e-4, 3e-4, 4e-4]],
                                "recipe.lora_r": ["interval", 4, 64, False]})
RANDOM = {"sampler": "random", "seed": 5, "pruner": "none", "max_steps": 8, "direction": "minimize"}


def stored(number: int, params: dict, **fields) -> TrialEntry:
    return TrialEntry(**dict(dict(number=number, run_name=f"s-t{number}", params=params, rung=0, status="running",
                                  values={}, launches=0), **fields))


def test_a_trials_parameters_are_the_ones_its_seeded_sampler_gives_it():
    own = decide.sample(SPACE, RANDOM, [], 3)
    assert trust.launch_params(SPACE, RANDOM, stored(3, own), since=0) == own
    for bad, needle in [
        (dict(own, **{"compute.price_per_hour": 0.0}), "keys outside the sweep's space (compute.price_per_hour)"),
        ({"recipe.lora_r": own["recipe.lora_r"]}, "lack some of it (train.learning_rate)"),
        (dict(own, **{"recipe.lora_r": own["recipe.lora_r"] % 60 + 4}), "not what the sweep's seeded sampler gives"),
    ]:
        with pytest.raises(trust.TrialRefused) as err:
            trust.launch_params(SPACE, RANDOM, stored(3, bad), since=0)
        assert needle in str(err.value)


def test_where_the_sampler_cannot_rederive_a_value_it_must_lie_in_the_space():
    tpe = dict(RANDOM, sampler="tpe")
    ok = {"train.learning_rate": 3e-4, "recipe.lora_r": 9}
    assert trust.launch_params(SPACE, tpe, stored(0, ok), since=0) == ok
    for key, value in [("train.learning_rate", 5e-4), ("train.learning_rate", "3e-4"), ("recipe.lora_r", 65),
                       ("recipe.lora_r", 9.5), ("recipe.lora_r", True)]:
        with pytest.raises(trust.TrialRefused, match="outside the sweep's space"):
            trust.launch_params(SPACE, tpe, stored(0, dict(ok, **{key: value})), since=0)
    # a trial sampled before sweep.allow_changes changed the space (number < since): in the space is enough
    assert trust.launch_params(SPACE, RANDOM, stored(0, ok), since=1) == ok


def test_a_narrowed_choice_does_not_crash_the_sampler_and_the_old_trial_is_not_reused():
    narrowed = SearchSpace.from_specs({"train.learning_rate": ["choice", [1e-4, 2e-4]]})
    old = stored(0, {"train.learning_rate": 4e-4}, status="paused", values={0: 0.5})
    assert decide.sample(narrowed, RANDOM, [old], 1)["train.learning_rate"] in (1e-4, 2e-4)  # used to raise
    with pytest.raises(trust.TrialRefused, match=r"train.learning_rate=0.0004 is outside the sweep's space"):
        trust.launch_params(narrowed, RANDOM, old, since=1)


def test_a_swept_secret_is_stored_redacted_and_launched_with_its_value(store):
    from orchestrator.sweep.state import SweepState

    hooks = ["https://hooks.slack.com/services/T0/B0/firstSECRET", "https://hooks.slack.com/services/T0/B0/otherSECRET"]
    space = SearchSpace.from_specs({"budget.webhook_url": ["choice", hooks]})
    state = SweepState(store, "s")
    state.open(space=space.to_json(), fixed=[], settings=RANDOM, allow_changes=False)
    state.new_trial(lambda trials: decide.sample(space, RANDOM, trials, len(trials)))
    raw = store.get_bytes(state.key).decode()
    assert "SECRET" not in raw
    trial = state.load().trials[0]
    assert trust.launch_params(space, RANDOM, trial, since=0) == decide.sample(space, RANDOM, [], 0)
    # a relaunch with the same space is no change; one with another secret is (the redacted forms differ)
    state.open(space=space.to_json(), fixed=[], settings=RANDOM, allow_changes=False)


def test_a_signed_record_resumes_and_an_edited_or_unsigned_one_is_one_error_naming_it(store, monkeypatch):
    from orchestrator.sweep.state import SweepState, SweepStateCorrupt

    space = {"train.learning_rate": ["choice", [1e-4, 2e-4]]}
    unsigned = SweepState(store, "plain")
    unsigned.open(space=space, fixed=[], settings=RANDOM, allow_changes=False)
    monkeypatch.setenv("ORCH_MANIFEST_HMAC_KEY", "k" * 32)
    state = SweepState(store, "s")
    state.open(space=space, fixed=[], settings=RANDOM, allow_changes=False)
    state.new_trial({"train.learning_rate": 1e-4})
    assert state.load().trials[0].params == {"train.learning_rate": 1e-4}  # signed, checked, resumed
    doc = json.loads(store.get_bytes(state.key))
    doc["trials"][0]["params"]["compute.price_per_hour"] = 0.0
    store.put_bytes(state.key, json.dumps(doc).encode())
    for target, needle in [(state, "signature does not match"), (unsigned, "is not signed")]:
        with pytest.raises(SweepStateCorrupt) as err:
            target.load()
        assert needle in str(err.value) and target.uri in str(err.value) and err.value.exit_code == 4


def test_a_record_copied_under_another_name_is_refused(store):
    from orchestrator.sweep.state import SweepState, SweepStateCorrupt

    state = SweepState(store, "victim")
    state.open(space={"train.learning_rate": ["choice", [1e-4]]}, fixed=[], settings=RANDOM, allow_changes=False)
    state.new_trial({"train.learning_rate": 1e-4})
    store.put_bytes("evil/sweep.json", store.get_bytes(state.key))
    with pytest.raises(SweepStateCorrupt, match="names the sweep 'victim', not 'evil'"):
        SweepState(store, "evil").load()
    doc = json.loads(store.get_bytes(state.key))
    doc["name"] = "evil"
    store.put_bytes("evil/sweep.json", json.dumps(doc).encode())
    with pytest.raises(SweepStateCorrupt, match="run_name is 'victim-t0', not 'evil-t0'"):
        SweepState(store, "evil").load()


SHIM = """#!/bin/sh
echo "$@" >> {out}
"""


def test_bad_trials_are_refused_one_by_one_and_the_sweep_goes_on_with_its_own_values(tmp_path, caplog):
    """t0's params name a key outside the space, t1's ledger is a JSON list, t2 is at a rung past its schedule, t3's
    ledger says a start-up took 1e300 s: each is refused with a message (they used to raise on every rerun, or end
    the sweep at once, exit 0, silently), and t4 is sampled and launched with the sweep's own values."""
    from orchestrator.sweep.driver import Driver
    from orchestrator.sweep.plan import plan_sweep

    grid = [1e-4, 2e-4, 3e-4, 4e-4, 5e-4]
    plan = plan_sweep(["-m", f"train.learning_rate={','.join(map(str, grid))}", "sweep.budget_usd=1",
                       "sweep.max_parallel=5", f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}",
                       "tracking.enabled=false"], launch.compose_for_launch)
    for _ in range(4):
        plan.state.new_trial(lambda trials: decide.sample(plan.space, plan.settings, trials, len(trials)))

    def tamper(d: dict) -> None:
        d["trials"][0]["params"]["model.trust_remote_code"] = True
        d["trials"][0]["params"]["\x1b[2Jdata.path"] = "/etc"  # an escape sequence for the user's terminal
        d["trials"][2]["rung"] = 7

    plan.state.update(tamper)
    plan.store.put_bytes("default-t1/ledger.json", b"[1, 2]")
    attempt = {"fence": 1, "exit_class": "completed", "extra": {"restart": {"total_s": 1e300}}}
    plan.store.put_bytes("default-t3/ledger.json", json.dumps({"status": "running", "attempts": [attempt]}).encode())
    shim = tmp_path / "python"
    shim.write_text(SHIM.format(out=tmp_path / "argv.txt"))
    shim.chmod(0o755)
    driver = Driver(plan, poll_seconds=0.05, python=str(shim))
    doc = driver._fill(plan.state.load())
    for proc in driver.procs.values():
        proc.wait(30)
    status = [t.status for t in doc.trials]
    assert status == ["failed", "failed", "failed", "failed", "running"], status
    refused = [t.refused or "" for t in doc.trials]
    assert "model.trust_remote_code" in refused[0] and "is a JSON list" in refused[1]
    assert "past its schedule" in refused[2] and "1e+300 s, more than a week" in refused[3]
    assert caplog.text.count("is refused") == 4 and "\x1b" not in caplog.text + refused[0]
    from orchestrator.sweep.cli import format_sweep

    shown = format_sweep(plan.state.load(), spent={})  # orchestrator status: why each was refused
    assert "refused: its ledger" in shown and "refused: its rung is 7, past its schedule" in shown
    assert "\x1b" not in shown
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    (own,) = set(grid) - {t.params["train.learning_rate"] for t in doc.trials[:4]}  # the grid's last point
    assert len(argv) == 1 and "run.name=default-t4" in argv[0] and f"train.learning_rate={own!r}" in argv[0]
    assert "trust_remote_code" not in argv[0] and "restart_seconds" not in argv[0]


def test_a_forged_launcher_record_is_not_waited_on(tmp_path):
    """A record naming a process of this host that merely mentions the trial, or a launcher of it older than the
    launch the record announces, is not adopted (the driver would wait on a stranger's process); the launcher the
    launch started is."""
    import subprocess
    import time

    from orchestrator.records.sweep_record import Launcher
    from orchestrator.sweep import backends

    def process(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])

    stranger, launcher = process("run.name=s-t0"), process("orchestrator.launch", "run.name=s-t0")
    try:
        time.sleep(0.3)
        now = time.time()
        for proc, launched_at, adopted in [(stranger, now - 30, False), (launcher, now + 30, False),
                                           (launcher, now - 30, True)]:
            who = backends.launcher_identity(proc.pid)
            trial = stored(0, {}, launcher=Launcher(who["host"], who["pid"], who["started"]), launched_at=launched_at)
            assert (backends.alive_launcher(trial) is not None) == adopted, (proc.args, launched_at)
    finally:
        for proc in (stranger, launcher):
            proc.kill()
            proc.wait()
