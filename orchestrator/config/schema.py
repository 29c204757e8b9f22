"""Typed schemas of every config group, registered in Hydra's ConfigStore.

YAML under ``conf/`` holds values only; these dataclasses say which keys exist,
their types and what they mean. Composing against them makes a wrong key, type
or choice fail before any training starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from orchestrator.core.choices import (
    Backend,
    DataSource,
    Direction,
    Distributed,
    Dtype,
    EvalMetric,
    FinalWeights,
    MixedPrecision,
    MixSource,
    PackingStrategy,
    Peft,
    Progress,
    Provider,
    Pruner,
    Quantization,
    Recipe,
    Sampler,
    VllmMode,
)
from orchestrator.core.durations import MAX_EVERY, MIN_EVERY


@dataclass
class RunConfig:
    name: str = "default"  # names the job: the same name means the same job (resume)
    work_dir: str = ".cache/work"  # local scratch for staging checkpoints; never the source of truth
    notes: dict[str, Any] = field(
        default_factory=dict
    )  # free-form values kept with the job (MLflow params, config.yaml), read by nothing: +run.notes.NAME=VALUE
    deadline: Optional[str] = (
        None  # finish by: a duration from the job's first attempt (52h) or an ISO-8601 time (UTC if no zone); spot while on schedule, on-demand when behind
    )


@dataclass
class RecipeConfig:
    name: Recipe = MISSING  # sft | dpo | qlora | grpo
    peft: Peft = Peft.lora  # lora | full (full fine-tune; sft and grpo)
    lora_r: int = 8  # LoRA rank: adapter size and capacity
    lora_alpha: int = 16  # usually 2 x lora_r
    lora_dropout: float = 0.0  # dropout on the adapters' input (resume stays exact: RNG is checkpointed)
    lora_target_modules: list[str] = field(  # modules that get adapters: every linear layer of Llama/Qwen blocks
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    quantization: Quantization = (
        Quantization.none
    )  # none | nf4: a 4-bit NF4 base under LoRA (qlora sets it; sft and dpo honour it)
    eval_generate_max_new_tokens: int = 8  # tokens generated per held-out prompt for the generation metric
    eval_metric: EvalMetric = (
        EvalMetric.auto
    )  # auto (first number on data=synthetic, else exact_match) | exact_match | contains | none


@dataclass
class DpoRecipeConfig(RecipeConfig):
    """recipe=dpo: the common recipe keys and DPO's own (an SFT job has no ``recipe.dpo_beta``)."""

    dpo_beta: float = 0.1  # DPO: strength of the pull toward the reference model
    precompute_ref_log_probs: bool = False  # DPO: reference log-probs computed once, stored with the checkpoints


@dataclass
class GrpoRecipeConfig(RecipeConfig):
    """recipe=grpo: TRL's GRPOTrainer, its own option names (docs/grpo.md)."""

    reward_funcs: list[str] = (
        field(  # "pkg.mod:fn" or TRL's "pkg.mod.fn" import paths, or TRL's named rewards (think_format_reward, ...); shipped: recipes.rewards:exact_answer, :answer_format
            default_factory=lambda: ["recipes.rewards:exact_answer", "recipes.rewards:answer_format"]
        )
    )
    reward_weights: Optional[list[float]] = None  # one weight per reward function (None: all 1.0)
    num_generations: int = 4  # completions sampled per prompt (the group advantages are relative to)
    steps_per_generation: Optional[int] = None  # micro-batches trained per generation batch (None: grad. accumulation)
    generation_batch_size: Optional[int] = None  # completions per generation (instead of steps_per_generation)
    num_iterations: int = 1  # passes over each generation batch (PPO-style epochs)
    beta: float = 0.0  # KL coefficient against the reference model (0: no reference model held)
    max_completion_length: int = 8  # tokens sampled per completion
    temperature: float = 1.0  # sampling temperature of the rollouts
    use_vllm: bool = False  # generate with vLLM (CUDA only)
    vllm_mode: VllmMode = VllmMode.colocate  # colocate | server
    reward_cache: bool = True  # rewards kept by (prompt id, completion hash) beside the checkpoints


