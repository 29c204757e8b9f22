"""One driver at a time: a second driver of a live sweep says who holds it and exits 6, launching nothing; a
lease whose holder died (this host) or went silent (another host) is taken over, and the driver presumed dead
then stops at its next write. Real processes, real records in a local store."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from orchestrator import launch
from orchestrator.sweep import backends, lease
from orchestrator.sweep.state import SweepState

SPACE = {"train.learning_rate": ["choice", [1e-4, 2e-4]]}
SETTINGS = {"sampler": "grid", "seed": 0, "pruner": "none"}


@pytest.fixture
def other_driver():
    """A live process of this host standing for another driver."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait()


def opened(store, holder=None, monkeypatch=None):
    if holder is not None:
        monkeypatch.setattr(lease, "me", lambda: holder)
    state = SweepState(store, "sw")
    state.open(space=SPACE, fixed=[], settings=SETTINGS, allow_changes=False)
    if holder is not None:
        monkeypatch.undo()
    return state


def test_a_second_driver_of_a_live_sweep_is_told_who_holds_it_and_exits_6(tmp_path, capsys, other_driver,
                                                                         monkeypatch):
    args = ["-m", "train.learning_rate=1e-4,2e-4", "sweep.budget_usd=1", "sweep.name=sw",
            f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}", "tracking.enabled=false"]
    from orchestrator.sweep.plan import plan_sweep

    monkeypatch.setattr(lease, "me", lambda: backends.launcher_identity(other_driver.pid))
    plan_sweep(args, launch.compose_for_launch)  # the first driver took the lease
    monkeypatch.undo()
    before = (tmp_path / "runs" / "sw" / "sweep.json").read_bytes()
    code = launch.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 6 and len(err) == 1, err
    assert f"pid {other_driver.pid} on host {socket.gethostname()}" in err[0] and "launches nothing" in err[0]
    assert (tmp_path / "runs" / "sw" / "sweep.json").read_bytes() == before  # nothing written, no trial
    assert not (tmp_path / "work" / "sweeps").exists()


def test_a_dead_drivers_lease_is_taken_over_and_it_stops_at_its_next_write(store, other_driver, monkeypatch):
    first = opened(store, backends.launcher_identity(other_driver.pid), monkeypatch)
    assert first.fence == 1
    with pytest.raises(lease.SweepBusy):
        opened(store)
    other_driver.kill()
    other_driver.wait()
    second = opened(store)  # its holder's process is gone: taken over at once
    assert second.fence == 2 and second.load().driver.pid == lease.me()["pid"]
    with pytest.raises(lease.SweepLeaseLost) as err:
        first.new_trial({"train.learning_rate": 1e-4})  # the driver presumed dead writes nothing
    assert err.value.exit_code == 6 and second.load().trials == ()
    second.new_trial({"train.learning_rate": 1e-4})
    second.release()
    assert second.load().driver is None


@pytest.mark.parametrize("age,taken", [(lease.LEASE_S + 1, True), (10, False)])
def test_a_lease_of_another_host_expires_after_its_last_renewal(store, age, taken):
    state = opened(store)
    state.release()
    doc = json.loads(store.get_bytes(state.key))
    doc["driver"] = {"host": "elsewhere", "pid": 1, "started": 1.0, "renewed_at": time.time() - age}
    store.put_bytes(state.key, json.dumps(doc).encode())
    if taken:
        assert opened(store).load().driver.host == socket.gethostname()
    else:
        with pytest.raises(lease.SweepBusy, match="pid 1 on host elsewhere"):
            opened(store)


def test_a_driver_gives_the_lease_up_at_its_end(tmp_path):
    """The sweep's budget is spent: the driver ends at once (exit 0), and a rerun is not refused."""
    from orchestrator.money.spend import Caps, SpendIndex
    from orchestrator.storage.local import LocalStore

    args = ["-m", "train.learning_rate=1e-4,2e-4", "sweep.budget_usd=0.01", "sweep.name=sw",
            f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}", "tracking.enabled=false"]
    spent = SpendIndex(LocalStore(tmp_path / "runs"), Caps("sw-t0", "sw", experiment_max_usd=0.01))
    spent.reserve(1, 0.0, 0.01)
    spent.settle(1, 0.01)
    assert launch.main(args) == 0
    assert json.loads((tmp_path / "runs" / "sw" / "sweep.json").read_text())["driver"] is None
