"""One outcome vocabulary: the table in orchestrator/core/exitcodes.py, and the classification of what ends an attempt."""
from __future__ import annotations

import subprocess

import pytest

from orchestrator.core import exitcodes
from orchestrator.attempt.failure import classify_exception
from orchestrator.core.errors import AlreadyCompleted, BudgetExhausted, CapsReached, ConfigError, DataError, Fenced
from orchestrator.core.exitcodes import OUTCOMES, ExitClass, RequeueClass, classify_exit


def test_every_exit_class_has_one_row_and_every_code_means_one_class():
    assert set(OUTCOMES) == set(ExitClass)
    codes = [o.exit_code for o in OUTCOMES.values() if o.exit_code is not None]
    assert len(codes) == len(set(codes))
    for exit_class, row in OUTCOMES.items():
        assert row.exit_class is exit_class
        if row.exit_code is not None:
            assert classify_exit(row.exit_code) is exit_class
    assert OUTCOMES[ExitClass.VANISHED].exit_code is None  # nobody exits: the process was killed
    assert classify_exit(-9) is ExitClass.VANISHED and classify_exit(137) is ExitClass.VANISHED
    assert classify_exit(2) is ExitClass.CRASHED


def test_requeue_classes_follow_skypilot():
    by_class = {c: o.requeue for c, o in OUTCOMES.items()}
    assert {c for c, r in by_class.items() if r is RequeueClass.PREEMPTION} == {ExitClass.PREEMPTED, ExitClass.VANISHED}
    assert by_class[ExitClass.CRASHED] is RequeueClass.FAILURE
    assert by_class[ExitClass.OUT_OF_MEMORY] is RequeueClass.OUT_OF_MEMORY and OUTCOMES[ExitClass.OUT_OF_MEMORY].failure
    assert exitcodes.FINAL_CLASSES == {ExitClass.COMPLETED, ExitClass.BUDGET_EXHAUSTED, ExitClass.CONFIG_ERROR,
                                       ExitClass.CAPS_REACHED, ExitClass.FENCED}
    assert exitcodes.final_codes() == [0, 3, 4, 5, 6]


def test_mlflow_statuses_are_mlflows_own_terminal_statuses():
    from mlflow.entities import RunStatus

    for row in OUTCOMES.values():
        if row.mlflow_status is not None:
            assert RunStatus.is_terminated(RunStatus.from_string(row.mlflow_status)), row


def test_the_ledger_takes_each_outcomes_status(tmp_path):
    from orchestrator.records.ledger import Ledger
    from orchestrator.storage import LocalStore

    store = LocalStore(tmp_path)
    for exit_class, row in OUTCOMES.items():
        if row.ledger_status is None:
            continue  # a fenced attempt writes nothing
        assert row.ledger_status in exitcodes.RUN_STATUSES
        ledger = Ledger(store, f"job-{exit_class.value}")
        ledger.begin_attempt(host="h", pid=1, instance_type="cpu", gpu_type="none", gpus=0, spot=False,
                             checkpoint_step=0)
        record = ledger.end_attempt(exit_class, step=1, cost_usd=0.0)
        assert (record["attempts"][-1]["exit_class"], record["status"]) == (exit_class.value, row.ledger_status)


def _sbatch_decision(script: str, code: int) -> str:
    """What the rendered sbatch script's own ``case`` does with a worker that exited ``code``, run by bash."""
    start = script.index('case "$rc" in')
    block = script[start:script.index("\nesac", start) + 5]
    done = subprocess.run(["bash", "-c", f"rc={code}\nSLURM_JOB_ID=1\n{block}\necho requeue"], capture_output=True,
                          text=True, timeout=30)
    return "requeue" if done.stdout.strip() == "requeue" else f"stop, exit {done.returncode}"


def _pod_failure_action(rules: list[dict], code: int) -> str:
    """Kubernetes' podFailurePolicy: the first rule whose ``onExitCodes`` holds ``code``; none counts a failure."""
    for rule in rules:
        on = rule.get("onExitCodes")
        if on and on["operator"] == "In" and code in on["values"]:
            return rule["action"]
    return "Count"


# every code a worker exits with (a crash's 1, a kill's 137 too) and what a user counts on each engine doing with it
WORKER_CODES = sorted({row.exit_code for row in OUTCOMES.values() if row.exit_code is not None} | {1, 137})


@pytest.mark.parametrize("code", WORKER_CODES)
def test_each_engine_stops_a_final_exit_and_requeues_the_others_as_the_table_says(code):
    """A config error (4), a spent budget (3), the caps (5), a fenced attempt (6) and a completed job (0) end the job
    on every backend; a preemption (75) is requeued without spending the failure budget; a crash, an OOM and a
    killed worker are requeued as failures. Read off what each backend renders (the sbatch script's own ``case``
    run by bash, the Kubernetes Job's podFailurePolicy, SkyPilot's recover_on_exit_codes), not off its constants."""
    import yaml

    from orchestrator.backends import get_backend
    from tests.helpers.backends import compose

    exit_class = classify_exit(code)
    final = exit_class in exitcodes.FINAL_CLASSES
    assert final is (code in (0, 3, 4, 5, 6)), (code, exit_class)

    script = get_backend("slurm").render(*compose("slurm"))
    assert _sbatch_decision(script, code) == (f"stop, exit {code}" if final else "requeue"), script

    manifest = yaml.safe_load(get_backend("kubernetes").render(*compose("kubernetes", "backend.image=img:1")))
    rules = manifest["spec"]["podFailurePolicy"]["rules"]
    if code != 0:  # a pod that exits 0 succeeded: no failure policy is asked
        expected = "Ignore" if exit_class is ExitClass.PREEMPTED else "FailJob" if final else "Count"
        assert _pod_failure_action(rules, code) == expected, rules

    task = yaml.safe_load(get_backend("skypilot").render(*compose("skypilot")))
    recovers = code in task["resources"]["job_recovery"]["recover_on_exit_codes"]
    assert recovers is (exit_class is ExitClass.PREEMPTED), task["resources"]["job_recovery"]


