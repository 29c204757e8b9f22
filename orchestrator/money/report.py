"""A job's cost and throughput figures: per logging step to MLflow, and the cost report at its end.

Pure arithmetic over numbers the ledger, the cost meter and the Trainer callback
already hold; the worker feeds :class:`JobFigures` and sends what it returns to
MLflow. Every figure is for the whole job (all attempts so far) unless its name
starts with ``attempt_``.

Tokens: SFT's trainer logs ``num_tokens``, the non-padding tokens this attempt
has trained on (all ranks); tokens per optimizer step is that over the steps
this attempt took. Recipes that do not log it (DPO) fall back to an upper bound,
per-device batch x gradient accumulation x world size x data.max_length (x2 for
DPO's chosen and rejected sequences). Tokens trained at step s is s x tokens per
step: each token the model has learned from counts once, so steps redone after
an interruption do not count again -- but their cost does, which is what makes
USD per million tokens show the price of lost work.

Lost work is :func:`orchestrator.money.cost.lost_work` over the ledger's attempts at
this attempt's mean step time. Spot savings compare the job's spend with one
uninterrupted on-demand run of the same steps
(:func:`orchestrator.money.cost.uninterrupted_on_demand_usd`), so restarts and lost
work count against spot. A SIGKILLed attempt's progress is known only up to
its last heartbeat or checkpoint, so lost work is a lower bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Optional

from orchestrator.core.exitcodes import INTERRUPTED_CLASSES
from orchestrator.core.ranks import configured_world_size
from orchestrator.money import cost as costs
from orchestrator.records.ledger_record import AttemptEntry, LedgerRecord

SECONDS_PER_HOUR = costs.SECONDS_PER_HOUR


def estimated_tokens_per_step(cfg: Any) -> int:
    """Upper bound on the tokens in one optimizer step (every sequence padded to data.max_length)."""
    world = configured_world_size(cfg)
    sequences = 2 if cfg.recipe.name == "dpo" else 1
    return (
        int(cfg.train.per_device_batch_size)
        * int(cfg.train.gradient_accumulation_steps)
        * world
        * int(cfg.data.max_length)
        * sequences
    )


def rollouts_per_step(cfg: Any) -> float:
    """GRPO's rollouts (completions sampled and scored) per optimizer step: the step's rows over
    ``recipe.num_iterations`` (each generation batch is trained on that many times); 0 for other recipes."""
    if cfg.recipe.name != "grpo":
        return 0.0
    rows = (
        int(cfg.train.per_device_batch_size) * int(cfg.train.gradient_accumulation_steps) * configured_world_size(cfg)
    )
    return rows / max(1, int(cfg.recipe.num_iterations))


def attempt_seconds(attempt: Mapping[str, Any]) -> float:
    """Wall seconds of one raw ledger attempt (to its end, else its last heartbeat): for a reader that has not
    decoded the ledger (``entry_seconds`` for one that has)."""
    started = float(attempt.get("started_at") or 0.0)
    ended = attempt.get("ended_at") or attempt.get("last_seen") or started
    return max(0.0, float(ended) - started)


def entry_seconds(attempt: AttemptEntry) -> float:
    """Wall seconds of one decoded ledger attempt (to its end, else its last heartbeat)."""
    started = attempt.started_at or 0.0
    return max(0.0, (attempt.end or started) - started)


def quality_gain_points(quality: Optional[float], before: Optional[float]) -> Optional[float]:
    """Percentage points a fraction-valued quality metric gained over its "before training" value."""
    if quality is None or before is None:
        return None
    return (float(quality) - float(before)) * 100.0


def usd_per_quality_point(cost_usd: float, quality: Optional[float], before: Optional[float]) -> Optional[float]:
    """USD per percentage point gained by training: the cost over (after - before) x 100 of a quality metric
    that is a fraction in [0, 1]. None without a "before" value, or when training gained nothing (the
    figure would be infinite or negative)."""
    gain = quality_gain_points(quality, before)
    if gain is None or gain <= 0:
        return None
    return cost_usd / gain


class JobFigures:
    """Running totals of one attempt of a job, given the attempts before it.

    Args:
        price: this attempt's ``cost.Price``.
        prior_attempts: the ledger's attempts before this one (decoded: ``LedgerRecord.decode``), in the order
            they ran.
        step_at_start: the step this attempt restored (0 for a fresh job).
        fallback_tokens_per_step: used until the trainer logs ``num_tokens``.
        rollouts_per_step: GRPO's (``rollouts_per_step``), for ``usd_per_1k_rollouts``; 0 for other recipes.
    """

    def __init__(
        self,
        price: costs.Price,
        prior_attempts: Iterable[AttemptEntry],
        *,
        step_at_start: int,
        fallback_tokens_per_step: int,
        rollouts_per_step: float = 0.0,
    ):
        self.price = price
        self.rollouts_per_step = float(rollouts_per_step)
        self.prior_attempts = list(prior_attempts)
        self.step_at_start = int(step_at_start)
        self.fallback_tokens_per_step = int(fallback_tokens_per_step)
        self.measured_tokens_per_step: Optional[float] = None
        self.prior_cost_usd = float(sum(a.cost_usd for a in self.prior_attempts))
        self.prior_gpu_hours = sum(entry_seconds(a) / SECONDS_PER_HOUR * a.gpus for a in self.prior_attempts)
        self.preemptions = sum(a.exit_class in INTERRUPTED_CLASSES for a in self.prior_attempts)

    def observe_logs(self, logs: Mapping[str, Any], step: int) -> None:
        """Take the trainer's cumulative ``num_tokens`` (this attempt's) when it logs one."""
        tokens = logs.get("num_tokens")
        steps_done = step - self.step_at_start
        if isinstance(tokens, (int, float)) and tokens > 0 and steps_done > 0:
            self.measured_tokens_per_step = float(tokens) / steps_done

    @property
    def ran_on_spot(self) -> bool:
        """Whether any attempt of the job ran on spot: a job that never did has no spot savings."""
        return self.price.spot or any(a.spot for a in self.prior_attempts)

    @property
    def tokens_per_step(self) -> float:
        return self.measured_tokens_per_step or float(self.fallback_tokens_per_step)

    def uninterrupted_on_demand_usd(
        self, attempt_cost_usd: float, seconds_per_step: Optional[float]
    ) -> Optional[float]:
        """The spot baseline (``cost.uninterrupted_on_demand_usd``); this attempt's seconds are its cost
        over the price paid. None when they or the step time are unknown."""
        paid = self.price.usd_per_hour_total
        if paid <= 0:
            return None
        return costs.uninterrupted_on_demand_usd(
            attempt_seconds=attempt_cost_usd / paid * SECONDS_PER_HOUR,
            step_at_start=self.step_at_start,
            seconds_per_step=seconds_per_step,
            on_demand_usd_per_hour=self.price.on_demand_usd_per_hour_total,
        )

    def figures(
        self,
        *,
        step: int,
        attempt_cost_usd: float,
        attempt_gpu_hours: float,
        mean_step_seconds: Optional[float] = None,
        window_step_seconds: Optional[float] = None,
        checkpoint_stall_seconds: float = 0.0,
        checkpoint_upload_seconds: float = 0.0,
        total_cost_usd: Optional[float] = None,
        attempts: Optional[int] = None,
        preemptions: Optional[int] = None,
    ) -> dict[str, float]:
        """The figures at ``step``; ``total_cost_usd``/``attempts``/``preemptions`` override the running ones
        (the worker passes the ledger's when the attempt has ended)."""
        total = self.prior_cost_usd + attempt_cost_usd if total_cost_usd is None else float(total_cost_usd)
        tokens = step * self.tokens_per_step
        out = {
            "cost_usd": total,
            "attempt_cost_usd": attempt_cost_usd,
            "gpu_hours": self.prior_gpu_hours + attempt_gpu_hours,
            "tokens_trained": tokens,
            "attempts": len(self.prior_attempts) + 1 if attempts is None else attempts,
            "preemptions": self.preemptions if preemptions is None else preemptions,
            "attempt_checkpoint_stall_s": checkpoint_stall_seconds,
            "attempt_checkpoint_upload_s": checkpoint_upload_seconds,
        }
        on_demand = self.uninterrupted_on_demand_usd(attempt_cost_usd, mean_step_seconds or window_step_seconds)
        if on_demand is not None and self.ran_on_spot:
            out.update(on_demand_cost_usd=on_demand, spot_savings_usd=costs.spot_savings_usd(on_demand, total))
        per_step = costs.usd_per_step(total, step)
        if per_step is not None:
            out["usd_per_step"] = per_step
        per_mtok = costs.usd_per_million_tokens(total, int(tokens))
        if per_mtok is not None:
            out["usd_per_million_tokens"] = per_mtok
        if self.rollouts_per_step > 0 and step > 0:  # like tokens: a batch regenerated after a kill counts once
            out.update(
                rollouts=step * self.rollouts_per_step,
                usd_per_1k_rollouts=total / (step * self.rollouts_per_step) * 1000.0,
            )
        if window_step_seconds:
            out["tokens_per_second"] = self.tokens_per_step / window_step_seconds
        if mean_step_seconds:
            lost = self.lost_work(step, mean_step_seconds)
            out.update(lost_work_steps=lost.steps, lost_work_seconds=lost.seconds, lost_work_usd=lost.usd)
        return out

    def lost_work(self, step: int, seconds_per_step: float) -> costs.LostWork:
        steps = [
            {"checkpoint_step_at_start": a.checkpoint_step_at_start, "step_end": a.step_end}
            for a in self.prior_attempts
        ]
        current = {"checkpoint_step_at_start": self.step_at_start, "step_end": step}
        return costs.lost_work(
            steps + [current], seconds_per_step=seconds_per_step, usd_per_hour=self.price.usd_per_hour_total
        )


def build_report(
    *,
    job: str,
    status: str,
    ledger: LedgerRecord,
    price: costs.Price,
    figures: Mapping[str, float],
    quality_metric: str,
    quality: Optional[float],
    tokens_per_step: float,
    tokens_measured: bool,
    quality_before: Optional[float] = None,
) -> dict:
    """The cost report (JSON-ready): price, each attempt, totals, lost work, savings, checkpointing, quality.
    ``ledger``: the job's ledger, decoded (``LedgerRecord.decode``)."""
    attempts = [
        {
            "fence": a.fence,
            "exit_class": a.exit_class,
            "host": a.host,
            "duration_s": round(entry_seconds(a), 3),
            "cost_usd": a.cost_usd,
            "checkpoint_step_at_start": a.checkpoint_step_at_start,
            "step_end": a.step_end,
            "spot": a.spot,
            "instance_type": a.instance_type,
            "zone": a.zone,
            "zone_usd_per_hour": a.zone_usd_per_hour,
            "zone_reason": a.zone_reason,
        }
        for a in ledger.attempts
    ]
    get = figures.get
    return {
        "job": job,
        "status": status,
        "price": {
            "usd_per_hour": price.usd_per_hour_total,
            "on_demand_usd_per_hour": price.on_demand_usd_per_hour_total,
            "spot": price.spot,
            "cloud": price.cloud,
            "gpus": price.gpus,
            "source": price.source,
        },
        "attempts": attempts,
        "zones": [asdict(z) for z in zone_costs(ledger.attempts)],
        "totals": {
            "cost_usd": get("cost_usd"),
            "gpu_hours": get("gpu_hours"),
            "attempts": len(attempts),
            "preemptions": get("preemptions"),
            "steps": ledger.step,
            "tokens_trained": get("tokens_trained"),
            "tokens_per_step": tokens_per_step,
            "tokens_counted": "trainer num_tokens" if tokens_measured else "batch x grad-accum x world x max_length",
            "usd_per_step": get("usd_per_step"),
            "usd_per_million_tokens": get("usd_per_million_tokens"),
            "rollouts": get("rollouts"),
            "usd_per_1k_rollouts": get("usd_per_1k_rollouts"),
        },
        "lost_work": {
            "steps": get("lost_work_steps"),
            "seconds": get("lost_work_seconds"),
            "usd": get("lost_work_usd"),
        },
        "spot": {
            "on_demand_cost_usd": get("on_demand_cost_usd"),
            "savings_usd": get("spot_savings_usd"),
            "ran_on_spot": price.spot or any(a.spot for a in ledger.attempts),
        },
        "checkpointing_this_attempt": {
            "stall_s": get("attempt_checkpoint_stall_s"),
            "upload_s": get("attempt_checkpoint_upload_s"),
        },
        "evaluation_this_attempt": {"seconds": get("attempt_evaluation_s"), "usd": get("attempt_evaluation_usd")},
        "quality": {
            "metric": quality_metric,
            "value": quality,
            "before": quality_before,
            "gain_points": get("quality_gain_points"),
            "usd_per_point": get("usd_per_quality_point"),
        },
    }


@dataclass
class ZoneCost:
    """One zone's share of a job (``compute.zones``): its attempts, preemptions, hours, dollars, hourly prices."""

    zone: str
    region: Optional[str]
    attempts: int = 0
    preemptions: int = 0
    hours: float = 0.0
    cost_usd: float = 0.0
    usd_per_hour: list[float] = field(default_factory=list)  # each price an attempt there was billed at


def zone_costs(attempts: Iterable[AttemptEntry]) -> list[ZoneCost]:
    """Cost per zone: each zone the attempts ran in, in the order first used; [] when no attempt names one."""
    zones: dict[str, ZoneCost] = {}
    for a in attempts:
        if a.zone is None:
            continue
        z = zones.setdefault(a.zone, ZoneCost(a.zone, a.zone_region))
        z.attempts += 1
        z.preemptions += int(a.exit_class in INTERRUPTED_CLASSES)
        z.hours += entry_seconds(a) / SECONDS_PER_HOUR
        z.cost_usd += a.cost_usd
        if a.zone_usd_per_hour is not None and a.zone_usd_per_hour not in z.usd_per_hour:
            z.usd_per_hour.append(a.zone_usd_per_hour)
    return list(zones.values())


def zone_lines(zones: Iterable[ZoneCost]) -> list[str]:
    """The cost-per-zone table (``zone_costs``), as the report and ``orchestrator status`` print it."""
    zones = list(zones)
    if not zones:
        return []
    out = ["", f"{'zone':<16}  {'attempts':>8}  {'preempted':>9}  {'hours':>8}  {'cost_usd':>10}  usd_per_hour"]
    for z in zones:
        prices = ", ".join(f"{p:.4f}" for p in z.usd_per_hour) or "-"
        out.append(f"{z.zone:<16}  {z.attempts:>8}  {z.preemptions:>9}  {z.hours:>8.3f}  {z.cost_usd:>10.4f}  {prices}")
    return out


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a short plain-text table."""

    def num(value, fmt="{:.4f}") -> str:
        return "-" if value is None else fmt.format(value)

    price, totals, lost = report["price"], report["totals"], report["lost_work"]
    lines = [
        f"cost report of job {report['job']!r} ({report['status']})",
        f"price: ${price['usd_per_hour']:.4f}/h {'spot' if price['spot'] else 'on demand'} "
        f"(on demand: ${price['on_demand_usd_per_hour']:.4f}/h; {price['source']})",
        "",
        f"{'attempt':>7}  {'exit_class':<16}  {'duration_s':>10}  {'steps':>13}  {'cost_usd':>10}",
    ]
    for a in report["attempts"]:
        steps = f"{a['checkpoint_step_at_start']}->{a['step_end']}"
        lines.append(
            f"{a['fence']!s:>7}  {a['exit_class']!s:<16}  {a['duration_s']:>10.1f}  {steps:>13}  {a['cost_usd']:>10.4f}"
        )
    lines += zone_lines(ZoneCost(**z) for z in report.get("zones") or [])
    lines += [
        "",
        f"total: ${num(totals['cost_usd'])} over {totals['attempts']} attempt(s), {num(totals['preemptions'], '{}')} "
        f"preemption(s), {num(totals['gpu_hours'])} GPU-hours",
        f"per step: ${num(totals['usd_per_step'], '{:.6f}')}; per million tokens: ${num(totals['usd_per_million_tokens'])} "
        f"({num(totals['tokens_trained'], '{:.0f}')} tokens, counted from {totals['tokens_counted']})",
        *(
            [
                f"per 1k rollouts: ${num(totals['usd_per_1k_rollouts'])} ({num(totals['rollouts'], '{:.0f}')} rollouts "
                "trained on, a batch regenerated after a kill counted once)"
            ]
            if totals.get("usd_per_1k_rollouts")
            else []
        ),
        f"lost work: {num(lost['steps'], '{}')} step(s) redone, {num(lost['seconds'], '{:.1f}')}s, ${num(lost['usd'])}",
        _savings_line(report, num),
        f"checkpointing (this attempt): {num(report['checkpointing_this_attempt']['stall_s'], '{:.2f}')}s training "
        f"stalled, {num(report['checkpointing_this_attempt']['upload_s'], '{:.2f}')}s uploading",
    ]
    evaluation = report.get("evaluation_this_attempt") or {}
    if evaluation.get("seconds"):
        lines.append(
            f"benchmark evaluation (this attempt, not training): {evaluation['seconds']:.2f}s, "
            f"${num(evaluation.get('usd'), '{:.6f}')}"
        )
    quality = report["quality"]
    if quality["value"] is not None:
        lines.append(
            f"quality: {quality['metric']}={quality['value']:.4f} (before training: "
            f"{num(quality.get('before'))}; gain: {num(quality.get('gain_points'), '{:+.2f}')} points); "
            f"${num(quality['usd_per_point'], '{:.6f}')} per point gained"
        )
    return "\n".join(lines)


def _savings_line(report: Mapping[str, Any], num) -> str:
    spot = report["spot"]
    if not spot.get("ran_on_spot", True):
        return "spot savings: none (an on-demand job)"
    return (
        f"spot savings against an uninterrupted on-demand run: ${num(spot['savings_usd'])} "
        f"(that run: ${num(spot['on_demand_cost_usd'])}; negative: spot cost more)"
    )