@dataclass
class ModelConfig:
    name_or_path: str = MISSING  # a hub id or a local folder; "builtin:tiny-llama" builds one locally
    preset: str = "custom"  # name of the preset, for tags and the planner
    dtype: Dtype = (
        Dtype.float32
    )  # float32 | bfloat16 | float16: how the weights are stored (compute: train.mixed_precision)
    revision: Optional[str] = None  # hub model: a branch, tag or commit; the launcher pins it to the commit it names
    attn_implementation: Optional[str] = (
        None  # eager | sdpa | flash_attention_2 | flash_attention_3 | flex_attention (None: the model's default)
    )
    trust_remote_code: bool = False  # let from_pretrained run the model repository's own code
    # for builtin:tiny-llama only
    hidden_size: int = 64  # builtin:tiny-llama only: width
    num_layers: int = 2  # builtin:tiny-llama only: decoder blocks
    num_heads: int = 4  # builtin:tiny-llama only: attention heads
    vocab_size: int = 512  # builtin:tiny-llama only: BPE vocabulary trained on the built-in task


@dataclass
class MixSourceConfig:
    """One source of ``data.mix``: drawn with probability weight / sum of weights, deterministically."""

    source: MixSource = MixSource.jsonl  # jsonl | hub | synthetic
    path: Optional[str] = None  # jsonl: the file; hub: the dataset id
    split: str = "train"  # hub: the split
    revision: Optional[str] = None  # hub: a branch, tag or commit (used as given: give a commit to pin it)
    weight: float = 1.0  # share of the mix: weight / sum of the weights
    num_examples: int = 1200  # synthetic only
    seed: int = 1234  # synthetic only


@dataclass
class DataConfig:
    source: DataSource = DataSource.synthetic  # synthetic | jsonl | hub | mix (data.mix)
    path: Optional[str] = None  # jsonl: the file; hub: the dataset id
    split: str = "train"  # hub: the training split
    eval_split: Optional[str] = None  # hub: an eval split; else a slice of train is held out
    eval_fraction: float = 0.1  # share of the data held out for evaluation when there is no eval_split
    max_eval_examples: int = 64  # cap on the held-out examples
    num_examples: int = 1200  # synthetic only
    seed: int = 1234  # synthetic generation and held-out split
    max_length: int = 64  # tokens per example (longer ones are truncated); with train.packing, tokens per packed row
    revision: Optional[str] = None  # hub dataset: a branch, tag or commit; the launcher pins it to the commit it names
    chat_template: Optional[str] = (
        None  # None: the tokenizer's own; a TRL template name (llama3, qwen2_5, ...) or a .jinja file
    )
    mix: list[MixSourceConfig] = field(default_factory=list)  # data.source=mix: the sources, each with a weight
    num_proc: Optional[int] = None  # processes for tokenising and packing (TRL's dataset_num_proc; None: one)
    prepared_cache: bool = (
        True  # SFT: keep the tokenised training set in <storage.uri>/_prepared/ so restarts skip tokenising
    )


@dataclass
class TrainConfig:
    max_steps: int = 300  # optimizer steps to train (<= 0: train for num_epochs)
    num_epochs: float = 1.0  # used when max_steps <= 0
    per_device_batch_size: int = 8  # micro-batch per process
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step
    learning_rate: Optional[float] = (
        None  # peak learning rate; null: auto, TRL's choice for the recipe and adapters (2e-4 LoRA SFT, 2e-5 full, 5e-6 DPO LoRA, ...; 5e-3 for the built-in tiny model): config/defaults.py
    )
    lr_scheduler: str = "linear"  # a transformers scheduler name: linear, cosine, constant, ...
    warmup_steps: int = 0  # linear warm-up steps
    warmup_ratio: Optional[float] = (
        None  # TRL's: warm-up as a fraction of the training steps, in [0, 1) (instead of warmup_steps)
    )
    weight_decay: float = 0.0  # AdamW weight decay
    seed: int = 42  # seeds model init, dropout and the data order
    logging_steps: int = 10  # log metrics (to MLflow too) every N optimizer steps
    eval_at_end: bool = True  # evaluate on the held-out split after training
    eval_steps: int = (
        0  # also evaluate loss and the quality metric (MLflow curves) every N optimizer steps (0: only at the end)
    )
    early_stopping_patience: int = 0  # stop (completed) after N evaluations without a better quality metric (0: off)
    early_stopping_threshold: float = 0.0  # how much the quality metric must beat its best by to count as better
    early_stopping_metric: Optional[str] = (
        None  # what early stopping and checkpoint.final=best select on: null (the quality metric) or bench/<task>/<metric> (beyond noise)
    )
    trial_steps: int = 0  # >0: run this many steps, print plan vs measurement, stop
    pause_at_step: int = 0  # >0: stop with a checkpoint at this optimizer step, exit 3 (a sweep's rung; relaunch with a larger one to go on)
    gradient_checkpointing: Optional[bool] = (
        None  # recompute activations in backward: less memory, ~30% slower; null: auto, on (as TRL) except for the built-in tiny model
    )
    packing: bool = False  # TRL's packing (sft, qlora): several examples per row of data.max_length tokens, no padding
    packing_strategy: PackingStrategy = (
        PackingStrategy.bfd
    )  # TRL's: bfd (best fit, padding-free, cuts overflow) | bfd_split (splits it) | wrapped
    padding_free: bool = False  # TRL's: one flattened sequence per batch, no pad tokens (on with bfd packing; sft only)
    mixed_precision: MixedPrecision = MixedPrecision.auto  # auto | no | bf16 | fp16 (accelerate's): autocast compute; fp16 adds loss scaling (CUDA only); auto: bf16 on a GPU with it, fp16 on one without, no on CPU
    tf32: Optional[bool] = None  # CUDA Ampere+: TF32 matmuls for float32 compute (None: torch's default, off)
    optim: str = (
        "adamw_torch_fused"  # the Trainer's optimizer name (its default here): adamw_torch, paged_adamw_8bit, ...
    )
    max_grad_norm: float = 1.0  # gradient clipping by global norm (0: off)
    dataloader_num_workers: int = 0  # processes that collate batches ahead of the training loop (0: in the loop)


