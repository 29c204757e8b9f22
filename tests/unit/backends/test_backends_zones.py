"""``compute.zones`` on each backend: the placement's order of zones rendered the engine's own way, and ``ORCH_ZONE``.

The order every test expects is the one ``orchestrator.planning.zone_order.ranked_zones`` gives for the job (the
placement policy), whatever its ranking: SkyPilot's ``resources.ordered`` (read back by SkyPilot's own parser),
Kubernetes' preferred zone affinities (through the official client's model), Slurm's partition list (accepted by
``sbatch`` on the suite's one-node cluster).
"""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from orchestrator.app.compose import compose_config
from orchestrator.backends import get_backend
from orchestrator.core.errors import ConfigError
from orchestrator.planning.zone_order import ranked_zones
from orchestrator.storage import store_from_config
from tests.helpers.backends import SKYPILOT_PYTHON, USER_OVERRIDES, compose

ZONES = "compute.zones=[us-east-1b,us-east-1a,us-west-2c]"
PARTITIONS = "+backend.extra.zone_partitions={us-east-1a: spot-a, us-east-1b: spot-b, us-west-2c: spot-c}"


def _zoned(backend: str, tmp_path: Path, *extra: str):
    """The composed job with ``compute.zones`` over a store in ``tmp_path``, its overrides, and the policy's order."""
    cfg, overrides = compose(backend, ZONES, f"storage.uri={tmp_path / 'runs'}", "storage.endpoint_url=null", *extra)
    order = [z.zone for z in ranked_zones(cfg, store_from_config(cfg.storage))]
    assert sorted(order) == ["us-east-1a", "us-east-1b", "us-west-2c"], order
    return cfg, overrides, order


def _rejected_at_launch(*extra: str) -> str:
    """The launch check's message (exit 4) for the job with ``extra``."""
    with pytest.raises(ConfigError) as err:
        compose_config([*USER_OVERRIDES, *extra])
    return str(err.value)


# -- SkyPilot -------------------------------------------------------------------------------------------------


def test_skypilot_renders_the_zones_as_resources_ordered_in_the_policys_order(tmp_path):
    cfg, overrides, order = _zoned("skypilot", tmp_path, "compute.cloud=aws")
    task = yaml.safe_load(get_backend("skypilot").render(cfg, overrides))
    assert [entry["zone"] for entry in task["resources"]["ordered"]] == order
    assert "region" not in task["resources"]  # each entry names its own place


def test_skypilot_leaves_the_zone_to_skypilot_without_compute_zones():
    cfg, overrides = compose("skypilot", "compute.cloud=aws")
    task = yaml.safe_load(get_backend("skypilot").render(cfg, overrides))
    assert "ordered" not in task["resources"] and "ORCH_ZONE" not in task["run"]


