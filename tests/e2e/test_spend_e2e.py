"""``budget.monthly_max_usd`` across jobs, end to end, on a real S3 server (moto).

Two jobs launched at once race for one month's cap; each is charged by reservation before it
spends, so neither can take dollars the other holds: both are stopped (final checkpoint, exit 3)
and the month's spend ends within one reservation of the cap. A third job is then refused before
its first step, with exit 3 and the numbers.
"""
from __future__ import annotations

import pytest
import json
import time

from orchestrator.money.spend import INDEX_KEY, month_of, month_total_usd
from tests.helpers import jobs

CAP_USD = 10.0
RESERVE_S = 20.0  # at $0.10/s: $2, which covers a stopped job's last step, final save and exit on a loaded machine
# compute.price_per_hour=360 on the cpu preset: $0.10 per second of an attempt, its imports included (billed from
# the process start): the cap holds two start-ups and some training
USD_PER_S = 0.1
CAPPED = [f"compute.price_per_hour={USD_PER_S * 3600:g}", f"budget.monthly_max_usd={CAP_USD:g}",
          "compute.restart_seconds=15",  # the start-up held before a first attempt measured one (not the 45 s prior)
          f"budget.reserve_ahead={RESERVE_S:g}s",
          "train.max_steps=5000", "train.eval_at_end=false"]


@pytest.mark.e2e
def test_two_jobs_racing_for_a_monthly_cap_never_overspend_it_and_a_third_is_refused(tmp_path, s3_server, s3_bucket):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    common = jobs.FAST + CAPPED + storage.overrides()
    racers = {name: jobs.start_job(jobs.with_overrides(common, f"run.name={name}"), tmp_path, log_name=f"{name}.log")
              for name in ("race-a", "race-b")}
    try:
        codes = {name: proc.wait(timeout=300) for name, proc in racers.items()}
    finally:
        for proc in racers.values():
            if proc.poll() is None:
                jobs.kill_group(proc)
    logs = {name: jobs.log_text(tmp_path, f"{name}.log") for name in racers}
    assert codes == {"race-a": 3, "race-b": 3}, {n: logs[n][-3000:] for n in logs}

    index = json.loads(storage.store().get_bytes(INDEX_KEY))
    month = month_of(time.time())
    spent = {name: jobs.ledger(storage, name)["cost_usd"] for name in racers}
    # both trained, were stopped with a final checkpoint, and settled what they spent
    for name in racers:
        ledger = jobs.ledger(storage, name)
        assert ledger["status"] == "budget_exhausted" and ledger["step"] > 0, ledger
        assert jobs.committed_steps(storage, name)[-1] == ledger["step"]
        assert index["jobs"][name]["open"] == {}
        assert index["jobs"][name]["months"][month] == spent[name]
    # the guarantee: charged before spent, so the month ends within one reservation of the cap
    print(f"month total ${sum(spent.values()):.2f} ({' + '.join(f'{v:.2f}' for v in spent.values())}) "
          f"against a ${CAP_USD:g} cap, one reservation ${RESERVE_S * USD_PER_S:.2f}")
    assert month_total_usd(index, month) == sum(spent.values())
    assert CAP_USD - 1.0 <= sum(spent.values()) <= CAP_USD + RESERVE_S * USD_PER_S, spent
    # each alert of the shared cap went out once, for both jobs together
    text = logs["race-a"] + logs["race-b"]
    for pct in (50, 80, 100):
        assert text.count(f"budget alert: [monthly_cap_{pct}]") == 1, text[-3000:]
        assert f"{month}/monthly_cap_{pct}" in index["alerts"]

    done = jobs.run_job(jobs.with_overrides(common, "run.name=late"), tmp_path, timeout=300)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "monthly spend cap reached" in done.stderr and f"budget.monthly_max_usd=${CAP_USD:g}" in done.stderr
    assert "race-a $" in done.stderr and "race-b $" in done.stderr
    assert not storage.store().exists("late/ledger.json")  # refused before it took an attempt: nothing written
