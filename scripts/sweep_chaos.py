"""The chaos half of ``bench_sweep.py --chaos SEED``: seeded SIGKILLs of a sweep's trial workers, and the checks.

``Chaos.tick`` runs every 0.2 s while the sweep's driver runs. Each trial, in the order the driver samples
them, draws from ``random.Random(SEED)`` the committed step (2 or 4 steps into its first attempt) at which its
worker is SIGKILLed, and whether it is killed once more (2 steps into its next attempt, heads or tails). A trial
whose first attempt ended before its kill (it reached its rung first) is killed 2 steps into its next one.
The trial's launcher (the local supervisor) requeues the worker, which must resume from that checkpoint.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import psutil


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):  # not written yet, or caught mid-replace
        return {}


def workers_of(run: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "orchestrator.worker" in cmd and f"run.name={run}" in cmd:
            out.append(p)
    return out


class Chaos:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.plan: dict[str, list[int]] = {}  # run -> steps into an attempt at which to kill, one per kill
        self.kills: dict[str, list[tuple[int, int]]] = {}  # run -> (fence, committed step) of each kill
        self.seen_fences: dict[str, set] = {}

    def _planned(self, run: str) -> list[int]:
        if run not in self.plan:
            first = self.rng.choice((2, 4))
            self.plan[run] = [first] + ([2] if self.rng.random() < 0.5 else [])
        return self.plan[run]

    def tick(self, runs: Path, sweep_json: Path) -> None:
        for trial in _load(sweep_json).get("trials", []):
            run = trial["run_name"]
            plan = self._planned(run)
            done = self.kills.setdefault(run, [])
            if len(done) >= len(plan):
                continue
            attempts = _load(runs / run / "ledger.json").get("attempts") or []
            if not attempts or attempts[-1].get("exit_class") != "running":
                continue
            last = attempts[-1]
            fences = self.seen_fences.setdefault(run, set())
            fences.add(last["fence"])
            # the first kill's step applies to the first attempt; any later attempt is killed 2 steps in
            into = plan[len(done)] if len(fences) == 1 else 2
            committed = int(last.get("checkpoint_step_end") or 0)
            if committed - int(last.get("step_start") or 0) >= into:
                workers = workers_of(run)
                for p in workers:
                    p.kill()
                if workers:
                    done.append((last["fence"], committed))


def resumed_elsewhere(runs: Path, names: list[str]) -> list[str]:
    """Attempts that did not start at their job's newest committed checkpoint, as the ledgers show."""
    bad = []
    for name in names:
        committed = 0
        for a in _load(runs / name / "ledger.json").get("attempts", []):
            if int(a["step_start"]) != committed:
                bad.append(f"{name} fence {a['fence']}: started at step {a['step_start']}, committed {committed}")
            committed = max(committed, int(a.get("checkpoint_step_end") or 0))
    return bad


def decisions(state: dict) -> list[tuple]:
    return sorted((d["trial"], d["rung"], d["decision"]) for d in state["decisions"])


def max_running(runs: Path, names: list[str]) -> int:
    """The most attempts the ledgers show running at one moment."""
    edges = []
    for name in names:
        for a in _load(runs / name / "ledger.json").get("attempts", []):
            edges += [(float(a["started_at"]), 1), (float(a.get("ended_at") or a["last_seen"]), -1)]
    level = peak = 0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):
        level += delta
        peak = max(peak, level)
    return peak


def report(args, calm_side: tuple, chaos_side: tuple, chaos: Chaos, step_seconds: float = 1.0) -> list[str]:
    (calm, calm_state), (rough, rough_state) = calm_side, chaos_side
    runs, names = rough["runs"], rough["names"]
    killed = {run: kills for run, kills in chaos.kills.items() if kills}
    one_step = step_seconds / 3600  # $1/h: one step of the tiny model with the step floor takes under 1 s
    running = max_running(runs, names)
    bound = args.budget + running * one_step
    bad = resumed_elsewhere(runs, names)
    promoted = [(t, r) for t, r, d in decisions(calm_state) if d == "promote"]
    lines = [
        f"trials SIGKILLed: {len(killed)} of {len(names)}; kills {sum(len(k) for k in killed.values())} "
        f"(run: [(fence, committed step)]) {json.dumps({k.rsplit('-', 1)[1]: v for k, v in sorted(killed.items())})}",
        f"never killed: {sorted(set(names) - set(killed)) or 'none'}",
        f"spend (every attempt in the ledgers): calm ${calm['spent_usd']:.4f}, chaos ${rough['spent_usd']:.4f}; "
        f"bound: budget ${args.budget:g} + {running} running x one step (${one_step:.6f}) = ${bound:.4f}: "
        f"{'within' if rough['spent_usd'] <= bound else 'PASSED'}",
        f"resumed attempts not at their committed checkpoint: {len(bad)}" + (f" {bad}" if bad else ""),
        f"promoted (trial, rung): calm {promoted}; chaos the same: "
        f"{[(t, r) for t, r, d in decisions(rough_state) if d == 'promote'] == promoted}; all decisions the same: "
        f"{decisions(calm_state) == decisions(rough_state)}",
        f"best trial: calm {calm['best']} (eval_loss {calm['best_eval_loss']:.4f}), chaos {rough['best']} "
        f"(eval_loss {rough['best_eval_loss']:.4f}): {'same' if calm['best'] == rough['best'] else 'DIFFERENT'}",
        f"idle share of paid slot time: calm {calm['idle_share']:.1%}, chaos {rough['idle_share']:.1%}",
        f"wall seconds: calm {calm['wall_s']:.0f}, chaos {rough['wall_s']:.0f}; USD to reach the best: "
        f"calm {calm['usd_to_best']:.4f}, chaos {rough['usd_to_best']:.4f}",
    ]
    return lines