@pytest.mark.e2e
def test_skypilots_parser_reads_the_zones_as_an_ordered_list_each_spot_and_recovered(tmp_path):
    assert Path(SKYPILOT_PYTHON).exists(), f"no SkyPilot venv at {SKYPILOT_PYTHON}: run bash scripts/test.sh once"
    cfg, overrides, order = _zoned("skypilot", tmp_path, "compute.cloud=aws", "requeue.max_failures=4")
    path = tmp_path / "task.yaml"
    path.write_text(get_backend("skypilot").render(cfg, overrides))
    check = textwrap.dedent(
        """\
        import json, sys, yaml, sky
        task = sky.Task.from_yaml_config(yaml.safe_load(open(sys.argv[1])))
        print(json.dumps({"kind": type(task.resources).__name__,
                          "zones": [[str(r.cloud), r.zone, r.use_spot, r.job_recovery, r.accelerators]
                                    for r in task.resources]}))
        """
    )
    done = subprocess.run([SKYPILOT_PYTHON, "-c", check, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed["kind"] == "list"  # ``ordered``: tried in this order (a set would be any_of, the optimizer's pick)
    assert [zone for _, zone, _, _, _ in parsed["zones"]] == order
    for cloud, _, spot, recovery, accelerators in parsed["zones"]:
        assert (cloud.lower(), spot, accelerators) == ("aws", True, {"H100": 8})
        assert recovery["max_restarts_on_errors"] == 4 and recovery["recover_on_exit_codes"] == [75]


def test_skypilot_run_tells_the_attempt_the_zone_skypilot_launched_it_in(tmp_path):
    cfg, overrides, _ = _zoned("skypilot", tmp_path, "compute.cloud=aws")
    run = yaml.safe_load(get_backend("skypilot").render(cfg, overrides))["run"]
    prologue = run.split("python -m orchestrator.worker", 1)[0]
    # what SkyPilot sets for a task's run (sky/backends/cloud_vm_ray_backend.py, _skypilot_predefined_env_vars)
    info = json.dumps({"cluster_name": "exp1-1", "cloud": "AWS", "region": "us-east-1", "zone": "us-east-1a"})
    for given, zone in ((info, "us-east-1a"), (None, "")):
        env = {k: v for k, v in os.environ.items() if k != "SKYPILOT_CLUSTER_INFO"}
        env["PATH"] = f"{Path(os.sys.executable).parent}:{env['PATH']}"  # a python, as on the VM
        if given:
            env["SKYPILOT_CLUSTER_INFO"] = given
        done = subprocess.run(["bash", "-c", prologue + 'printf "%s" "$ORCH_ZONE"'], env=env, capture_output=True,
                              text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, zone), done.stderr


def test_skypilot_refuses_a_region_beside_the_zones_at_launch():
    message = _rejected_at_launch("backend=skypilot", "compute.zones=[us-east-1a]", "+backend.extra.region=us-west-2")
    assert "backend.extra.region=us-west-2" in message and "drop backend.extra.region" in message


# -- Kubernetes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "any"])
def test_kubernetes_prefers_the_zones_in_the_policys_order(tmp_path, cloud):
    from kubernetes.client import ApiClient

    cfg, overrides, order = _zoned("kubernetes", tmp_path, "backend.image=registry.example/orch:1",
                                   f"compute.cloud={cloud}")
    manifest = yaml.safe_load(get_backend("kubernetes").render(cfg, overrides))
    api = ApiClient()
    job = api.deserialize(json.dumps(manifest), "V1Job", None)
    assert api.sanitize_for_serialization(job) == manifest  # every field known to the official model

    pod = job.spec.template.spec
    terms = pod.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    zones = []
    for term in terms:
        (expression,) = term.preference.match_expressions
        assert (expression.key, expression.operator) == ("topology.kubernetes.io/zone", "In")
        zones.extend(expression.values)
    assert zones == order
    weights = [term.weight for term in terms]
    assert weights[0] == 100 and weights[-1] == 1 and weights == sorted(set(weights), reverse=True), weights
    if cloud == "any":  # the spot requirement stays beside the preference
        assert pod.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    else:
        assert pod.node_selector == {"eks.amazonaws.com/capacityType": "SPOT"}
    (zone_env,) = [e for e in pod.containers[0].env if e.name == "ORCH_ZONE"]
    assert zone_env.value_from.field_ref.field_path == "metadata.labels['topology.kubernetes.io/zone']"


def test_kubernetes_nodes_of_a_jobset_carry_the_zone_preference(tmp_path):
    cfg, overrides, order = _zoned("kubernetes", tmp_path, "backend.image=registry.example/orch:1",
                                   "compute.nodes=2", "distributed.nodes=2")
    jobset = yaml.safe_load(get_backend("kubernetes").render(cfg, overrides))
    nodes = [r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "nodes"][0]
    pod = nodes["template"]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["preference"]["matchExpressions"][0]["values"][0] for t in terms] == order


# -- Slurm ----------------------------------------------------------------------------------------------------


def test_slurm_asks_for_the_zones_partitions_in_the_policys_order(tmp_path):
    cfg, overrides, order = _zoned("slurm", tmp_path, PARTITIONS)
    script = get_backend("slurm").render(cfg, overrides)
    partitions = {"us-east-1a": "spot-a", "us-east-1b": "spot-b", "us-west-2c": "spot-c"}
    assert f"#SBATCH --partition={','.join(partitions[z] for z in order)}" in script.splitlines()
    # the attempt's zone, from the partition Slurm started it in
    case = script[script.index("case \"${SLURM_JOB_PARTITION"):]
    case = case[:case.index("esac") + 4]
    for partition, zone in [("spot-a", "us-east-1a"), ("spot-c", "us-west-2c"), ("debug", "")]:
        done = subprocess.run(["bash", "-c", case + '\nprintf "%s" "$ORCH_ZONE"'], capture_output=True, text=True,
                              env={**os.environ, "SLURM_JOB_PARTITION": partition}, timeout=30)
        assert (done.returncode, done.stdout) == (0, zone), done.stderr


def test_slurm_deadline_moves_back_from_on_demand_to_the_zones_partitions(tmp_path):
    cfg, overrides, order = _zoned("slurm", tmp_path, PARTITIONS, "backend.on_demand_partition=ondemand",
                                   "run.deadline=52h")
    script = get_backend("slurm").render(cfg, overrides)
    partitions = {"us-east-1a": "spot-a", "us-east-1b": "spot-b", "us-west-2c": "spot-c"}
    spot = ",".join(partitions[z] for z in order)
    assert f"on_demand) target=ondemand ;; *) target={spot} ;;" in script


def test_slurm_refuses_a_zone_without_a_partition_at_launch_with_the_fix():
    message = _rejected_at_launch("backend=slurm", "compute.zones=[us-east-1a,us-east-1b]",
                                  "+backend.extra.zone_partitions={us-east-1a: spot-a}")
    assert "us-east-1b" in message and "backend.extra.zone_partitions" in message
    assert "+backend.extra.zone_partitions={us-east-1b: spot-a}" in message  # the fix, spelled out


def test_slurm_refuses_auto_zones_and_a_partition_list_at_launch():
    assert "compute.zones=auto" in _rejected_at_launch("backend=slurm", "compute.zones=auto")
    message = _rejected_at_launch("backend=slurm", "compute.zones=[us-east-1a]",
                                  "+backend.extra.zone_partitions={us-east-1a: 'spot-a,spot-b'}")
    assert "one partition" in message


@pytest.mark.slurm
@pytest.mark.xdist_group("slurm")
def test_sbatch_accepts_the_partition_list_on_the_test_cluster(tmp_path):
    from tests.helpers.slurm_cluster import ensure_slurm

    ensure_slurm()  # partitions debug, spot, ondemand on one node
    overrides = [*USER_OVERRIDES, "backend=slurm", "compute.gpus_per_node=0", "distributed=none",
                 "distributed.processes_per_node=1", f"storage.uri={tmp_path / 'runs'}", "storage.endpoint_url=null",
                 "compute.zones=[us-east-1b,us-east-1a]",  # spot first: not the alphabetical order
                 "+backend.extra.zone_partitions={us-east-1a: ondemand, us-east-1b: spot}"]
    cfg = compose_config(overrides)
    order = [z.zone for z in ranked_zones(cfg, store_from_config(cfg.storage))]
    script = get_backend("slurm").render(cfg, overrides)
    partitions = ",".join({"us-east-1a": "ondemand", "us-east-1b": "spot"}[z] for z in order)
    assert f"#SBATCH --partition={partitions}" in script.splitlines()
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    # --test-only: sbatch checks the script and its options against the cluster and submits nothing
    done = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # Slurm takes the partition that starts the job soonest, the list's order breaking a tie (all are idle here):
    # the policy's first zone's
    assert f"in partition {partitions.split(',')[0]}" in done.stderr, done.stderr
    bad = path.with_name("bad.sbatch")
    bad.write_text(script.replace(f"--partition={partitions}", f"--partition={partitions},no-such-partition"))
    refused = subprocess.run(["sbatch", "--test-only", str(bad)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "partition" in refused.stderr.lower(), refused.stderr
