"""Backends for several nodes (distributed.nodes=N): what each engine is asked to run, parsed by its own parser.

- Slurm: the sbatch script's node launch runs under bash with a stand-in ``srun`` (each task as a local
  process with its own SLURM_NODEID) and ``scontrol``: every node gets its rank, the same store on the first
  host and a rendezvous id fresh per restart; node 0's exit code decides the requeue. The real two-node
  cluster's test is tests/e2e/test_slurm_multinode_e2e.py.
- SkyPilot: ``num_nodes`` and the head's store, through ``sky.Task.from_yaml_config``.
- Kubernetes: a JobSet whose Job templates round-trip through the official client's model unchanged.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from orchestrator.core import exitcodes
from orchestrator.backends import get_backend
from orchestrator.core.errors import ConfigError
from tests.helpers.backends import SKYPILOT_PYTHON, USER_OVERRIDES, composed, compose
from tests.helpers.paths import FIXTURES

TWO_NODES = ("compute.nodes=2", "distributed.nodes=2")
SHARED = "run.work_dir=/mnt/shared/work"  # nodes of their own share rank 0's folder through a volume


@pytest.mark.parametrize("backend", ["slurm", "skypilot", "kubernetes"])
def test_several_nodes_without_a_distributed_strategy_are_refused(backend):
    cfg, overrides = compose(backend, *TWO_NODES, SHARED, "distributed.name=none", "backend.image=x")
    with pytest.raises(ConfigError, match="distributed=none.*distributed=ddp, zero2, zero3 or fsdp"):
        get_backend(backend).render(cfg, overrides)


@pytest.mark.parametrize("backend", ["skypilot", "kubernetes"])
def test_nodes_of_their_own_without_a_shared_work_dir_launch(backend, tmp_path, monkeypatch, capsys):
    """The default run.work_dir is inside each node's copy of the files: each node uploads and restores its own
    checkpoint files (orchestrator.checkpoint.pernode), so no shared volume is needed. The launcher in-process."""
    from tests.helpers.launcher import launch

    argv = [*USER_OVERRIDES, f"backend={backend}", *TWO_NODES, "backend.image=x", "compute.cloud=aws",
            "backend.dry_run=true"]
    for extra in ([], [SHARED]):
        done = launch(argv + extra, tmp_path, monkeypatch, capsys)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "worker" in done.stdout, done.stdout[-3000:]  # the rendered task or manifest was printed


# -- slurm ----------------------------------------------------------------------------------------

# stands in for python on the compute nodes: a store that listens, a worker that records what it got
FAKE_PYTHON = textwrap.dedent(
    """\
    #!/bin/bash
    case "$1 $2" in
      "-m orchestrator.process.multinode.store")
        exec python3 -c 'import socket, sys, time; s = socket.create_server((sys.argv[1], int(sys.argv[2])));
    s.settimeout(30); [s.accept() for _ in range(3)]; time.sleep(30)' "$4" "$6" ;;
      "-m orchestrator.worker")
        python3 -c 'import os, socket, sys; h, p = os.environ["ORCH_STORE"].rsplit(":", 1);
    socket.create_connection((h, int(p)), timeout=5).close()'
        env | grep -E '^(ORCH_NODE_RANK|ORCH_NODE_HOST|ORCH_NNODES|ORCH_STORE|ORCH_RDZV_ID)=' | sort > "$FAKE_DIR/node$SLURM_NODEID"
        echo "$*" >> "$FAKE_DIR/node$SLURM_NODEID"
        eval "exit \\$FAKE_EXIT_$SLURM_NODEID" ;;
      *) exec python3 "$@" ;;
    esac
    """
)
FAKE_SRUN = '#!/bin/bash\n# the last two arguments are "-c <task>"\nfor n in 0 1; do SLURM_NODEID=$n SLURMD_NODENAME=n$((n + 1)) bash -c "${@: -1}" & done\nwait -n; a=$?; wait -n; b=$?; exit $(( a > b ? a : b ))\n'
FAKE_SCONTROL = textwrap.dedent(
    """\
    #!/bin/bash
    echo "$*" >> "$FAKE_DIR/scontrol"
    case "$1 $2" in
      "show hostnames") printf 'n1\\nn2\\n' ;;
      "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=vm" ;;
    esac
    """
)


@pytest.fixture
def two_node_slurm(tmp_path):
    """Runs the rendered sbatch script for two nodes with bash, a stand-in srun, scontrol and python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL, "python": FAKE_PYTHON}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)

    def run(node0: int, node1: int, restart_count: int = 0) -> subprocess.CompletedProcess:
        overrides = [*USER_OVERRIDES, "backend=slurm", *TWO_NODES, f"+backend.extra.python={bin_dir / 'python'}"]
        script = tmp_path / "job.sbatch"
        script.write_text(get_backend("slurm").render(composed(tuple(overrides)), overrides))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
               "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_RESTART_COUNT": str(restart_count), "TMPDIR": str(tmp_path),
               "FAKE_DIR": str(tmp_path), "FAKE_EXIT_0": str(node0), "FAKE_EXIT_1": str(node1)}
        return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    run.dir = tmp_path
    return run


