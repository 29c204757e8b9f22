"""Benchmark results as stored (untrusted), and the decision numbers: a gain within noise gets no USD per point."""
from __future__ import annotations

import json

import pytest

from orchestrator.evaluation import stats
from orchestrator.evaluation.harness import Evaluation, parse_results
from orchestrator.evaluation.results import ResultStore
from orchestrator.storage import open_store


def _results(tmp_path) -> ResultStore:
    return ResultStore(open_store(str(tmp_path / "runs")), "job/bench/abc", harness_version="0.4.13",
                       task_hash="abc" * 10, seed=1234)


def _evaluation(acc: float) -> Evaluation:
    return Evaluation(scores={"tiny_arith_mc": {"acc": {"value": acc, "stderr": 0.03}}},
                      samples={"tiny_arith_mc": {"acc": [1.0, 0.0, 1.0, 1.0]}}, seconds=1.5)


def test_a_sound_result_is_used_and_an_edited_one_refused_with_the_reason(tmp_path):
    results = _results(tmp_path)
    results.save("000000010-0001", step=10, manifest_sha256="m1", evaluation=_evaluation(0.75))
    assert results.load("000000010-0001", manifest_sha256="m1")["scores"]["tiny_arith_mc"]["acc"]["value"] == 0.75
    # another checkpoint under the same name (its manifest differs): not this one's score
    assert results.load("000000010-0001", manifest_sha256="m2") is None
    assert "its manifest hash differs" in results.refused[-1]
    # the score edited in storage
    key = tmp_path / "runs" / "job/bench/abc/000000010-0001.json"
    record = json.loads(key.read_text())
    record["scores"]["tiny_arith_mc"]["acc"]["value"] = 0.99
    key.write_text(json.dumps(record))
    assert results.load("000000010-0001", manifest_sha256="m1") is None
    assert "does not match its hash" in results.refused[-1]
    # another seed or harness version: not this evaluation's result
    other = ResultStore(results.store, "job/bench/abc", harness_version="0.4.13", task_hash="abc" * 10, seed=7)
    other.save("final", step=20, manifest_sha256="f", evaluation=_evaluation(0.5))
    assert results.load("final", manifest_sha256="f") is None and "its seed is 7" in results.refused[-1]
    key.write_text("{not json")
    assert results.load("000000010-0001", manifest_sha256="m1") is None and "not JSON" in results.refused[-1]


def test_a_gain_within_noise_has_no_usd_per_point_and_says_so():
    g = stats.gain({"value": 0.30, "stderr": 0.032}, {"value": 0.27, "stderr": 0.031})
    assert not g.paired and g.points == pytest.approx(3.0) and g.half_width == pytest.approx(8.73, abs=0.01)
    assert g.usd_per_point(2.0) is None
    assert g.verdict(2.0) == "+3.0 points: no gain beyond noise (+-8.7 points)"


def test_a_gain_beyond_noise_has_its_usd_per_point():
    g = stats.gain({"value": 0.80, "stderr": 0.028}, {"value": 0.30, "stderr": 0.032})
    assert g.beyond_noise and g.usd_per_point(2.0) == pytest.approx(2.0 / 50.0)
    assert "$0.040000 per point" in g.verdict(2.0)


def test_paired_items_give_the_interval_of_the_per_item_differences():
    before = [0.0] * 100
    after = [1.0] * 10 + [0.0] * 90  # ten items flipped right, none wrong: a paired gain of 10 points
    g = stats.gain({"value": 0.1, "stderr": 0.03}, {"value": 0.0, "stderr": 0.0}, after, before)
    assert g.paired and g.points == pytest.approx(10.0)
    assert g.half_width == pytest.approx(100 * stats.Z95 * (0.1 * 0.9 * 100 / 99 / 100) ** 0.5)
    assert g.usd_per_point(1.0) == pytest.approx(0.1)
    same = {"harness_version": "0.4.9", "task_hash": "ab12", "seed": 1234}  # both scored the same items
    rows = stats.gains({"scores": {"t": {"acc": {"value": 0.1, "stderr": 0.03}}}, "samples": {"t": {"acc": after}}, **same},
                       {"scores": {"t": {"acc": {"value": 0.0, "stderr": 0.0}}}, "samples": {"t": {"acc": before}}, **same})
    assert list(rows) == ["t/acc"] and rows["t/acc"].paired


def test_the_harness_output_becomes_scores_with_errors_and_per_item_values():
    output = {"results": {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.25, "sample_len": 2,
                                "exact_match,strip": 1.0, "exact_match_stderr,strip": "N/A"}},
              "samples": {"t": [{"doc_id": 1, "filter": "none", "acc": 0.0}, {"doc_id": 0, "filter": "none", "acc": 1.0},
                                {"doc_id": 0, "filter": "strip", "exact_match": 1.0},
                                {"doc_id": 1, "filter": "strip", "exact_match": 1.0}]}}
    parsed = parse_results(output, ["t"])
    assert parsed.scores == {"t": {"acc": {"value": 0.5, "stderr": 0.25}, "exact_match_strip": {"value": 1.0}}}
    assert parsed.samples == {"t": {"acc": [1.0, 0.0], "exact_match_strip": [1.0, 1.0]}}


