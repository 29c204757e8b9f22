"""Kubernetes, several nodes: a JobSet (jobset.x-k8s.io/v1alpha2) of the store and an indexed Job of the nodes.

Why JobSet and not Kubeflow's PyTorchJob: PyTorchJob brings its own launch (its ``MASTER_ADDR``/``RANK``
variables and, elastic, a rendezvous hosted by the master replica, a training pod), where the worker
starts torchrun itself against a store that no training pod hosts. JobSet starts the pods it is given,
restarts every child Job when any one fails (restart-the-world, chosen on purpose), gives each pod a
stable DNS name under a headless service, and can wait for one replicated job before another.

- ``store``: one pod, ``python -m orchestrator.process.multinode.store`` on ``STORE_PORT``, no GPU and no spot node
  selector, ready when it accepts connections. The ``nodes`` start once it is ready (``dependsOn``).
- ``nodes``: one Indexed Job, ``completions = parallelism = N``; each pod's rank is its completion index
  (``ORCH_NODE_RANK`` from the ``batch.kubernetes.io/job-completion-index`` annotation), it reaches the store
  at ``<jobset>-store-0-0.<jobset>:STORE_PORT``, ``ORCH_RDZV_ID`` is the JobSet's name and restart attempt, and
  ``ORCH_NODE_HOST`` the Kubernetes node the pod runs on (what the ledger records for the node).
- failures: every pod failure fails the nodes' Job at once (``backoffLimit`` 0), and the JobSet's
  ``failurePolicy`` tells a preemption from a crash by which of the Job's ``podFailurePolicy`` rules failed
  it (``NODE_FAILURE_RULES``; Kubernetes ends the Job's failure message with "matching FailJob rule at index
  <i>", which the JobSet rule's ``onJobFailureMessagePatterns`` matches, JobSet v0.10 or later): a final exit
  code (3, 4, 5, 6) fails the JobSet; a pod disrupted (the ``DisruptionTarget`` condition: a spot node
  reclaimed, drained or preempted by the scheduler) or a node that saved and stopped (75) or found its peer
  lost (137) restarts every node without spending ``maxRestarts``; anything else (a crash) restarts them and
  counts, up to ``maxRestarts = requeue.max_failures``. The worker's ledger check (exit 5, which fails the
  JobSet) bounds the preemptions (``requeue.max_preemptions``) and has the last word on each cap, as for one
  node.
- done when the nodes' Job completes (``successPolicy``); the JobSet controller then deletes the store's Job.
"""

from __future__ import annotations

import copy
from typing import Any

from orchestrator.backends.multinode import STORE_PORT, store_argv
from orchestrator.backends.settings import backend_settings
from orchestrator.core import exitcodes
from orchestrator.process.multinode import NNODES_ENV, NODE_HOST_ENV, NODE_RANK_ENV, RDZV_ID_ENV, STORE_ENV

