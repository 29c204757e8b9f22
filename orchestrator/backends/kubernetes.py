"""Kubernetes: a batch/v1 Job whose pod runs one attempt, retried by the Job controller.

With ``distributed.nodes`` > 1: a JobSet of the store and an indexed Job of the nodes, restarted whole
(``orchestrator.backends.kubernetes_jobset``).

The ``podFailurePolicy`` makes the Job controller speak our exit codes: 75
(preempted, checkpoint committed) and a pod disrupted by the cluster (spot node
reclaimed: the ``DisruptionTarget`` condition) are retried without counting
against ``backoffLimit``; 3, 4, 5 and 6 fail the Job at once; anything else
counts against ``backoffLimit = max_failures + max_preemptions``. The worker's
ledger check (exit 5) has the last word whoever retries.

Settings read from the config: ``run.name``, ``backend.image`` (required; also
passed as ``ORCH_CONTAINER_IMAGE`` for the reproducibility record),
``compute.gpus_per_node``, ``compute.spot``, ``compute.cloud`` (gcp | aws |
azure: which spot node label to select; any: a node affinity on any of them, see ``spot_placement``; with
``run.deadline``, none when the job's ledger says on-demand, see ``orchestrator.attempt.capacity_contract``),
``preemption.grace``, ``requeue.*``, and from ``backend.extra``: ``namespace`` (default "default"),
``secret_name`` (default "spot-orchestrator": the Secret holding the variables
that secrets are read from, one key per variable: ``budget.webhook_url_env``,
``${oc.env:NAME}`` given for a secret key, and ``HF_TOKEN`` for a job that reads from the hub
when the launcher has it set; a literal secret in the
overrides is refused, since the manifest would carry it in clear),
``service_account`` (for workload identity to the bucket), ``cpu``,
``memory`` (resource requests, e.g. "8", "64Gi"), ``shm_size`` (cap on the
memory-backed ``/dev/shm`` the pod gets for checkpoint snapshots).

With ``compute.zones``: a preferred node affinity per zone on ``topology.kubernetes.io/zone``, weights from 100 down
to 1 in the placement's order (``zone_preferences``), and ``ORCH_ZONE`` from the pod's copy of its node's zone label.
"""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from orchestrator.attempt.capacity_contract import RESUBMIT, capacity_env, planned_capacity
from orchestrator.backends import (
    entry_final_codes,
    grace_seconds,
    job_argv,
    render_yaml,
    run_tool,
    worker_invocation,
)
from orchestrator.backends.settings import DEFAULT_K8S_SECRET_NAME, backend_settings
from orchestrator.backends.zones import ZONE_ENV, ZONE_LABEL, affinity_weights, zone_order
from orchestrator.core import exitcodes
from orchestrator.core.errors import ConfigError
from orchestrator.policy.deadline import SPOT
from orchestrator.process.multinode.checks import node_count

KUBECTL_TIMEOUT_SECONDS = 120
# after the worker's emergency save must commit, leave it this long to upload and exit
TERMINATION_MARGIN_SECONDS = 30
SHM_VOLUME = "dshm"
DEFAULT_SECRET_NAME = DEFAULT_K8S_SECRET_NAME  # the Secret whose keys hold the variables secrets are read from
STOP_EXIT_CODES = [exitcodes.BUDGET_EXHAUSTED, exitcodes.CONFIG_ERROR, exitcodes.CAPS_REACHED, exitcodes.FENCED]

