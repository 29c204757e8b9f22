"""``train.trial_steps=N``: print the plan beside what N steps measured; log both to MLflow."""

from __future__ import annotations

from typing import Any

from orchestrator.attempt.measure import gradient_bytes, peak_memory_bytes


def finish_trial(cfg, trainer, *, steps, money, tracking, step: int) -> None:
    """``steps``: the attempt's ``StepClock``; ``money``: its money watch; ``tracking``: its MLflow run."""
    from orchestrator.money.report import estimated_tokens_per_step
    from orchestrator.planning import cost as plan_cost
    from orchestrator.planning import memory as plan_memory
    from orchestrator.planning import plan

    measured: dict[str, Any] = plan.count_allocated_state_bytes(trainer.model, trainer.optimizer)
    measured["grads"] = gradient_bytes(trainer)  # the Trainer frees gradients after each step
    timing = steps.timing_metrics(reset=False, whole_run=True)
    measured.update(
        peak_memory_bytes=peak_memory_bytes(),
        step_time_s=timing.get("step_time_s"),
        data_wait_s=timing.get("data_wait_s"),
    )
    if measured["step_time_s"]:
        # every process's sequences (and DPO's chosen + rejected) count, as in the cost figures: the
        # trainer's own count of real tokens when it logged one (SFT, packed or not), else the padded bound
        tokens = money.figures.measured_tokens_per_step or estimated_tokens_per_step(cfg)
        measured["tokens_per_second"] = tokens / measured["step_time_s"]
    estimate = plan_memory.estimate_memory(cfg)
    cost = plan_cost.estimate_cost(cfg, money.price)
    print(plan.format_trial(estimate, measured, cost), flush=True)
    tracking.log_metrics({f"trial_{k}": float(v) for k, v in measured.items() if v is not None}, step)
    tracking.log_dict({"estimate": estimate.components, "measured": measured}, "trial.json")