API_VERSION = "jobset.x-k8s.io/v1alpha2"
STORE_JOB, NODES_JOB = "store", "nodes"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
RESTART_ATTEMPT_ENV = "ORCH_JOBSET_RESTART"
FINAL_EXIT_CODES = [exitcodes.BUDGET_EXHAUSTED, exitcodes.CONFIG_ERROR, exitcodes.CAPS_REACHED, exitcodes.FENCED]
# a node that committed the world's emergency checkpoint (75), or stopped because its peer was lost (137)
PREEMPTED_EXIT_CODES = [exitcodes.PREEMPTED, exitcodes.LOST_NODE]
# (JobSet rule name, JobSet action, the nodes' Job's podFailurePolicy rule that tells it, FailJob): in order, as
# Kubernetes evaluates them (the first match fails the Job and names its index in the Job's failure message)
NODE_FAILURE_RULES = (
    (
        "FinalExitCode",
        "FailJobSet",
        {"onExitCodes": {"containerName": "worker", "operator": "In", "values": FINAL_EXIT_CODES}},
    ),
    (
        "NodeDisrupted",
        "RestartJobSetAndIgnoreMaxRestarts",
        {"onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ),
    (
        "PreemptedOrPeerLost",
        "RestartJobSetAndIgnoreMaxRestarts",
        {"onExitCodes": {"containerName": "worker", "operator": "In", "values": PREEMPTED_EXIT_CODES}},
    ),
)
# a pod's hostname is <jobset>-<replicated job>-<job index>-<pod index>, a DNS label of at most 63 characters
MAX_NAME = 63 - len(f"-{NODES_JOB}-0-") - 4
STORE_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


def jobset_name(job: str) -> str:
    """The Job's DNS name cut short enough for its pods' hostnames."""
    return job[:MAX_NAME].rstrip("-") or "run"


def _field(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _nodes_pod(pod_spec: dict, name: str, nodes: int) -> dict:
    """The worker's pod spec with the contract's variables (``orchestrator.backends.multinode``)."""
    spec = copy.deepcopy(pod_spec)
    container = spec["containers"][0]
    container["env"] = [
        *container["env"],
        {"name": NODE_RANK_ENV, **_field(f"metadata.annotations['{COMPLETION_INDEX}']")},
        {"name": NNODES_ENV, "value": str(nodes)},
        {"name": NODE_HOST_ENV, **_field("spec.nodeName")},  # the Kubernetes node, in the ledger's nodes
        {"name": STORE_ENV, "value": f"{name}-{STORE_JOB}-0-0.{name}:{STORE_PORT}"},
        {"name": RESTART_ATTEMPT_ENV, **_field(f"metadata.labels['{RESTART_ATTEMPT}']")},
        # $(VAR): Kubernetes expands a variable defined above
        {"name": RDZV_ID_ENV, "value": f"{name}-$({RESTART_ATTEMPT_ENV})"},
    ]
    return spec


def _store_pod(cfg: Any, pod_spec: dict) -> dict:
    """The store's pod: the same image, a small request, on any node (not the spot pool's selector)."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "store",
                "image": str(cfg.backend.image),
                "command": store_argv("python", STORE_PORT),
                "ports": [{"containerPort": STORE_PORT, "name": "store"}],
                "readinessProbe": {"tcpSocket": {"port": STORE_PORT}, "periodSeconds": 2},
                "resources": STORE_RESOURCES,
            }
        ],
    }
    if pod_spec.get("serviceAccountName"):
        spec["serviceAccountName"] = pod_spec["serviceAccountName"]
    return spec


def _job(labels: dict, pod: dict, *, completions: int, node_rules: bool) -> dict:
    spec: dict[str, Any] = {
        "completions": completions,
        "parallelism": completions,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    if node_rules:
        spec["podFailurePolicy"] = {"rules": [{"action": "FailJob", **match} for _, _, match in NODE_FAILURE_RULES]}
    return {"spec": spec}


def failure_policy(cfg: Any) -> dict:
    """The JobSet's ``failurePolicy``: one rule per ``NODE_FAILURE_RULES`` entry, matched by the nodes' Job's failure
    reason and message; a failure no rule matches (a crash) takes JobSet's default, a restart that counts."""
    rules = [
        {
            "name": name,
            "action": action,
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": [f"matching FailJob rule at index {index}$"],
            "targetReplicatedJobs": [NODES_JOB],
        }
        for index, (name, action, _) in enumerate(NODE_FAILURE_RULES)
    ]
    return {"maxRestarts": int(cfg.requeue.max_failures), "rules": rules}


def jobset(cfg: Any, pod_spec: dict, labels: dict, nodes: int) -> dict:
    """The JobSet manifest for ``nodes`` nodes whose worker pod is ``pod_spec`` (see the module docstring)."""
    name = jobset_name(str(labels["spot-orchestrator/run"]))
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": backend_settings(cfg).namespace, "labels": labels},
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [NODES_JOB]},
            "failurePolicy": failure_policy(cfg),
            "replicatedJobs": [
                {
                    "name": STORE_JOB,
                    "replicas": 1,
                    "template": _job(labels, _store_pod(cfg, pod_spec), completions=1, node_rules=False),
                },
                {
                    "name": NODES_JOB,
                    "replicas": 1,
                    "dependsOn": [{"name": STORE_JOB, "status": "Ready"}],
                    "template": _job(labels, _nodes_pod(pod_spec, name, nodes), completions=nodes, node_rules=True),
                },
            ],
        },
    }
