"""On Kubernetes a spot job lands on spot nodes whatever ``compute.cloud`` says, since it is budgeted at spot prices.

With ``compute.cloud=any`` it used to get no node selector at all (any node, on-demand ones included) while the
budget priced it as spot. Now it requires a node carrying one of the managed clouds' spot labels (GKE, EKS managed
node groups, AKS, Karpenter), through a node affinity whose terms Kubernetes ORs, and tolerates their spot taints.
Each manifest round-trips through the official client's models (a misplaced field would be dropped).
"""
from __future__ import annotations

import json

import pytest
import yaml

from orchestrator.backends import get_backend
from tests.helpers.backends import compose

IMAGE = "backend.image=registry.example/orch:1"
SPOT_LABELS = {("cloud.google.com/gke-spot", "true"), ("eks.amazonaws.com/capacityType", "SPOT"),
               ("kubernetes.azure.com/scalesetpriority", "spot"), ("karpenter.sh/capacity-type", "spot")}


def _pod(*extra: str) -> dict:
    from kubernetes.client import ApiClient

    cfg, overrides = compose("kubernetes", IMAGE, *extra)
    manifest = yaml.safe_load(get_backend("kubernetes").render(cfg, overrides))
    api = ApiClient()
    kind = "V1Job" if manifest["kind"] == "Job" else None
    if kind:
        assert api.sanitize_for_serialization(api.deserialize(json.dumps(manifest), kind, None)) == manifest
        return manifest["spec"]["template"]["spec"]
    return manifest


def _required_labels(pod: dict) -> set:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(len(t["matchExpressions"]) == 1 for t in terms), "one label per term: the terms are ORed"
    return {(e["key"], e["values"][0]) for t in terms for e in t["matchExpressions"] if e["operator"] == "In"}


def test_a_spot_job_on_any_cloud_requires_a_spot_node_of_any_managed_kubernetes():
    pod = _pod("compute.cloud=any")  # compute=h100-x8-spot
    assert "nodeSelector" not in pod
    assert _required_labels(pod) == SPOT_LABELS
    tolerated = {(t.get("key"), t.get("value")) for t in pod["tolerations"]}
    assert {("cloud.google.com/gke-spot", "true"), ("kubernetes.azure.com/scalesetpriority", "spot"),
            ("nvidia.com/gpu", None)} <= tolerated


def test_an_on_demand_job_on_any_cloud_is_placed_anywhere():
    pod = _pod("compute.cloud=any", "compute.spot=false")
    assert "affinity" not in pod and "nodeSelector" not in pod
    assert [t["key"] for t in pod["tolerations"]] == ["nvidia.com/gpu"]


def test_a_named_cloud_keeps_its_own_selector_and_renders_the_same_twice():
    first, second = _pod("compute.cloud=gcp"), _pod("compute.cloud=gcp")
    assert first["nodeSelector"] == {"cloud.google.com/gke-spot": "true"} and "affinity" not in first
    assert first["tolerations"] == second["tolerations"]  # the spot toleration list is not shared and grown
    assert [t["key"] for t in second["tolerations"]] == ["cloud.google.com/gke-spot", "nvidia.com/gpu"]


def test_the_nodes_of_a_jobset_on_any_cloud_require_spot_nodes_and_its_store_does_not():
    jobset = _pod("compute.cloud=any", "compute.nodes=2", "distributed.nodes=2")
    jobs = {j["name"]: j["template"]["spec"]["template"]["spec"] for j in jobset["spec"]["replicatedJobs"]}
    assert _required_labels(jobs["nodes"]) == SPOT_LABELS
    assert "affinity" not in jobs["store"] and "tolerations" not in jobs["store"]


@pytest.mark.parametrize("cloud", ["gcp", "aws", "azure", "any"])
def test_the_rendered_job_passes_the_official_model_on_every_cloud(cloud):
    assert _pod(f"compute.cloud={cloud}")["restartPolicy"] == "Never"
