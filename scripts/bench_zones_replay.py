"""Replay several zones' time-aligned spot traces against the real orchestrator, each attempt placed by
``policy.placement``, and compare its goodput and dollars with the zone simulator's for the same job.

    python scripts/bench_zones_replay.py --start-tick 2012 --job-hours 6

The bench plays the cloud. Time is compressed ``--compress`` times (trace seconds per real second). At every
trace tick it watches every zone's capacity; before each attempt it asks ``policy.placement.choose`` (what the
job has seen so far: its own preemptions and held hours per zone, the losses it watched elsewhere, the deadline)
where to run, then starts the attempt there: one ``python -m orchestrator.launch`` of the same run (it resumes
from the latest checkpoint in the moto S3 server) with ``ORCH_ZONE=<zone>`` in its environment and
``checkpoint.every`` set to the placement's interval. When the zone loses its capacity at a tick the worker is
SIGKILLed (no notice); on-demand is never killed; with no capacity anywhere and time to wait, the bench waits
(free). The clock stops while a launcher composes its config and starts its supervisor (a cloud's provisioning,
not billed here or in the simulator), and restarts from the worker's spawn. The bench decides at each start only;
the simulator may also move a job that holds capacity (its ``moves`` are printed).

Measured, per attempt: the worker's life (spawn to exit: paid), its restart (spawn to first step) and its
checkpoint stalls; goodput = steps x the uninterrupted seconds per step / the paid seconds; dollars = the paid
seconds (in trace time) at the zone's price. Predicted: ``planning.zones.replay_schedule``: the simulator's model on the
same schedule (each attempt's zone, start tick and checkpoint interval), preempted by the same traces, with the
measured seconds per step, restarts (in order) and checkpoint stall, in trace time, no transfer (the checkpoint
lies in S3, reachable from every zone). The simulator's own placement from the same tick is printed beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import bench_goodput as bg  # noqa: E402

from orchestrator.planning import zones as zs  # noqa: E402
from orchestrator.planning.spot_traces import load_traces  # noqa: E402
from orchestrator.policy import placement as pl  # noqa: E402

RUNTIME = re.compile(r"'train_runtime': '?([0-9.]+)")
V100 = REPO / "data" / "spot-traces" / "availability" / "1-node" / "aws-02-15-2023"


class Cloud:
    """The zones as the job has seen them, from ``start`` (a tick of the grid), in compressed real time."""

    def __init__(self, grid: zs.ZoneGrid, start: int, compress: float):
        self.g, self.start, self.c = grid, start, compress
        self.t0, self.paused_at = time.time(), None  # the clock stops while a launcher starts (provisioning)
        n = len(grid.names)
        self.held, self.hits, self.last_hit = [0.0] * n, [0] * n, [None] * n
        self.seen_hours, self.seen_losses, self.was_up = [0.0] * n, [0] * n, [False] * n
        self.watched = -1  # the last tick watched
        self.holding: int | str | None = None

    def now(self) -> float:
        """Trace seconds since the job's start."""
        return ((self.paused_at or time.time()) - self.t0) * self.c

    def pause(self) -> None:
        self.paused_at = self.paused_at or time.time()

    def resume(self, at: float) -> None:
        """Go on from real time ``at`` (the worker's spawn) as if no time had passed since the pause."""
        self.t0 += max(0.0, at - (self.paused_at or at))
        self.paused_at = None

    def tick(self) -> int:
        return int(self.now() // self.g.gap_seconds)

    def col(self, k: int) -> int:
        return (self.start + k) % self.g.ticks

    def watch(self) -> int:
        """Watch every tick up to now (as ``planning.zones``); the current tick."""
        k = self.tick()
        while self.watched < k:
            self.watched += 1
            i = self.col(self.watched)
            for z in range(len(self.g.names)):
                up = self.g.available[z][i]
                if self.was_up[z] and self.holding != z:
                    self.seen_hours[z] += self.g.gap_seconds / 3600.0
                    self.seen_losses[z] += not up
                self.was_up[z] = up
        return k

    def zones(self) -> list[pl.Zone]:
        i, now = self.col(self.watch()), self.now()
        return [pl.Zone(name, self.g.spot_usd[z][i], self.g.available[z][i], JOB.prior_per_hour, self.held[z] / 3600,
                        self.hits[z], None if self.last_hit[z] is None else now - self.last_hit[z],
                        self.seen_hours[z], self.seen_losses[z]) for z, name in enumerate(self.g.names)]


def committed_step(workdir: Path) -> int:
    log = workdir / "work" / "zones" / "job.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    return max([int(m.group(2)) for line in text.splitlines() if (m := bg.STALL.match(line))], default=0)


def attempt(args, endpoint: str, workdir: Path, zone: str, every_s: float, n: int) -> subprocess.Popen:
    overrides = bg.job_overrides(args, endpoint, "zones", f"{every_s:.2f}s")
    env = dict(bg.env(), ORCH_ZONE=zone, ORCH_PRICES_OFFLINE="1")
    return subprocess.Popen([bg.PY, "-m", "orchestrator.launch", *overrides], cwd=workdir, env=env,
                            stdout=open(workdir / f"attempt-{n}.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def run(args, cloud: Cloud, endpoint: str, workdir: Path, step_guess: float) -> list[dict]:
    """The attempts, each ``{"zone", "born", "paid", "usd_per_hour", "end"}``, until the job completes."""
    attempts: list[dict] = []
    while True:
        done = committed_step(workdir)
        restarts = [a["restart"] for a in attempts if a.get("restart")] or [args.restart_guess]
        state = pl.JobState(
            work_left_seconds=(args.steps - done) * step_guess * cloud.c,
            restart_seconds=statistics.median(restarts) * cloud.c, transfer_seconds=0.0,
            checkpoint_cost_seconds=args.checkpoint_guess * cloud.c, on_demand_usd=cloud.g.cheapest_on_demand,
            time_left_seconds=None if args.deadline_hours is None else args.deadline_hours * 3600 - cloud.now(),
            checkpoint_zone=None, decision_seconds=cloud.g.gap_seconds)
        choice = pl.choose(cloud.zones(), state)
        if choice.zone == pl.WAIT:
            cloud.resume(time.time())
            time.sleep(cloud.g.gap_seconds / cloud.c)
            continue
        z = pl.ON_DEMAND if choice.zone == pl.ON_DEMAND else cloud.g.names.index(choice.zone)
        usd = cloud.g.cheapest_on_demand if z == pl.ON_DEMAND else cloud.g.spot_usd[z][cloud.col(cloud.tick())]
        cloud.pause()
        proc = attempt(args, endpoint, workdir, choice.zone, choice.interval_seconds / cloud.c, len(attempts))
        cloud.holding = z
        worker = None
        while worker is None and proc.poll() is None:
            worker = bg.find_worker(proc, set())
            time.sleep(0.01)
        if worker is None:
            sys.exit(f"attempt {len(attempts)} started no worker; see {workdir}/attempt-{len(attempts)}.log")
        # seen (polled every 10 ms), not psutil's create_time: that is counted from the boot time, whole seconds,
        # and reads up to a second early here, which made every life look that much longer
        born, end = time.time(), "finished"
        cloud.resume(born)
        start_tick = cloud.tick()
        while worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE:
            k = cloud.watch()
            if isinstance(z, int) and not cloud.g.available[z][cloud.col(k)]:
                os.killpg(proc.pid, signal.SIGKILL)  # the machine vanishes: its launcher and worker with it
                end = "preempted"
                break
            time.sleep(0.01)
        died = time.time()  # paid to here (an orphan's reaping after the kill is no machine time)
        cloud.pause()  # until the next attempt's worker (or a wait) starts
        try:
            worker.wait(120)
        except psutil.TimeoutExpired:
            worker.kill()
        paid = died - born
        if isinstance(z, int):
            cloud.held[z] += paid * cloud.c
            if end == "preempted":
                cloud.hits[z] += 1
                cloud.last_hit[z] = cloud.now()
        cloud.holding = None
        rc = proc.wait(300) if end == "finished" else 0
        attempts.append({"zone": choice.zone, "tick": start_tick, "interval": choice.interval_seconds, "born": born, "paid": paid, "usd_per_hour": usd, "end": end,
                         "log": str(workdir / f"attempt-{len(attempts)}.log")})
        if end == "finished":
            if rc != 0:
                sys.exit(f"the last attempt ended with exit code {rc}; see {attempts[-1]['log']}")
            return attempts


def measure(attempts: list[dict], workdir: Path) -> dict:
    text = "".join(Path(a["log"]).read_text(errors="replace") for a in attempts)
    job_log = workdir / "work" / "zones" / "job.log"
    text += job_log.read_text(errors="replace") if job_log.is_file() else ""
    births = [a["born"] for a in attempts]
    which = bg._attempt_of(births)
    firsts = {which(bg._stamp(m.group(1))): bg._stamp(m.group(1)) for line in text.splitlines()
              if (m := bg.FIRST_STEP.match(line))}
    for i, a in enumerate(attempts):
        a["restart"] = firsts[i] - a["born"] if i in firsts else a["paid"] + 1.0  # killed before its first step
    stalls = [(bg._stamp(m.group(1)), int(m.group(2)), float(m.group(3))) for line in text.splitlines()
              if (m := bg.STALL.match(line))]
    return {"step_s": bg._seconds_per_step(stalls, which), "ckpt_s": statistics.fmean(x for _, _, x in stalls),
            "stalls": stalls, "runtime": float(RUNTIME.findall(text)[-1]), "first_steps": sorted(firsts.values())}


def warm_up(args, endpoint: str, workdir: Path) -> None:
    """One step of another run first, so that the training set is prepared (and cached in S3) before the
    clock starts: a real job prepares it once, not at every attempt."""
    overrides = [o if not o.startswith(("train.max_steps=", "run.name=")) else o.split("=")[0] + "=" +
                 ("2" if o.startswith("train.") else "warm-up") for o in bg.job_overrides(args, endpoint, "x", "1s")]
    done = subprocess.run([bg.PY, "-m", "orchestrator.launch", *overrides], cwd=workdir, env=bg.env(),
                          stdout=open(workdir / "warm-up.log", "wb"), stderr=subprocess.STDOUT, timeout=600)
    if done.returncode != 0:
        sys.exit(f"the warm-up run failed ({done.returncode}); see {workdir}/warm-up.log")


def main() -> int:
    global JOB
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=Path, default=V100, help="a folder of time-aligned zone traces")
    p.add_argument("--start-tick", type=int, default=2012, help="the grid's tick where the job starts")
    p.add_argument("--compress", type=float, default=240.0, help="trace seconds per real second")
    p.add_argument("--steps", type=int, default=900, help="optimizer steps of the job")
    p.add_argument("--step-delay", type=float, default=0.1, help="ORCH_STEP_DELAY_SECONDS: a floor under each step")
    p.add_argument("--deadline-hours", type=float, help="the job's deadline, trace hours from its start")
    p.add_argument("--restart-guess", type=float, default=4.0, help="real seconds of a restart before one is measured")
    p.add_argument("--checkpoint-guess", type=float, default=0.15, help="real seconds of a checkpoint stall (guess)")
    args = bg.ARGS = p.parse_args()
    args.every = 0  # bench_goodput's job_overrides reads it; each attempt here sets its own
    grid = zs.zone_grid(load_traces(args.traces), 0.92, 3.06)
    JOB = zs.ZoneJob(work_seconds=0.0)
    workdir = Path(tempfile.mkdtemp(prefix="bench-zones-"))
    moto, endpoint = bg.start_moto(workdir)
    step_guess = args.step_delay * 1.3
    try:
        warm_up(args, endpoint, workdir)
        began = time.time()
        cloud = Cloud(grid, args.start_tick, args.compress)
        attempts = run(args, cloud, endpoint, workdir, step_guess)
    finally:
        os.killpg(moto.pid, signal.SIGTERM)
    got = measure(attempts, workdir)
    step_s, c = got["step_s"], args.compress
    last = attempts[-1]
    got_all = {"births": [a["born"] for a in attempts], "paid": [a["paid"] for a in attempts],
               "stalls": got["stalls"], "first_steps": got["first_steps"], "runtime": got["runtime"]}
    tail = max(0.0, last["born"] + last["paid"] - bg._training_end(got_all, bg._attempt_of(got_all["births"]),
                                                                   step_s, args.steps))
    paid = sum(a["paid"] for a in attempts) - tail
    trained = sum(max(0.0, a["paid"] - a["restart"]) for a in attempts)
    if trained < args.steps * step_s * 0.98:  # the job cannot have trained outside the attempts the bench ran
        sys.exit(f"the attempts trained {trained:.1f} s, under the job's {args.steps * step_s:.1f} s: an attempt ran "
                 f"that the bench did not see; see {workdir}")
    usd = (sum(a["paid"] * a["usd_per_hour"] for a in attempts) - tail * last["usd_per_hour"]) * c / 3600
    job = zs.ZoneJob(work_seconds=args.steps * step_s * c, restart_seconds=statistics.median(
        a["restart"] for a in attempts) * c, transfer_seconds=0.0, checkpoint_cost_seconds=got["ckpt_s"] * c,
        deadline_seconds=None if args.deadline_hours is None else args.deadline_hours * 3600,
        restart_schedule=tuple(a["restart"] * c for a in attempts))
    sim = zs.replay_schedule(grid, job, args.start_tick, [(a["tick"], a["zone"], a["interval"]) for a in attempts])
    own = zs.replay(grid, job, args.start_tick)  # the simulator's own placement, for reference
    base = zs.on_demand_baseline_usd(grid, job)
    measured_gp = args.steps * step_s / paid
    sim_gp = job.work_seconds / sim.paid_seconds
    out = {"start_tick": args.start_tick, "compress": c, "steps": args.steps, "seconds_per_step": round(step_s, 4),
           "checkpoint_cost_s": round(got["ckpt_s"], 3),
           "attempts": [(a["tick"], a["zone"], a["end"], round(a["restart"], 1)) for a in attempts],
           "measured": {"goodput": round(measured_gp, 3), "paid_s": round(paid, 2), "lives_s": [round(a["paid"], 2) for a in attempts], "usd": round(usd, 2),
                        "cost_vs_on_demand": round(usd / base, 3), "attempts": len(attempts)},
           "simulated": {"goodput": round(sim_gp, 3), "paid_s": round(sim.paid_seconds / c, 2),
                         "lost_s": round(sim.lost_seconds / c, 2), "usd": round(sim.cost_usd, 2),
                         "cost_vs_on_demand": round(sim.cost_usd / base, 3),
                         "attempts": sim.preemptions + sim.moves + 1, "moves": sim.moves},
           "simulated_own_placement": {"goodput": round(job.work_seconds / own.paid_seconds, 3),
                                       "cost_vs_on_demand": round(own.cost_usd / base, 3),
                                       "attempts": own.preemptions + own.moves + 1},
           "difference_points": {"goodput": round(100 * (measured_gp - sim_gp), 1),
                                 "cost_vs_on_demand": round(100 * (usd - sim.cost_usd) / base, 1)},
           "wall_s": round(time.time() - began, 1), "workdir": str(workdir)}
    print(json.dumps(out))
    return 0


JOB = zs.ZoneJob(work_seconds=0.0)

if __name__ == "__main__":
    sys.exit(main())
