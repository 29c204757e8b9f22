"""The names the job's metrics have in MLflow: sections MLflow's charts group by, and the headline figures.

MLflow's charts group a run's metrics by the part of the name before the first ``/``. The
Trainer's own (TRL's ``loss``, ``eval_loss``, ``learning_rate``, ``grad_norm``, ...) keep the
names TRL gives them, so a ``quality_metric`` such as ``eval_accuracy`` and any dashboard built
on them keep working; the orchestrator's own go in sections of their own:

    cost/    what the job has cost and bought: ``cost/gpu_hours``, ``cost/usd_per_step``, lost work, savings
    ops/     how it ran: step and data-wait times, memory, checkpointing, the interval, attempts, preemptions,
             restarts, a trial's measurements
    bench/   the benchmark scores (``orchestrator.evaluation``), already named so
    system/  MLflow's own sampling of CPU, GPU and memory

The headline figures stay at the top level, unprefixed, where the runs table's column chooser lists them
beside the Trainer's: ``cost_usd`` (the job's cost so far, and its final total once the run ends; the
x-axis of the score-against-dollars chart, logged at the same steps as the scores), and, set at the run's
end, ``score`` (the job's ``quality_metric``), ``score_gain_points`` and ``usd_per_point``.
"""

from __future__ import annotations

COST = "cost/"
OPS = "ops/"

# the headline figures the run's end sets (``orchestrator.attempt.reporting``)
HEADLINE_COST = "cost_usd"
HEADLINE_SCORE = "score"
HEADLINE_GAIN = "score_gain_points"
HEADLINE_USD_PER_POINT = "usd_per_point"

_COST_KEYS = (
    "attempt_cost_usd",
    "gpu_hours",
    "tokens_trained",
    "on_demand_cost_usd",
    "spot_savings_usd",
    "usd_per_step",
    "usd_per_million_tokens",
    "rollouts",
    "usd_per_1k_rollouts",
    "lost_work_steps",
    "lost_work_seconds",
    "lost_work_usd",
    "attempt_evaluation_usd",
)
_OPS_KEYS = (
    "attempts",
    "preemptions",
    "step_time_s",
    "data_wait_s",
    "peak_memory_bytes",
    "tokens_per_second",
    "attempt_checkpoint_stall_s",
    "attempt_checkpoint_upload_s",
    "attempt_evaluation_s",
    "checkpoint_interval_s",
    "checkpoint_cost_s",
    "preemptions_per_hour",
    "preemption_notice_share",
    "mean_s_between_lossy_preemptions",
    "capacity_on_demand",
)
_OPS_PREFIXES = ("restart_", "trial_")
# the run's end logs the cost report's quality figures under the headline names
_RENAMED = {"quality_gain_points": HEADLINE_GAIN, "usd_per_quality_point": HEADLINE_USD_PER_POINT}

SECTION = {**{k: COST + k for k in _COST_KEYS}, **{k: OPS + k for k in _OPS_KEYS}, **_RENAMED}


def metric_name(key: str) -> str:
    """The MLflow name of the job's metric ``key`` (``SECTION``); the Trainer's and anything named with a
    section already pass unchanged. A dictionary look-up: it runs at every logging step."""
    found = SECTION.get(key)
    if found is not None:
        return found
    if key.startswith(_OPS_PREFIXES):
        return OPS + key
    return key