# per cloud: the label its managed Kubernetes puts on spot nodes, and the taint it puts on them (if any)
SPOT_NODE_LABELS = {
    "gcp": ("cloud.google.com/gke-spot", "true"),
    "aws": ("eks.amazonaws.com/capacityType", "SPOT"),
    "azure": ("kubernetes.azure.com/scalesetpriority", "spot"),
}
SPOT_TOLERATIONS = {
    "gcp": [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    "aws": [],
    "azure": [
        {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
    ],
}


# compute.cloud=any: a spot node of whichever managed Kubernetes the cluster is (the terms of a node affinity are
# ORed), Karpenter's capacity label (EKS clusters that provision with Karpenter) among them
ANY_CLOUD_SPOT_LABELS = (*SPOT_NODE_LABELS.values(), ("karpenter.sh/capacity-type", "spot"))


def spot_placement(cloud: str) -> dict:
    """The pod spec's fields that put a spot job on spot nodes: ``compute.cloud``'s spot label as a
    ``nodeSelector`` (and its spot taint's toleration); for ``any``, a required node affinity on any of the known
    clouds' spot labels, tolerating each one's spot taint. A spot job is budgeted at spot prices, so it must not
    land on an on-demand node unselected."""
    if cloud in SPOT_NODE_LABELS:
        key, value = SPOT_NODE_LABELS[cloud]
        return {
            "nodeSelector": {key: value},
            **({"tolerations": copy.deepcopy(SPOT_TOLERATIONS[cloud])} if SPOT_TOLERATIONS[cloud] else {}),
        }
    terms = [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
        for key, value in ANY_CLOUD_SPOT_LABELS
    ]
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
        "tolerations": [copy.deepcopy(t) for cloud_taints in SPOT_TOLERATIONS.values() for t in cloud_taints],
    }


def zone_preferences(zones: Sequence[str]) -> list[dict]:
    """``compute.zones`` in the placement's order as preferred node affinity terms on the node's zone label, the
    weights descending from 100 to 1: of the nodes that can run the pod, the scheduler prefers the first zone's."""
    return [
        {
            "weight": weight,
            "preference": {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [zone]}]},
        }
        for zone, weight in zip(zones, affinity_weights(len(zones)))
    ]


def job_name(run_name: str) -> str:
    """A DNS-1123 label from ``run.name`` (lowercase, [a-z0-9-], at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")[:63].strip("-")
    return name or "run"


def _shm_volume(cfg: Any) -> dict:
    """emptyDir in memory; ``backend.extra.shm_size`` (e.g. "16Gi") caps it (it counts against the pod's memory)."""
    volume: dict[str, Any] = {"medium": "Memory"}
    shm_size = backend_settings(cfg).shm_size
    if shm_size:
        volume["sizeLimit"] = shm_size
    return volume


def _exit_codes(codes: list[int]) -> dict:
    return {"containerName": "worker", "operator": "In", "values": list(codes)}


def _container(cfg: Any, overrides: Sequence[str], capacity: str, zoned: bool = False) -> dict:
    invocation = worker_invocation(cfg, overrides)
    if invocation.secret_values:
        raise ConfigError(
            f"{', '.join(invocation.secret_keys)}: backend=kubernetes would write this secret (a webhook URL, a "
            "token...) into the pod spec in clear. Put it in a Kubernetes Secret and pass its name: kubectl create "
            f"secret generic {_secret_name(cfg)} --from-literal=NAME=<value>, then key='${{oc.env:NAME}}' (for the "
            "budget webhook: budget.webhook_url_env=NAME); backend.extra.secret_name chooses another Secret."
        )
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [
        {"name": name, "value": value}
        for name, value in {**invocation.env, **capacity_env(cfg, capacity, RESUBMIT)}.items()
    ]
    # a secret by name: the value stays in the cluster's Secret object, never in this manifest
    env += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": _secret_name(cfg), "key": name}}}
        for name in invocation.secret_names
    ]
    if zoned:
        # the node's zone label, which the PodTopologyLabels admission plugin copies onto the pod when it is bound
        # (KEP-4742: alpha in Kubernetes 1.33, beta in 1.35); empty where the cluster does not copy it
        env.append({"name": ZONE_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{ZONE_LABEL}']"}}})
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    settings = backend_settings(cfg)
    if settings.cpu:
        requests["cpu"] = settings.cpu
    if settings.memory:
        requests["memory"] = limits["memory"] = settings.memory
    gpus = int(cfg.compute.gpus_per_node)
    if gpus > 0:
        limits["nvidia.com/gpu"] = str(gpus)
    container: dict[str, Any] = {
        "name": "worker",
        "image": str(cfg.backend.image),
        "command": job_argv([], python="python"),
        "args": invocation.overrides,
        "env": env,
        # a memory-backed /dev/shm (a pod gets 64 MiB otherwise): the Trainer's checkpoint snapshot goes
        # there, so training pauses only for the serialisation (checkpoint.snapshot_dir=auto)
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
    }
    if requests or limits:
        container["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return container


def _secret_name(cfg: Any) -> str:
    return backend_settings(cfg).secret_name


def manifest(cfg: Any, overrides: Sequence[str], capacity: Optional[str] = None) -> dict:
    """The Job manifest as a dict (batch/v1); ``capacity`` (spot | on_demand) defaults to ``planned_capacity``:
    a spot job with ``run.deadline`` whose ledger says on-demand gets no spot node selector.

    With several nodes (``distributed.nodes`` > 1) it is a JobSet instead (``kubernetes_jobset``).

    Raises:
        ConfigError: no ``backend.image``, or compute.nodes and distributed.nodes that differ.
    """
    nodes = node_count(cfg)
    if not cfg.backend.image:
        raise ConfigError(
            "backend=kubernetes needs backend.image: a container image with the project installed "
            "(see containers/README.md), e.g. backend.image=ghcr.io/you/spot-orchestrator:0.1."
        )
    capacity = capacity or planned_capacity(cfg)[0]
    pod_spec = _pod_spec(cfg, overrides, capacity)
    labels = {"app.kubernetes.io/name": "spot-orchestrator", "spot-orchestrator/run": job_name(str(cfg.run.name))}
    if nodes > 1:
        from orchestrator.backends.kubernetes_jobset import jobset

        return jobset(cfg, pod_spec, labels, nodes)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(str(cfg.run.name)),
            "namespace": backend_settings(cfg).namespace,
            "labels": labels,
        },
        "spec": {
            "backoffLimit": int(cfg.requeue.max_failures) + int(cfg.requeue.max_preemptions),
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onExitCodes": _exit_codes([exitcodes.PREEMPTED])},
                    {"action": "FailJob", "onExitCodes": _exit_codes([*STOP_EXIT_CODES, *entry_final_codes()])},
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _pod_spec(cfg: Any, overrides: Sequence[str], capacity: str) -> dict:
    """The worker's pod: its container, grace, /dev/shm, service account, spot node selector and GPU toleration."""
    zones = zone_order(cfg)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_seconds(cfg) + TERMINATION_MARGIN_SECONDS,
        "containers": [_container(cfg, overrides, capacity, zoned=bool(zones))],
        "volumes": [{"name": SHM_VOLUME, "emptyDir": _shm_volume(cfg)}],
    }
    service_account = backend_settings(cfg).service_account
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if capacity == SPOT:
        pod_spec.update(spot_placement(str(cfg.compute.cloud).lower()))
    if zones:
        pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})[
            "preferredDuringSchedulingIgnoredDuringExecution"
        ] = zone_preferences([z.zone for z in zones])
    if int(cfg.compute.gpus_per_node) > 0:
        # GPU node pools are commonly tainted so that only GPU pods land there
        pod_spec.setdefault("tolerations", []).append(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        )
    return pod_spec


