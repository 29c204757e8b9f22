"""Restart overhead: the time from process start to the attempt's first optimizer step, measured and split.

On short-lived capacity goodput is decided by this time, paid again at every restart. The
split is a timeline: contiguous phases that add up to the total.

    imports_s               process start -> the attempt's parts are made (interpreter, torch and
                            transformers, Hydra's composition), plus the import of TRL before the build
    setup_s                 the parts, the ledger's begin, MLflow, the dataset read and its fingerprint
    model_load_s            tokenizer and ``from_pretrained`` (the checkpoint downloads meanwhile)
    data_prep_s             the trainer's construction: TRL's tokenisation, or the prepared-dataset
                            cache (``orchestrator.attempt.datacache``), and the PEFT wrap
    checkpoint_wait_s       waiting for the checkpoint's download and verification after the build
    restore_s               the Trainer loading weights, optimizer, scheduler (a fresh start: the
                            "before" evaluation instead)
    first_step_s            the first optimizer step (RNG restore, the sampler's skip, forward, backward)
    total_s                 their sum: process start -> end of the first step

``checkpoint_download_s`` (download and verify, overlapped with the model load), ``cpu_s`` (the
process's CPU seconds to the end of the first step: a figure a loaded machine disturbs less) and ``forked`` (1: the
attempt was forked from its supervisor, ``orchestrator.process.warm_start``, whose import of the stack before the first
attempt is on that attempt's timeline and in its ``cpu_s``; 0: a fresh interpreter) are reported beside them; only what the build did not hide of it is on the timeline (``checkpoint_wait_s``). The split
goes into the ledger's attempt entry (``extra.restart``) and MLflow (``restart_<phase>``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, cast

from transformers import TrainerCallback

log = logging.getLogger(__name__)

PHASES = ("imports_s", "setup_s", "model_load_s", "data_prep_s", "checkpoint_wait_s", "restore_s", "first_step_s")


def process_start_time() -> float:
    """Unix time this attempt's process started (the kernel's record, so the interpreter's own start-up counts);
    a forked attempt's: when its supervisor began the start-up it inherited (``orchestrator.process.warm_start``)."""
    import psutil

    from orchestrator.attempt.start_up import inherited as inherited_start_up

    inherited = inherited_start_up()
    return inherited.started_at if inherited else float(psutil.Process().create_time())


def process_cpu_seconds() -> float:
    """User and system CPU seconds this attempt's process (every thread) has used so far, with what a forked
    attempt's supervisor spent on its start-up."""
    import psutil

    from orchestrator.attempt.start_up import inherited as inherited_start_up

    inherited = inherited_start_up()
    times = psutil.Process().cpu_times()
    return float(times.user + times.system) + (inherited.cpu_s if inherited else 0.0)


def forked() -> bool:
    from orchestrator.attempt.start_up import inherited

    return inherited() is not None


def inherited_source() -> str:
    from orchestrator.attempt.start_up import inherited

    return cast(Any, inherited()).source if inherited() else ""


class RestartClock:
    """Marks on the attempt's start-up timeline (unix times); ``split()`` turns them into phases.

    The parts that reach each point mark it: the builder (``parts``), the checkpoint controller
    (``data_read`` when the dataset's fingerprint is known, ``restored`` after the download is joined),
    the recipe wrapper (``built``, with the import and model-load seconds inside the build), and
    :class:`RestartCallback` (``train_begin``, ``first_step``).
    """

    def __init__(self, started_at: Optional[float] = None, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.marks: dict[str, float] = {"start": process_start_time() if started_at is None else started_at}
        self.inside: dict[str, float] = {"imports_s": 0.0, "model_load_s": 0.0}  # seconds measured within a phase
        self.download_s: Optional[float] = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, self.clock())

    def add(self, name: str, seconds: float) -> None:
        self.inside[name] = self.inside.get(name, 0.0) + max(0.0, float(seconds))

    def split(self) -> dict:
        """The phases in seconds (a phase whose ends were not marked is left out)."""
        m, inside = self.marks, self.inside

        def between(a: str, b: str) -> Optional[float]:
            return max(0.0, m[b] - m[a]) if a in m and b in m else None

        build = between("data_read", "built")
        out = {
            "imports_s": (between("start", "parts") or 0.0) + inside["imports_s"],
            "setup_s": between("parts", "data_read"),
            "model_load_s": inside["model_load_s"],
            "data_prep_s": None if build is None else max(0.0, build - inside["imports_s"] - inside["model_load_s"]),
            "checkpoint_wait_s": between("built", "restored"),
            "restore_s": between("restored", "train_begin"),
            "first_step_s": between("train_begin", "first_step"),
            "total_s": between("start", "first_step"),
        }
        if self.download_s is not None:
            out["checkpoint_download_s"] = self.download_s
        return {k: round(v, 4) for k, v in out.items() if v is not None}


class RestartCallback(TrainerCallback):
    """Marks the Trainer's start and the first step's end; then reports the split once.

    ``report(split, step)`` writes it (the ledger and MLflow, main rank only).
    """

    def __init__(self, clock: RestartClock, report: Callable[[dict, int], None]):
        self.clock = clock
        self.report = report
        self.done = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.clock.mark("train_begin")

    def on_step_end(self, args, state, control, **kwargs):
        if self.done:
            return
        self.done = True
        self.clock.mark("first_step")
        split = dict(self.clock.split(), cpu_s=round(process_cpu_seconds(), 4))
        log.info(
            "restart overhead (process start to first step, resumed at step %d%s): %s",
            state.global_step - 1,
            f", forked from {inherited_source()}" if forked() else "",
            ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in split.items()),
        )
        split["forked"] = 1.0 if forked() else 0.0
        try:
            self.report(split, state.global_step)
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            log.warning("could not record the restart overhead: %s", err)


class MeasuredRecipe:
    """The recipe module, with its build timed and its training set prepared through the cache.

    Everything but ``build_trainer`` is the recipe's own (``QUALITY_METRIC``, ``evaluate``, ...).
    """

    def __init__(
        self,
        recipe: Any,
        clock: RestartClock,
        *,
        cache: Any = None,
        data_fingerprint: Callable[[], str],
        report: Callable[[dict, int], None],
    ):
        self._recipe = recipe
        self.clock = clock
        self.cache = cache
        self.data_fingerprint = data_fingerprint
        self.report = report

    def __getattr__(self, name: str):
        return getattr(self._recipe, name)

    def build_trainer(self, cfg, *, train_dataset, eval_dataset, output_dir: str, callbacks: list, **extra):
        from recipes import common
        from recipes.data import fingerprint

        started = time.monotonic()
        import trl  # noqa: F401 - TRL is imported here, lazily, by the recipes; timed as an import

        self.clock.add("imports_s", time.monotonic() - started)
        # the held-out rows are prepared and cached with the training set: both are in the key
        prepared = data_fp = None
        if self.cache is not None:
            data_fp = self.data_fingerprint() + ("" if eval_dataset is None else ":" + fingerprint(eval_dataset))
            prepared = self.cache.load(cfg, data_fp, splits=("train",) if eval_dataset is None else ("train", "eval"))
        if prepared is not None:
            extra["prepared"] = prepared
        with common.timed_loads() as loads:
            trainer = self._recipe.build_trainer(
                cfg,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                output_dir=output_dir,
                callbacks=[RestartCallback(self.clock, self.report), *callbacks],
                **extra,
            )
        self.clock.add("model_load_s", loads.seconds)
        self.clock.mark("built")
        if prepared is None and self.cache is not None:
            self.cache.save_later(cfg, data_fp, trainer)
        return trainer