@dataclass
class ComputeConfig:
    name: str = "cpu"  # the preset's name (conf/compute/)
    gpu_type: str = "none"  # key into the price catalog (conf/pricing.yaml)
    gpus_per_node: int = 0  # GPUs per machine (0: CPU)
    nodes: int = 1  # machines
    spot: bool = False  # spot/preemptible capacity (priced at the catalog's spot rate)
    cloud: str = "any"  # aws | gcp | azure | any (the catalog's cheapest)
    price_per_hour: Optional[float] = None  # overrides the catalog; USD per GPU-hour (per node-hour for cpu)
    memory_gb: Optional[float] = None  # GPU memory per device, from the catalog when unset
    allow_idle_gpus: bool = False  # let a job bill more GPUs than it starts training processes for (refused otherwise)
    preemptions_per_hour: Optional[float] = (
        None  # expected preemptions per hour of the whole job on this capacity (on-demand too: a partition that requeues); unset: spot, the catalog's per-machine prior x nodes, blended with the job's history; on-demand, none
    )
    restart_seconds: Optional[float] = (
        None  # one restart (start to first step after a restore); unset: measured, else estimated
    )
    zones: Any = None  # where the job may run: unset (the backend's default zone), auto (every zone with a fetched price for the GPU type), or [us-east-1a,us-west-2b]: each attempt goes to the zone of least expected dollars per useful hour (orchestrator.policy.placement)
    zone_cooldown: str = "10m"  # a zone that just preempted the job is avoided this long while another has capacity


@dataclass
class StorageConfig:
    uri: str = ".cache/runs"  # a folder, file://..., or s3://bucket/prefix
    endpoint_url: Optional[str] = None  # S3-compatible stores (MinIO, R2, GCS XML API)
    region: Optional[str] = None  # S3 region
    profile: Optional[str] = None  # AWS profile; credentials never go in config
    checksum_compat: bool = False  # for stores that reject boto3's default checksum headers
    multipart_threshold_mb: int = 64  # files above this size upload in parallel parts
    retry_for: str = "2m"  # how long one storage call is retried through an outage (then the attempt ends as preempted, exit 75); 0: no retry


@dataclass
class PricingConfig:
    max_age: str = "1h"  # fetched prices (<storage.uri>/_prices/catalog.json) older than this are stale: the plan refreshes them, else prices with conf/pricing.yaml
    refresh: bool = True  # the plan fetches current prices (AWS, Azure; `orchestrator prices refresh`) when the cached ones are stale; false: never


@dataclass
class CheckpointConfig:
    every: str = "15m"  # wall-clock interval: 90s, 15m, 1h; "0" or "off" disables; auto: Young/Daly from the measured checkpoint cost and the preemption rate
    min_every: str = MIN_EVERY  # checkpoint.every=auto: the shortest interval it may choose
    max_every: str = MAX_EVERY  # checkpoint.every=auto: the longest interval it may choose
    every_steps: int = 0  # also save every N optimizer steps (0: off)
    keep_last: int = 3  # committed checkpoints kept (at least 2; older ones deleted after a newer commit)
    allow_config_change: bool = False  # resume although a trajectory-shaping field changed
    allow_data_change: bool = False  # resume although the dataset fingerprint changed
    save_final_weights: bool = (
        True  # write the trained weights to <storage.uri>/<run.name>/final/ (false: the job keeps none)
    )
    final: FinalWeights = (
        FinalWeights.last
    )  # what <run>/final/ holds: last (where training ended) | best (the best evaluation's weights)
    snapshot_dir: str = (
        "auto"  # where the Trainer writes the local snapshot: auto (/dev/shm if it fits) | work | a path
    )


