"""The launcher's own flags, as a Hydra user knows them: ``--help``/``-h``, ``--cfg job``, ``--info``, ``-m``.

``python -m orchestrator.launch`` and ``orchestrator launch`` parse their command line here (flags before, after
or among the overrides). The launcher is not a Hydra app: Hydra's other flags are refused with what to use
instead (exit 2, a bad command line), and ``hydra.*``/``hydra/...`` overrides are refused when the config is
composed (exit 4, ``orchestrator.config.aliases``).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import yaml

from orchestrator.core.console import Parser

if TYPE_CHECKING:
    from pathlib import Path

PROG = "python -m orchestrator.launch"
# Hydra's flags this launcher does not take -> what to use instead
_NOT_HERE = {
    ("--config-dir", "-cd", "--config-path", "-cp"): "set ORCH_CONF_DIR=<folder> for another config tree",
    ("--config-name", "-cn"): "the config is conf/config.yaml; a preset of many keys is +experiment=<name>",
    ("--hydra-help",): "--help lists the config groups and options",
    ("--shell-completion", "-sc"): "there is no shell completion; --help lists the groups and options",
    ("--version",): "the version is the package's: pip show spot-orchestrator (or git log -1 in a checkout)",
    ("--experimental-rerun",): "relaunch with the same overrides: the job resumes from its last checkpoint",
}
EXAMPLES = (
    "python -m orchestrator.launch                                   # SFT + LoRA on the built-in tiny model, CPU",
    "python -m orchestrator.launch recipe=dpo run.name=dpo1 storage.uri=s3://bucket/runs",
    "python -m orchestrator.launch model=qwen2.5-0.5b compute=l4-spot train.per_device_train_batch_size=4",
    "python -m orchestrator.launch --cfg job recipe=grpo               # the composed config; nothing runs",
    "python -m orchestrator.launch -m train.learning_rate=1e-4,2e-4 sweep.budget_usd=5   # a sweep",
)


def parser(prog: str = PROG) -> Parser:
    p = Parser(
        prog=prog, add_help=False, allow_abbrev=False, usage=f"{prog} [-h] [--cfg job] [--info] [-m] [override ...]"
    )
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("-c", "--cfg", choices=["job", "all", "hydra"])
    p.add_argument("--resolve", action="store_true")
    p.add_argument("-p", "--package")
    p.add_argument("-i", "--info", action="store_true")
    p.add_argument("-m", "--multirun", action="store_true")
    p.add_argument("-r", "--run", action="store_true")  # Hydra's default mode: one job
    p.add_argument("overrides", nargs="*")
    return p


def parse(argv: list[str], prog: str = PROG) -> argparse.Namespace:
    """The flags and the overrides, in any order; Hydra's flags this launcher lacks exit 2 naming the alternative."""
    p = parser(prog)
    for word in argv:
        flag = word.partition("=")[0]
        for names, fix in _NOT_HERE.items():
            if flag in names:
                p.error(f"{flag} is Hydra's flag; this launcher composes conf/ itself: {fix}")
    args = p.parse_intermixed_args(argv)
    if args.cfg == "hydra":
        p.error("--cfg hydra: this launcher has no Hydra runtime config; --cfg job prints the job's config")
    if (args.resolve or args.package) and not args.cfg:
        p.error("--resolve and --package go with --cfg job")
    return args


def config_defaults(conf: Path) -> list[tuple[str, str]]:
    """``(group, default option)`` of ``conf/config.yaml``'s defaults list, in its order."""
    doc = yaml.safe_load((conf / "config.yaml").read_text()) or {}
    out = []
    for entry in doc.get("defaults", []):
        if isinstance(entry, dict):
            out += [(str(k), str(v)) for k, v in entry.items()]
    return out


def groups_text(conf) -> list[str]:
    """One line per config group: its options, the default first."""
    lines, listed = [], set()
    for group, default in config_defaults(conf):
        options = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        lines.append(f"  {group:<12} {' | '.join([default] + [o for o in options if o != default])}")
        listed.add(group)
    for folder in sorted(p for p in conf.iterdir() if p.is_dir() and p.name not in listed):
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        lines.append(f"  +{folder.name:<11} {' | '.join(options)}  (optional: +{folder.name}=<name>)")
    return lines


def usage(conf, prog: str = PROG) -> str:
    examples = [e.replace(PROG, prog) for e in EXAMPLES]
    return "\n".join(
        [
            f"usage: {prog} [-h] [--cfg job [--resolve] [--package KEY]] [--info] [-m] [override ...]",
            "",
            "Compose conf/config.yaml with the overrides against the typed schemas, check the job, print its plan",
            "(memory, fit, cost) and run it on the chosen backend. `orchestrator launch` is the same command.",
            "",
            "config groups (group=option; the default first):",
            *groups_text(conf),
            "",
            "overrides: key=value (train.max_steps=500), group=option (recipe=dpo); TRL's option names under train.",
            "  take effect (train.per_device_train_batch_size=4, +train.warmup_ratio=0.03); +key=value only where a key",
            "  may be added (+run.notes.NAME=..., +backend.extra.NAME=...). Every key: docs/configuration.md.",
            "",
            "flags (before, after or among the overrides):",
            "  -h, --help       this text",
            "  --cfg job        print the composed job config as YAML and stop; nothing runs (--cfg all: the same)",
            "  --resolve        with --cfg: resolve ${...} interpolations;  --package KEY: print one group (train)",
            "  --info           the config directory, the groups' defaults and this command line's overrides",
            "  -m, --multirun   a sweep of jobs: a=1,2 grids, or sweep=asha (docs/sweeps.md)",
            "",
            "examples:",
            *[f"  {e}" for e in examples],
            "",
            "exit codes: 0 done; 2 a bad command line; 3 budget spent or paused; 4 a bad config (never requeued);",
            "  5 requeue caps spent; 75 preempted (docs/cli.md).",
        ]
    )


def info(conf, overrides: list[str]) -> str:
    return "\n".join(
        [
            f"config directory: {conf} (ORCH_CONF_DIR to use another)",
            "primary config: config.yaml",
            "defaults (group: option):",
            *[f"  {group}: {option}" for group, option in config_defaults(conf)],
            f"overrides: {' '.join(overrides) if overrides else '(none)'}",
            f"python: {sys.executable}",
        ]
    )