def render(cfg: Any, overrides: Sequence[str]) -> str:
    """The manifest as YAML text, as ``submit`` applies it (``render_yaml``: ConfigError for a secret in it)."""
    return render_yaml(
        cfg, "kubectl apply -f", lambda capacity: manifest(cfg, overrides, capacity), "the Kubernetes Job manifest"
    )


def submit(cfg: Any, overrides: Sequence[str]) -> str:
    """``kubectl apply -f`` the manifest; returns "<namespace>/<job name>".

    Raises:
        ConfigError: kubectl is missing or the API server refused the Job (its message included).
    """
    text = render(cfg, overrides)
    work = Path(cfg.run.work_dir).expanduser().resolve() / "kubernetes"
    work.mkdir(parents=True, exist_ok=True)
    prefix = f"{job_name(str(cfg.run.name))}-"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=prefix, dir=work, delete=False) as f:
        f.write(text)
    done = run_tool(
        ["kubectl", "apply", "-f", f.name],
        timeout_seconds=KUBECTL_TIMEOUT_SECONDS,
        missing="backend=kubernetes needs kubectl on PATH, pointed at your cluster (kubectl config current-context).",
    )
    if done.returncode != 0:
        raise ConfigError(f"kubectl apply -f {f.name} failed: {done.stderr.strip() or done.stdout.strip()}")
    meta = manifest(cfg, overrides)["metadata"]  # a Job, or a JobSet for several nodes
    return f"{meta['namespace']}/{meta['name']}"