def test_sbatch_header_asks_for_every_node_and_one_task_each():
    cfg, overrides = compose("slurm", *TWO_NODES)
    script = get_backend("slurm").render(cfg, overrides)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8"} <= set(header)
    assert "#SBATCH --ntasks=1" not in header
    srun = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and "--nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=0 --wait=90" in srun[0]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.e2e
def test_every_node_gets_its_rank_and_the_first_hosts_store(two_node_slurm):
    done = two_node_slurm(exitcodes.COMPLETED, exitcodes.COMPLETED, restart_count=3)
    assert done.returncode == 0, done.stderr
    nodes = [(two_node_slurm.dir / f"node{n}").read_text().splitlines() for n in (0, 1)]
    envs = []
    for rank, lines in enumerate(nodes):
        env = dict(line.split("=", 1) for line in lines[:5])
        assert env["ORCH_NODE_RANK"] == str(rank) and env["ORCH_NNODES"] == "2"
        assert env["ORCH_NODE_HOST"] == f"n{rank + 1}"  # its Slurm node name: what the ledger records
        assert env["ORCH_RDZV_ID"] == "77-3"  # the job and its restart count: fresh for every requeue
        assert env["ORCH_STORE"].startswith("127.0.0.1:")  # the first host's NodeAddr, reached by both nodes
        assert "orchestrator.worker" in lines[5] and "run.name=exp1" in lines[5] and "backend" not in lines[5]
        envs.append(env)
    assert envs[0]["ORCH_STORE"] == envs[1]["ORCH_STORE"]  # one store for the world
    assert "requeue" not in (two_node_slurm.dir / "scontrol").read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("node0,node1,requeued", [
    (exitcodes.CAPS_REACHED, exitcodes.PREEMPTED, False),  # rank 0's final code is not outvoted by a 75
    (exitcodes.PREEMPTED, exitcodes.PREEMPTED, True),  # a notice: every node saved and exited 75
    (exitcodes.PREEMPTED, 128 + 9, True),  # node 1 killed
])
def test_node_zeros_exit_code_decides_the_requeue(two_node_slurm, node0, node1, requeued):
    done = two_node_slurm(node0, node1)
    assert done.returncode == node0, done.stderr
    assert ("requeue 77" in (two_node_slurm.dir / "scontrol").read_text()) is requeued, done.stderr