@dataclass
class PreemptionConfig:
    provider: Provider = Provider.auto  # auto | aws | gcp | azure | none
    grace: str = "30s"  # deadline from a signal to the emergency checkpoint's commit
    metadata_url: Optional[str] = None  # override the provider's metadata base URL
    poll_seconds: float = 5.0  # how often the spot-notice watcher polls the metadata service


@dataclass
class RequeueConfig:
    max_preemptions: int = 20  # requeues after preemptions or vanished attempts
    max_failures: int = 3  # attempts that may crash (or run out of memory) before the job stops
    backoff_base_seconds: float = 5.0  # first wait after a failure; doubles per failure, with jitter
    backoff_max_seconds: float = 300.0  # cap on that wait
    crash_loop_threshold: int = (
        3  # consecutive failures (not preemptions) that made no progress past the last checkpoint
    )
    max_oom_retries: int = (
        0  # requeues after running out of memory (deterministic for one config: 0 stops at the first)
    )
    fork_attempts: bool = True  # the training stack imported once and each process forked from it: the local supervisor's attempts (a local multi-node world's nodes too), a sweep driver's trial launches, torchrun's ranks from its agent (false: a fresh interpreter for each)


@dataclass
class BudgetConfig:
    max_usd: Optional[float] = None  # hard stop: final checkpoint, BUDGET_EXHAUSTED, never requeued
    alert_thresholds: list[float] = field(default_factory=lambda: [0.5, 0.8, 1.0])  # fractions of max_usd
    webhook_url: Optional[str] = None  # Slack-compatible webhook for alerts (a credential: prefer webhook_url_env)
    webhook_url_env: Optional[str] = None  # name of an environment variable holding the webhook URL (preferred)
    projection_alert: bool = (
        True  # alert once when spent + remaining steps x steady cost/step + start-ups to come > max_usd
    )
    monthly_max_usd: Optional[float] = (
        None  # cap on every job under storage.uri in one calendar month (UTC); spent: exit 3
    )
    experiment_max_usd: Optional[float] = (
        None  # cap on every job of tracking.experiment under storage.uri; spent: exit 3
    )
    reserve_ahead: str = (
        "1m"  # spend an attempt reserves in the spend index ahead of spending it (as time at its price)
    )


@dataclass
class TrackingConfig:
    enabled: bool = True  # MLflow tracking on/off
    uri: Optional[str] = None  # None: embedded SQLite under .cache/mlflow
    experiment: str = "spot-orchestrator"  # MLflow experiment name
    parent_run_id: Optional[str] = (
        None  # MLflow run this job's run nests under (a sweep's parent run; the driver sets it)
    )
    log_system_metrics: Optional[bool] = None  # MLflow's own CPU/GPU/memory sampling (system/); None: on for a GPU job
    system_metrics_every: str = (
        "30s"  # MLflow's sampling interval; 0: MLflow's 10 s (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL wins)
    )
    job_metrics_every: str = (
        "30s"  # the orchestrator's own metrics (cost, lost work, throughput) at most this often; 0: every log
    )
    log_final_weights: bool = False  # also upload the final weights (adapter) to MLflow as the run's logged model
    progress: Progress = (
        Progress.auto
    )  # auto: a bar on a terminal, else a line every job_metrics_every | bar | lines | off
    data_progress_bars: bool = False  # show the datasets library's per-map progress bars while preparing data


@dataclass
class BackendConfig:
    name: Backend = Backend.local  # local | slurm | skypilot | kubernetes
    dry_run: bool = False  # print what would be submitted, submit nothing
    image: Optional[str] = (
        None  # container image (kubernetes; skypilot optional); recorded in each attempt's repro record
    )
    partition: Optional[str] = None  # slurm partition (the spot one when on_demand_partition is set)
    on_demand_partition: Optional[str] = None  # slurm: the partition run.deadline moves the job to when behind schedule
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific settings (see docs/scale-out.md)


