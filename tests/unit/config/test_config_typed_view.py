"""The typed view of the config (``orchestrator.config.typed``) changes nothing a checkpoint or a reader compares.

``tests/fixtures/config_typed_view.json`` holds, for a few composed jobs, what the code wrote before the parts
read the typed view (commit 582fb75, before the sweep's and the cloud's choices became ``StrEnum`` fields and
the durations were parsed once): the trajectory fingerprint stored in every checkpoint's manifest and the
``config.yaml`` beside the final weights. A checkpoint of such a job must pass today's resume check, and today's
``config.yaml`` must hold the old text line for line (keys added since may sit between them).
"""
from __future__ import annotations

import json

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.attempt.resolved import resolve
from orchestrator.checkpoint.fingerprint import check_resumable, trajectory_config
from tests.helpers.paths import FIXTURES

FIXTURE = FIXTURES / "config_typed_view.json"

JOBS = {
    "default": [],
    "spot-auto-deadline": ["compute=a10g-spot", "compute.cloud=aws", "checkpoint.every=auto",
                           "checkpoint.min_every=2m", "checkpoint.max_every=45m", "run.deadline=52h",
                           "storage.retry_for=90s", "pricing.max_age=30m", "preemption.grace=20s"],
    "sweep-asha": ["sweep=asha", "sweep.budget_usd=5", "sweep.n_trials=4", "sweep.sampler=tpe",
                   "sweep.direction=minimize", "sweep.pruner=hyperband", "checkpoint.every=90s",
                   "compute.cloud=gcp", "recipe=dpo"],
    "sweep-grid-steps": ["sweep=grid", "sweep.budget_usd=2", "checkpoint.every=off", "checkpoint.every_steps=10",
                         "budget.monthly_max_usd=100", "budget.reserve_ahead=2m", "compute.cloud=azure"],
}


def serialised(overrides: list[str]) -> dict:
    """What a job of these overrides writes that a later attempt or a reader compares against."""
    cfg = compose_config(overrides + ["storage.uri=/runs", "run.work_dir=/work"])
    return {"trajectory": json.loads(json.dumps(trajectory_config(cfg), sort_keys=True)),
            "config_yaml": resolve(cfg).yaml}


def _stored() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_checkpoint_written_before_the_typed_view_resumes(job):
    stored = _stored()[job]
    cfg = compose_config(JOBS[job] + ["storage.uri=/runs", "run.work_dir=/work"])
    manifest = {"step": 20, "fence": 1, "meta": {"trajectory": stored["trajectory"], "dataset_fingerprint": "d" * 64}}
    check_resumable(manifest, trajectory_config(cfg), "d" * 64, cfg)  # raises ConfigError naming a changed field
    assert trajectory_config(cfg) == stored["trajectory"]


def _missing(old: list[str], new: list[str]) -> list[str]:
    """The lines of ``old`` from the first one ``new`` does not hold in the same order (keys added since may sit
    between the old lines; nothing else may change)."""
    rest = iter(new)
    return [line for line in old if not any(line == other for other in rest)]


@pytest.mark.parametrize("job", sorted(JOBS))
def test_config_yaml_holds_the_old_text_line_for_line(job):
    now, before = serialised(JOBS[job]), _stored()[job]
    assert "!!python" not in now["config_yaml"]
    assert _missing(before["config_yaml"].splitlines(), now["config_yaml"].splitlines()) == []


if __name__ == "__main__":  # regenerate the fixture (only when the serialisation is meant to change)
    FIXTURE.write_text(json.dumps({name: serialised(o) for name, o in JOBS.items()}, indent=1, sort_keys=True) + "\n")


def test_the_view_holds_the_groups_as_dataclasses_and_the_durations_parsed():
    from orchestrator.config.schema import CheckpointConfig, DpoRecipeConfig
    from orchestrator.config.typed import JobConfig
    from orchestrator.core.durations import Every

    cfg = compose_config(JOBS["spot-auto-deadline"] + ["recipe=dpo", "storage.uri=/runs", "run.work_dir=/work"])
    job = JobConfig.of(cfg)
    assert isinstance(job.checkpoint, CheckpointConfig) and isinstance(job.recipe, DpoRecipeConfig)
    assert job.durations.checkpoint_every == Every(auto=True, seconds=0.0)
    assert job.durations.checkpoint_bounds == (120.0, 2700.0)
    assert job.durations.deadline == ("after", 52 * 3600.0)
    assert (job.durations.storage_retry_for, job.durations.pricing_max_age, job.durations.preemption_grace) == (
        90.0, 1800.0, 20.0)
    fixed = JobConfig.of(compose_config(["checkpoint.every=90s", "storage.uri=/runs", "run.work_dir=/work"]))
    assert fixed.durations.checkpoint_every == Every(auto=False, seconds=90.0)
    off = JobConfig.of(compose_config(["checkpoint.every=off", "storage.uri=/runs", "run.work_dir=/work"]))
    assert off.durations.checkpoint_every.off


def test_every_bad_duration_is_named_at_launch_each_as_its_own_problem():
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        compose_config(["checkpoint.every=soon", "storage.retry_for=a-while", "checkpoint.min_every=2h",
                        "storage.uri=/runs", "run.work_dir=/work"])
    text = str(err.value)
    assert "3 problems in the config" in text, text
    for needle in ("checkpoint.every='soon'", "storage.retry_for='a-while'", "checkpoint.min_every='2h'"):
        assert needle in text, (needle, text)


@pytest.mark.parametrize("override,allowed", [("sweep.sampler=bayes", "random, tpe, grid"),
                                              ("sweep.pruner=median", "none, successive_halving, hyperband, asha"),
                                              ("sweep.direction=up", "auto, maximize, minimize")])
def test_a_sweep_choice_outside_its_values_is_refused_at_compose_naming_them(override, allowed):
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        compose_config([override, "storage.uri=/runs", "run.work_dir=/work"])
    assert err.value.exit_code == 4 and f"choose one of: {allowed}." in str(err.value), str(err.value)