# -- skypilot -------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_skypilot_task_for_two_nodes_loads_with_skypilots_own_parser(tmp_path):
    cfg, overrides = compose("skypilot", *TWO_NODES, SHARED, "compute.cloud=aws")
    path = tmp_path / "task.yaml"
    path.write_text(get_backend("skypilot").render(cfg, overrides))
    check = ("import json, sys, yaml, sky; t = sky.Task.from_yaml_config(yaml.safe_load(open(sys.argv[1])));"
             "(r,) = list(t.resources);"
             "print(json.dumps({'num_nodes': t.num_nodes, 'run': t.run, 'recovery': r.job_recovery}))")
    done = subprocess.run([SKYPILOT_PYTHON, "-c", check, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    task = json.loads(done.stdout.strip().splitlines()[-1])
    assert task["num_nodes"] == 2
    # a node whose peer was lost exits 137 (vanished): recovered like a preemption, not counted as an error
    assert task["recovery"]["recover_on_exit_codes"] == [75, 137]
    run = task["run"]
    assert 'head="$(echo "$SKYPILOT_NODE_IPS" | head -n 1)"' in run
    assert 'ORCH_NODE_RANK="$SKYPILOT_NODE_RANK"' in run and 'ORCH_STORE="$head:29400"' in run
    store, worker = run.index("orchestrator.process.multinode.store"), run.index("orchestrator.worker")
    assert 'if [ "$SKYPILOT_NODE_RANK" = 0 ]' in run[:store] and store < worker  # the head's store, then the worker
    subprocess.run(["bash", "-n"], input=run, text=True, check=True)


# -- kubernetes -----------------------------------------------------------------------------------


def test_kubernetes_two_nodes_are_a_jobset_of_a_store_and_an_indexed_job():
    from kubernetes.client import ApiClient

    cfg, overrides = compose("kubernetes", *TWO_NODES, SHARED, "backend.image=registry.example/orch:1", "compute.cloud=gcp",
                             "requeue.max_failures=3", "requeue.max_preemptions=20")
    jobset = yaml.safe_load(get_backend("kubernetes").render(cfg, overrides))
    assert (jobset["apiVersion"], jobset["kind"], jobset["metadata"]["name"]) == ("jobset.x-k8s.io/v1alpha2",
                                                                                 "JobSet", "exp1")
    spec = jobset["spec"]
    api = ApiClient()
    jobs = {}
    for replicated in spec["replicatedJobs"]:
        job = api.deserialize(json.dumps(replicated["template"]), "V1JobTemplateSpec", None)
        assert api.sanitize_for_serialization(job) == replicated["template"]  # nothing unknown was dropped
        jobs[replicated["name"]] = job.spec
    store, nodes = jobs["store"], jobs["nodes"]
    assert spec["replicatedJobs"][1]["dependsOn"] == [{"name": "store", "status": "Ready"}]
    assert (nodes.completions, nodes.parallelism, nodes.completion_mode) == (2, 2, "Indexed")
    worker = nodes.template.spec.containers[0]
    env = {e.name: e for e in worker.env}
    assert env["ORCH_NODE_RANK"].value_from.field_ref.field_path == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']")
    assert env["ORCH_STORE"].value == "exp1-store-0-0.exp1:29400" and env["ORCH_NNODES"].value == "2"
    assert env["ORCH_RDZV_ID"].value == "exp1-$(ORCH_JOBSET_RESTART)"  # the JobSet's restart attempt
    assert env["ORCH_NODE_HOST"].value_from.field_ref.field_path == "spec.nodeName"  # the ledger's host: the node
    assert worker.resources.limits["nvidia.com/gpu"] == "8"
    assert nodes.template.spec.node_selector == {"cloud.google.com/gke-spot": "true"}
    store_pod = store.template.spec
    assert store_pod.containers[0].command[:3] == ["python", "-m", "orchestrator.process.multinode.store"]
    assert store_pod.node_selector is None and "nvidia.com/gpu" not in str(store_pod.containers[0].resources)
    assert spec["network"]["enableDNSHostnames"] is True
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["nodes"]}
    assert nodes.backoff_limit == 0  # any pod failure fails the Job, and the JobSet restarts every node


def _jobset_verdict(spec: dict, nodes_job, *, exit_code: int, disrupted: bool = False) -> str:
    """What the JobSet controller does when one pod of the nodes' Job fails so: the Job's first matching
    podFailurePolicy rule fails it with reason PodFailurePolicy and a message ending "matching FailJob rule at index
    <i>" (no rule matched: BackoffLimitExceeded, backoffLimit 0); the JobSet's first rule whose reasons hold the
    reason and one of whose patterns (Go regexp.MatchString: a search) finds the message acts; none: RestartJobSet."""
    import re

    reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    for index, rule in enumerate(nodes_job.pod_failure_policy.rules):
        by_code = rule.on_exit_codes is not None and exit_code in rule.on_exit_codes.values
        by_condition = disrupted and any(c.type == "DisruptionTarget" and c.status == "True"
                                         for c in rule.on_pod_conditions or [])
        if by_code or by_condition:
            assert rule.action == "FailJob"
            what = ("Pod ns/exp1-nodes-0-1-x has condition DisruptionTarget" if by_condition else
                    f"Container worker for pod ns/exp1-nodes-0-1-x failed with exit code {exit_code}")
            reason, message = "PodFailurePolicy", f"{what} matching FailJob rule at index {index}"
            break
    for rule in spec["failurePolicy"]["rules"]:
        if (reason in rule.get("onJobFailureReasons", [reason]) and "nodes" in rule.get("targetReplicatedJobs", ["nodes"])
                and any(re.search(p, message) for p in rule.get("onJobFailureMessagePatterns", [""]))):
            return rule["action"]
    return "RestartJobSet"


def test_kubernetes_preemptions_do_not_spend_the_jobsets_max_restarts():
    """A spot node reclaimed (DisruptionTarget), a world that saved and stopped (75) or lost a peer (137) restarts
    every node without counting against maxRestarts (the ledger's max_preemptions bounds those, exit 5); a final
    code fails the JobSet; a crash restarts it and counts, up to requeue.max_failures. The failurePolicy is checked
    against the JobSet CRD's schema, the Jobs' podFailurePolicy through the official client's model."""
    import jsonschema
    from kubernetes.client import ApiClient

    cfg, overrides = compose("kubernetes", *TWO_NODES, SHARED, "backend.image=registry.example/orch:1", "compute.cloud=gcp",
                             "requeue.max_failures=3", "requeue.max_preemptions=20")
    spec = yaml.safe_load(get_backend("kubernetes").render(cfg, overrides))["spec"]
    schema = json.loads((FIXTURES / "jobset-failure-policy.schema.json").read_text())
    jsonschema.validate(spec["failurePolicy"], schema)
    template = next(r["template"] for r in spec["replicatedJobs"] if r["name"] == "nodes")
    api = ApiClient()
    nodes_job = api.deserialize(json.dumps(template), "V1JobTemplateSpec", None).spec
    assert api.sanitize_for_serialization(nodes_job)["podFailurePolicy"] == template["spec"]["podFailurePolicy"]
    assert spec["failurePolicy"]["maxRestarts"] == 3  # requeue.max_failures: the crashes' engine-side bound
    uncounted = "RestartJobSetAndIgnoreMaxRestarts"
    assert _jobset_verdict(spec, nodes_job, exit_code=137, disrupted=True) == uncounted  # spot node reclaimed
    assert _jobset_verdict(spec, nodes_job, exit_code=75) == uncounted  # the world saved and stopped
    assert _jobset_verdict(spec, nodes_job, exit_code=137) == uncounted  # a node found its peer lost
    for final in (3, 4, 5, 6):
        assert _jobset_verdict(spec, nodes_job, exit_code=final) == "FailJobSet"
        assert _jobset_verdict(spec, nodes_job, exit_code=final, disrupted=True) == "FailJobSet"
    assert _jobset_verdict(spec, nodes_job, exit_code=1) == "RestartJobSet"  # a crash: counted
    assert _jobset_verdict(spec, nodes_job, exit_code=7) == "RestartJobSet"  # out of memory: counted