@dataclass
class DistributedConfig:
    name: Distributed = Distributed.none  # none | ddp | zero2 | zero3 | fsdp
    processes_per_node: Optional[int] = (
        None  # training processes per machine; null: auto, one per GPU of compute (2 on a CPU machine, the demo), 1 for none
    )
    nodes: int = 1  # machines (one worker per node, restarted together: docs/scale-out.md); equals compute.nodes
    heartbeat_timeout: str = "auto"  # multi-node: a node silent this long ends the attempt as vanished (auto: from measured step and save times)
    cpu_offload: bool = False  # ZeRO/FSDP: keep optimizer state (zero3/fsdp: also params) in CPU memory


@dataclass
class EvalConfig:
    """Benchmark scores of checkpoints with lm-evaluation-harness (docs/quality.md); off while ``tasks`` is empty."""

    tasks: list[str] = field(
        default_factory=list
    )  # harness task names (tiny_arith_mc, tiny_arith_gen ship here), task YAML files or folders
    num_fewshot: Optional[int] = None  # few-shot examples per item (None: each task's own)
    limit: Optional[int] = None  # items per task (None: all of them); scores of a limited run are for smoke tests
    batch_size: int = 16  # items per forward pass
    seed: int = 1234  # the harness's random, numpy, torch and few-shot seeds (the same seed: the same scores)
    every: int = 0  # in the training job: every k-th committed checkpoint, and always the final weights (0: the final weights only)
    log_samples: bool = (
        False  # the final evaluation's per-item samples as an MLflow artifact (bench/samples_final.json)
    )


@dataclass
class SweepConfig:
    """A sweep of jobs (docs/sweeps.md): ``-m`` with grid overrides, or ``sweep=asha`` with a search space."""

    name: Optional[str] = None  # names the sweep (state in <storage.uri>/<name>/, trials <name>-t<k>); None: run.name
    budget_usd: Optional[float] = None  # the sweep's dollar cap (an experiment cap in the spend index); required
    max_parallel: int = 1  # trials running at once
    n_trials: int = 0  # trials to sample (0: the grid's size; required with interval(...) parameters)
    sampler: Sampler = Sampler.random  # random | tpe | grid (Optuna's samplers; grid: every combination)
    seed: int = 0  # the sampler's seed (trial k samples with seed + k)
    pruner: Pruner = Pruner.none  # none (every trial runs to train.max_steps) | successive_halving (asha) | hyperband: Optuna's pruner of that name
    metric: str = "auto"  # what a rung decides by: a held-out metric (auto: the job's quality metric) or bench/<task>/<metric> of eval.tasks
    direction: Direction = (
        Direction.auto
    )  # maximize | minimize | auto (loss and perplexity: minimize; others: maximize)
    min_fraction: float = 0.25  # rung 0 ends at this fraction of train.max_steps (of the trial's planned cost)
    reduction_factor: int = 3  # rung r ends at min_fraction x reduction_factor^r; 1 in reduction_factor is promoted
    allow_changes: bool = False  # resume a sweep although its search space or fixed overrides changed
    params: dict[str, str] = field(
        default_factory=dict
    )  # the search space: key -> interval(1e-5,1e-3) | choice(8,16) | 1,2


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    pricing: PricingConfig = field(default_factory=PricingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    requeue: RequeueConfig = field(default_factory=RequeueConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)


GROUP_SCHEMAS: dict[str, Any] = {
    "recipe": RecipeConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "compute": ComputeConfig,
    "storage": StorageConfig,
    "checkpoint": CheckpointConfig,
    "preemption": PreemptionConfig,
    "requeue": RequeueConfig,
    "budget": BudgetConfig,
    "tracking": TrackingConfig,
    "backend": BackendConfig,
    "distributed": DistributedConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "sweep": SweepConfig,
}


RECIPE_SCHEMAS: dict[str, Any] = {"dpo": DpoRecipeConfig, "grpo": GrpoRecipeConfig}


def register_configs() -> None:
    """The schemas in Hydra's ConfigStore, once per process (and inherited by a forked one): storing them
    builds every structured node again, about half of a warm ``compose_config``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    if "base_config.yaml" in cs.repo:  # stored last: the rest is there
        return
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)
    for name, schema in RECIPE_SCHEMAS.items():  # per-recipe keys: conf/recipe/<name>.yaml names its schema
        cs.store(group="recipe", name=f"base_recipe_{name}", node=schema)
    cs.store(name="base_config", node=Config)