@pytest.mark.parametrize("error,exit_class,code", [
    (ConfigError("x"), ExitClass.CONFIG_ERROR, 4), (DataError("x"), ExitClass.CONFIG_ERROR, 4),
    (CapsReached("x"), ExitClass.CAPS_REACHED, 5), (BudgetExhausted("x"), ExitClass.BUDGET_EXHAUSTED, 3),
    (Fenced("x"), ExitClass.FENCED, 6), (AlreadyCompleted("x"), ExitClass.COMPLETED, 0),
])
def test_user_errors_keep_their_class(error, exit_class, code):
    result = classify_exception(error)
    assert (result.exit_class, result.exit_code, result.bug) == (exit_class, code, False)
    assert error.exit_code == code
    assert result.record == (exit_class is not ExitClass.FENCED)


def _raised(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the real exception, with its real traceback
        return err
    raise AssertionError("expected an exception")


def test_an_unknown_scheduler_refused_by_transformers_is_a_config_error(tmp_path):
    from transformers import TrainingArguments

    err = _raised(lambda: TrainingArguments(output_dir=str(tmp_path), lr_scheduler_type="cosine_annealing",
                                            use_cpu=True, report_to=[]))
    result = classify_exception(err)
    assert result.exit_class is ExitClass.CONFIG_ERROR and result.exit_code == 4 and not result.bug
    assert result.message.startswith("train.lr_scheduler: ") and "cosine_annealing" in result.message
    assert "linear, cosine" in result.message


def test_a_scheduler_that_needs_arguments_is_a_config_error():
    import torch
    from transformers.optimization import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    for name in ("cosine_with_min_lr", "warmup_stable_decay"):  # a ValueError, then a TypeError
        err = _raised(lambda: get_scheduler(name, optimizer=optimizer, num_warmup_steps=0, num_training_steps=10))
        assert classify_exception(err).exit_class is ExitClass.CONFIG_ERROR, (name, err)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=32))


def test_lora_target_modules_the_model_lacks_are_a_config_error():
    from peft import LoraConfig, get_peft_model

    err = _raised(lambda: get_peft_model(_tiny_llama(), LoraConfig(target_modules=["c_attn"], task_type="CAUSAL_LM")))
    result = classify_exception(err)
    assert result.exit_class is ExitClass.CONFIG_ERROR
    assert result.message.startswith("recipe.lora_target_modules: ") and "c_attn" in result.message
    # a module LoRA cannot wrap (a norm layer) too
    err = _raised(lambda: get_peft_model(_tiny_llama(), LoraConfig(target_modules=["input_layernorm"],
                                                                   task_type="CAUSAL_LM")))
    assert classify_exception(err).exit_class is ExitClass.CONFIG_ERROR, err


def test_our_own_value_errors_stay_crashes():
    result = classify_exception(_raised(lambda: int("not a number")))
    assert result.exit_class is ExitClass.CRASHED and result.bug and result.exit_code == 1
    # a message that looks like a library's is not enough: where it was raised matters
    result = classify_exception(_raised(lambda: (_ for _ in ()).throw(ValueError("x is not a valid SchedulerType"))))
    assert result.exit_class is ExitClass.CRASHED


def test_out_of_memory_names_the_fix_for_this_config():
    import torch

    from orchestrator.app.compose import compose_config

    cfg = compose_config(["compute=l4-spot", "train.per_device_batch_size=8", "train.gradient_accumulation_steps=2"])
    err = _raised(lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")))
    result = classify_exception(err, cfg)
    assert result.exit_class is ExitClass.OUT_OF_MEMORY and result.exit_code == 7
    text = result.message
    assert "train.per_device_batch_size=4 with train.gradient_accumulation_steps=4" in text, text
    assert "train.gradient_checkpointing=true" in text and "requeue.max_oom_retries" in text
    assert "GB" in text.split("more memory (", 1)[1], text  # bigger GPUs from the catalog, with their memory


def test_wrapped_and_host_out_of_memory_errors_are_out_of_memory():
    def wrapped():
        try:
            raise RuntimeError("CUDA error: out of memory.")
        except RuntimeError as inner:
            raise RuntimeError("DeepSpeed step failed") from inner

    assert classify_exception(_raised(wrapped)).exit_class is ExitClass.OUT_OF_MEMORY
    host = classify_exception(_raised(lambda: bytearray(1 << 62)))
    assert host.exit_class is ExitClass.OUT_OF_MEMORY and "host memory" in host.message
