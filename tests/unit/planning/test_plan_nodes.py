"""The plan for several nodes: states sharded over every rank of every node, N nodes preempted N times as often
(any one ends the attempt), and the node count from which spot is expected to cost more than on-demand."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from orchestrator.planning import plan

from orchestrator.planning import memory as plan_memory
from orchestrator.money.cost import load_catalog, preemption_prior_per_hour
from orchestrator.planning.nodes import break_even_nodes, spot_break_even
from tests.helpers.plans import LLAMA_70B, full, run_plan

H100 = {"gpu_type": "h100-80gb", "gpus_per_node": 8}


def _zero3(nodes: int) -> plan_memory.MemoryPlan:
    return plan_memory.estimate_memory(full(compute={**H100, "nodes": nodes}, distributed={
        "name": "zero3", "processes_per_node": 8, "nodes": nodes}), LLAMA_70B)


def test_zero3_over_two_nodes_shards_the_70b_states_over_all_16_ranks():
    one, two = _zero3(1), _zero3(2)
    assert (one.world_size, two.world_size) == (8, 16)
    for key in ("weights", "gradients", "master_weights", "optimizer"):
        assert two.components[key] == pytest.approx(one.components[key] / 2, abs=1)
    assert two.components["activations"] == one.components["activations"]  # per GPU, whatever the world
    # a full fine-tune of a 70B model fits neither one 8 x H100 node nor two; it does fit four
    four = _zero3(4)
    assert not plan_memory.fits(one, 80) and not plan_memory.fits(two, 80) and plan_memory.fits(four, 80)
    text = plan.format_plan(four, gpu_type="h100-80gb", memory_gb=80, options=[], cost=None)
    assert "world size 32 = 4 nodes x 8 (distributed=zero3)" in text and "fit: OK on h100-80gb" in text


def test_n_spot_nodes_are_preempted_n_times_as_often_as_one():
    catalog = load_catalog()
    node = SimpleNamespace(spot=True, gpu_type="h100-80gb", cloud="aws", preemptions_per_hour=None, nodes=1)
    one, _ = preemption_prior_per_hour(node, catalog)
    four, source = preemption_prior_per_hour(SimpleNamespace(**{**vars(node), "nodes": 4}), catalog)
    assert one > 0 and four == pytest.approx(4 * one)
    assert "x 4 nodes" in source and "any one" in source
    # a rate the user gives is the whole job's (as its ledger measures it): not multiplied again
    given = SimpleNamespace(**{**vars(node), "nodes": 4, "preemptions_per_hour": 0.5})
    assert preemption_prior_per_hour(given, catalog) == (0.5, "compute.preemptions_per_hour")


def _priced(spot_usd: float, waste_per_node: float):
    """A price function where spot costs ``spot_usd`` per node-run grown by its waste, on-demand 1.0 per node."""
    def price(nodes: int, gpu: str, capacity: str):
        waste = min(0.99, waste_per_node * nodes) if capacity == "spot" else 0.0
        usd = (spot_usd if capacity == "spot" else 1.0) * nodes / (1 - waste)
        return SimpleNamespace(expected_cost_usd=usd, preemptions_per_hour=0.1 * nodes if capacity == "spot" else 0)
    return price


def test_break_even_is_the_fewest_nodes_at_which_spot_costs_more():
    # spot at 40% of the price; waste 4.5% per node: dearer once 0.4 / (1 - 0.045 N) > 1, i.e. N > 13.3
    assert break_even_nodes(_priced(0.4, 0.045), "h100-80gb") == 14
    assert break_even_nodes(_priced(0.4, 0.0001), "h100-80gb") is None  # not up to 128 nodes
    assert break_even_nodes(_priced(1.5, 0.0), "h100-80gb") == 1  # dearer even on one
    dear = spot_break_even(_priced(0.4, 0.045), "h100-80gb", 16)
    assert dear["break_even_nodes"] == 14 and dear["node_preemptions_per_hour"] == pytest.approx(0.1)
    assert dear["text"].startswith("16 spot nodes are expected to cost more than on-demand on h100-80gb: from 14")
    assert "compute.spot=false" in dear["text"]
    assert "from 14 nodes on-demand would" in spot_break_even(_priced(0.4, 0.045), "h100-80gb", 4)["text"]


@pytest.mark.e2e
def test_plan_says_when_n_spot_nodes_cost_more_than_on_demand(tmp_path):
    job = ["model=llama-3.1-8b", "recipe=sft", "compute=l40s-spot", "distributed=ddp",
           "distributed.processes_per_node=1", "train.max_steps=5000",
           "compute.restart_seconds=900", f"storage.uri={tmp_path}", "--json"]
    one = json.loads(run_plan(*job).stdout)
    gpu = one["recommendation"]["gpu_type"]
    assert one["recommendation"]["capacity"] == "spot"
    limit = one["nodes"]["break_even_nodes"]
    assert limit and limit > 1 and f"from {limit} nodes on-demand would" in one["nodes"]["text"]
    for nodes, spot_dearer in ((limit - 1, False), (limit, True)):
        done = run_plan(*job, f"compute.nodes={nodes}", f"distributed.nodes={nodes}")
        assert done.returncode == 0, done.stderr
        many = json.loads(done.stdout)
        pair = {o["capacity"]: o for o in many["options"] if o["gpu_type"] == gpu}
        assert pair["spot"]["nodes"] == nodes and pair["spot"]["preemptions_per_hour"] == pytest.approx(
            nodes * one["nodes"]["node_preemptions_per_hour"])  # any one of the nodes ends the attempt
        assert (pair["spot"]["expected_cost_usd"] > pair["on_demand"]["expected_cost_usd"]) is spot_dearer
    assert f"{limit} spot nodes x" in many["recommendation"]["reason"]
