"""The sweep's record in the store: created once, numbering by conditional writes, a changed space refused,
every read validated (a corrupt record is one clear error, never a traceback)."""
from __future__ import annotations

import json
import threading

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.sweep.state import SweepState, SweepStateCorrupt

SPACE = {"train.learning_rate": ["interval", 1e-05, 0.001, True]}
SETTINGS = {"sampler": "random", "seed": 0, "pruner": "asha"}


def opened(store, **kw):
    state = SweepState(store, "sw")
    state.open(space=kw.get("space", SPACE), fixed=kw.get("fixed", ["train.max_steps=12"]),
               settings=kw.get("settings", SETTINGS), allow_changes=kw.get("allow_changes", False))
    return state


def test_trial_numbers_continue_across_drivers_and_never_repeat(store):
    first = opened(store)
    first.new_trial({"train.learning_rate": 1e-4})
    again = opened(store)  # a relaunched driver, with the same command
    made = []
    threads = [threading.Thread(target=lambda: made.append(again.new_trial({}).number)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == [1, 2, 3, 4]
    doc = again.load()
    assert [t.run_name for t in doc.trials] == [f"sw-t{k}" for k in range(5)]
    assert doc.trials[0].params == {"train.learning_rate": 1e-4}


def test_a_relaunch_with_another_space_is_refused_with_the_difference_unless_allowed(store):
    opened(store).new_trial({})
    changed = {"train.learning_rate": ["interval", 1e-05, 0.01, True]}
    with pytest.raises(ConfigError) as err:
        opened(store, space=changed, fixed=["train.max_steps=24"])
    text = str(err.value)
    assert "interval(1e-05,0.001)) -> tag(log, interval(1e-05,0.01))" in text
    assert "override train.max_steps=12 dropped" in text and "sweep.allow_changes=true" in text
    assert err.value.exit_code == 4
    assert opened(store, fixed=["train.max_steps=24"], allow_changes=True).load().space_since == 0
    doc = opened(store, space=changed, fixed=["train.max_steps=24"], allow_changes=True).load()
    assert doc.space == changed and len(doc.trials) == 1  # nothing of the past trials lost
    assert doc.space_since == 1  # trial 0 was sampled under the old space: its values are checked by domain only
    assert opened(store, space=changed, fixed=["train.max_steps=24"]).load().space_since == 1  # a plain rerun


@pytest.mark.parametrize("raw,needle", [
    (b"{not json", "not JSON"),
    (json.dumps({"version": 1}).encode(), "'name' is missing"),
    (None, "decisions[0] 'value' is nan"),
])
def test_a_corrupt_record_is_one_clear_error_naming_the_object(store, raw, needle):
    state = opened(store)
    state.new_trial({})
    if raw is None:
        doc = json.loads(store.get_bytes(state.key))
        doc["decisions"] = [{"trial": 0, "rung": 0, "value": float("nan"), "decision": "promote"}]
        raw = json.dumps(doc).encode()
    store.put_bytes(state.key, raw)
    with pytest.raises(SweepStateCorrupt) as err:
        state.load()
    assert needle in str(err.value) and state.uri in str(err.value) and "new sweep.name" in str(err.value)
    with pytest.raises(SweepStateCorrupt):
        state.new_trial({})


def test_a_corrupt_trial_entry_refuses_that_trial_only_and_the_next_write_keeps_it_failed(store, caplog):
    """A trial whose own entry does not decode (a rung result of NaN) is that trial's problem, not the sweep's:
    it reads as failed with why, its neighbours read as they were, and the next write stores it failed."""
    state = opened(store)
    state.new_trial({"train.learning_rate": 1e-4})
    state.new_trial({"train.learning_rate": 2e-4})
    doc = json.loads(store.get_bytes(state.key))
    doc["trials"][0]["values"] = {"0": float("nan")}
    store.put_bytes(state.key, json.dumps(doc).encode())
    record = state.load()
    bad, good = record.trials
    assert (bad.status, good.status, good.params) == ("failed", "running", {"train.learning_rate": 2e-4})
    assert "its entry in the sweep's record is corrupt: values '0' is nan" in bad.refused
    assert caplog.text.count("trial 0 (sw-t0) is refused") == 1
    assert state.new_trial({}).number == 2  # the sweep goes on
    stored = json.loads(store.get_bytes(state.key))["trials"][0]
    assert stored["status"] == "failed" and stored["values"] == {} and "is nan" in stored["refused"]


def test_orchestrator_status_of_a_sweep_prints_its_trials_and_json(tmp_path, capsys):
    from orchestrator.cli.status import main
    from orchestrator.storage.local import LocalStore

    state = SweepState(LocalStore(tmp_path / "runs"), "sw")
    state.open(space=SPACE, fixed=[], allow_changes=False, settings=dict(
        SETTINGS, metric="eval_loss", direction="minimize", min_fraction=0.5, reduction_factor=2, max_steps=8))
    state.new_trial({"train.learning_rate": 1e-4})
    state.update(lambda d: d["trials"][0].update(status="paused", values={"0": 0.75}))  # a write's function
    assert main([str(tmp_path / "runs" / "sw")]) == 0
    out = capsys.readouterr().out
    assert "t0   paused" in out and "r0=0.7500" in out and "leader: t0 (sw-t0) eval_loss=0.7500" in out
    assert main([str(tmp_path / "runs" / "sw"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trials"][0]["values"] == {"0": 0.75}