def test_the_report_column_shows_each_score_with_its_interval_and_the_gain_or_within_noise():
    metrics = {"bench/tiny_arith_mc/acc": 0.30, "bench/tiny_arith_mc/acc_stderr": 0.032,
               "bench_gain/tiny_arith_mc/acc": 3.0, "bench_gain/tiny_arith_mc/acc_interval": 8.7,
               "bench/tiny_arith_gen/exact_match_strip": 0.80, "bench/tiny_arith_gen/exact_match_strip_stderr": 0.028,
               "bench_gain/tiny_arith_gen/exact_match_strip": 50.0,
               "bench_gain/tiny_arith_gen/exact_match_strip_interval": 8.4,
               "bench_usd_per_point/tiny_arith_gen/exact_match_strip": 0.04, "loss": 1.0}
    assert stats.report_cell(metrics) == ("tiny_arith_gen/exact_match_strip=0.800+-0.055 (+50.0+-8.4 pts, $0.0400/pt); "
                                          "tiny_arith_mc/acc=0.300+-0.063 (+3.0+-8.7 pts, within noise)")
    assert stats.report_cell({"loss": 1.0}) == "-"


@pytest.mark.e2e
def test_an_evaluation_starts_no_child_process_and_leaves_no_git_error_in_the_log(tmp_path, monkeypatch, capfd):
    """Inside a training job: lm_eval's ``git describe`` printed "not a git repository" into the job's log, and
    its ``torch.utils.collect_env`` ran ``pip list`` and friends (about 0.45 s) after every evaluation."""
    import subprocess

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.app.compose import compose_config
    from orchestrator.evaluation import harness, spec
    from recipes.tiny import ensure_tiny_model

    folder = ensure_tiny_model()
    cfg = compose_config(["eval.tasks=[tiny_arith_mc]", "eval.limit=2", "eval.batch_size=2"])
    tasks = spec.resolve(cfg.eval)
    monkeypatch.chdir(tmp_path)  # a job's working directory: no checkout
    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            started.append(args)
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    result = harness.run(tasks, cfg.eval, model=AutoModelForCausalLM.from_pretrained(folder),
                         tokenizer=AutoTokenizer.from_pretrained(folder))
    assert "acc" in result.scores["tiny_arith_mc"]
    assert started == []
    assert "not a git repository" not in capfd.readouterr().err


def test_a_checkpoints_dollars_are_the_training_paid_until_its_commit_not_the_evaluations():
    from orchestrator.evaluation.billing import training_cost_until

    ledger = {"attempts": [{"started_at": 100.0, "ended_at": 200.0, "cost_usd": 1.0},  # preempted
                           {"started_at": 300.0, "last_seen": 400.0, "cost_usd": 2.0},  # running
                           {"started_at": float("nan"), "ended_at": 500.0, "cost_usd": 9.0}],  # unsound: ignored
              "evaluations": [{"started_at": 150.0, "seconds": 10.0, "cost_usd": 5.0}]}
    assert training_cost_until(ledger, 150.0) == pytest.approx(0.5)  # half of the first attempt
    assert training_cost_until(ledger, 250.0) == pytest.approx(1.0)  # between attempts: the first in full
    assert training_cost_until(ledger, 375.0) == pytest.approx(2.5)  # the second pro rata of its time
    assert training_cost_until(ledger, 50.0) is None and training_cost_until(ledger, None) is None


def test_the_eval_deadline_starts_an_evaluation_only_if_the_longest_so_far_ends_by_it():
    from orchestrator.evaluation.deadline import EvalDeadline, deadline_at

    ledger = {"attempts": [{"started_at": 1000.0}, {"started_at": 5000.0}]}
    assert deadline_at("2h", ledger, now=9999.0) == 1000.0 + 7200  # from the job's first attempt
    assert deadline_at("2h", {}, now=9999.0) == 9999.0 + 7200  # no attempt: from now
    assert deadline_at("1970-01-01T01:00:00+00:00", ledger, now=0.0) == 3600.0
    assert deadline_at(None, ledger, now=0.0) is None
    now = [100.0]
    deadline = EvalDeadline(130.0, clock=lambda: now[0])
    assert deadline.allows_another()  # nothing measured yet, the deadline not passed
    deadline.took(20.0)
    now[0] = 110.0
    assert deadline.allows_another()  # 110 + 20 ends at 130
    now[0] = 111.0
    assert not deadline.allows_another()  # would end past it
    assert EvalDeadline(None, clock=lambda: 1e12).allows_another()
