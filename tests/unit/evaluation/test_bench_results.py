"""Benchmark results as stored (untrusted), and the decision numbers: a gain within noise gets no USD per point."""
from __future__ import annotations

import json

import pytest

from orchestrator.evaluation import stats
from orchestrator.evaluation.harness import Evaluation, parse_results
from orchestrator.evaluation.results import ResultStore
from tests.helpers.bench import result
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
    assert results.load("000000010-0001", manifest_sha256="m1").score("tiny_arith_mc", "acc").value == 0.75
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
    rows = stats.gains(result(scores={"t": {"acc": {"value": 0.1, "stderr": 0.03}}}, samples={"t": {"acc": after}}, **same),
                       result(scores={"t": {"acc": {"value": 0.0, "stderr": 0.0}}}, samples={"t": {"acc": before}}, **same))
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
    from orchestrator.records.ledger_record import LedgerRecord

    doc = {"attempts": [{"fence": 1, "exit_class": "preempted", "started_at": 100.0, "ended_at": 200.0,
                         "cost_usd": 1.0},
                        {"fence": 2, "exit_class": "running", "started_at": 300.0, "last_seen": 400.0, "cost_usd": 2.0},
                        {"fence": 3, "exit_class": "crashed", "ended_at": 500.0, "cost_usd": 9.0}],  # no start: none
           "evaluations": [{"started_at": 150.0, "seconds": 10.0, "cost_usd": 5.0}]}
    ledger = LedgerRecord.decode(doc, "ledger.json").attempts
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


def _rewrite(path, edit):
    """An edit in storage with its digest recomputed (what anyone who can write the bucket can do)."""
    import hashlib

    record = json.loads(path.read_text())
    edit(record)
    body = {k: v for k, v in record.items() if k not in ("sha256", "signature")}
    record["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    path.write_text(json.dumps(record))


def _base_store(tmp_path) -> ResultStore:
    return ResultStore(open_store(str(tmp_path / "runs")), "_bench/k1", harness_version="0.4.13",
                       task_hash="abc" * 10, seed=1234)


def _acc(record, value):
    record["scores"]["tiny_arith_mc"]["acc"]["value"] = value


@pytest.mark.parametrize("edit,reason", [
    (lambda r: _acc(r, "0.75"), "score tiny_arith_mc/acc is '0.75', not a finite number"),
    (lambda r: _acc(r, 1e300), "outside [0, 1]"),
    (lambda r: _acc(r, None), "not a finite number"),
    (lambda r: r["scores"].update(t=[1]), "not a table of tasks and metrics"),
    (lambda r: r.update(step="ten"), "step is 'ten', not a count"),
    # the score moved and its items left as they were: the report's "0.350 -> 0.350" beside "+65.0 points"
    (lambda r: _acc(r, 0.25), "score tiny_arith_mc/acc 0.25 is not the mean of its 4 items (0.75)"),
    (lambda r: r["samples"]["tiny_arith_mc"].update(acc=[1.0, "1", 0.0, 1.0]), "an item of tiny_arith_mc/acc"),
])
def test_a_shared_base_score_edited_with_its_digest_recomputed_is_evaluated_again_never_a_crash(
        tmp_path, caplog, edit, reason):
    """Issue 41/42.3: ``_bench/<key>/base.json`` with a score as a string (its digest recomputed) crashed every
    job on that model and task set at train begin; a score unlike its items gave a gain the items do not hold."""
    base = _base_store(tmp_path)
    base.save("base", step=0, manifest_sha256="base:k1", evaluation=_evaluation(0.75))
    _rewrite(tmp_path / "runs/_bench/k1/base.json", edit)
    with caplog.at_level("WARNING"):
        assert base.load("base", manifest_sha256="base:k1") is None
    assert reason in base.refused[-1] and "_bench/k1/base.json" in base.refused[-1]
    assert "_bench/k1/base.json" in caplog.text and "evaluated again" in caplog.text


def test_with_a_signing_key_results_are_signed_and_an_edited_one_refused(tmp_path, monkeypatch):
    """Issue 42.3: an edited base score was accepted with ORCH_MANIFEST_HMAC_KEY set (results were never signed):
    one job reported +35 points at $0.00047 a point against a true +0.0."""
    monkeypatch.setenv("ORCH_MANIFEST_HMAC_KEY", "k" * 32)
    base = _base_store(tmp_path)
    base.save("base", step=0, manifest_sha256="base:k1", evaluation=_evaluation(0.75))
    assert base.load("base", manifest_sha256="base:k1").score("tiny_arith_mc", "acc").value == 0.75
    path = tmp_path / "runs/_bench/k1/base.json"
    signed = path.read_text()
    _rewrite(path, lambda r: (_acc(r, 0.4), r["samples"]["tiny_arith_mc"].update(acc=[1.0, 0.0, 0.0, 0.6])))
    assert base.load("base", manifest_sha256="base:k1") is None
    assert "the result's signature does not match" in base.refused[-1]
    _rewrite(path, lambda r: r.pop("signature"))
    assert base.load("base", manifest_sha256="base:k1") is None
    assert "the result is not signed, and ORCH_MANIFEST_HMAC_KEY is set" in base.refused[-1]
    path.write_text(signed)
    monkeypatch.setenv("ORCH_MANIFEST_HMAC_KEY", "another key")
    assert base.load("base", manifest_sha256="base:k1") is None and "signature does not match" in base.refused[-1]


def test_a_gain_is_paired_only_over_items_its_scores_are_the_mean_of():
    """An items file unlike its score (edited, or another evaluation's) pairs with nothing: the gain is the two
    standard errors' (the report printed "0.350 -> 0.350" beside "+65.0 points ... still gaining")."""
    before, after = [0.0] * 13 + [1.0] * 7, [1.0] * 20
    g = stats.gain({"value": 0.35, "stderr": 0.11}, {"value": 0.35, "stderr": 0.11}, after, before)
    assert not g.paired and g.points == pytest.approx(0.0)
    assert stats.gain({"value": 1.0, "stderr": 0.0}, {"value": 0.35, "stderr": 0.11}, after, before).paired


def test_results_of_another_eval_seed_are_stored_beside_not_over_the_jobs(tmp_path):
    """Issue 42.5: a rerun of ``orchestrator eval`` with another ``eval.seed`` overwrote the job's results."""
    from types import SimpleNamespace

    store = open_store(str(tmp_path / "runs"))
    tasks = SimpleNamespace(config_hash="ab" * 32, harness_version="0.4.13")
    ResultStore.for_run(store, "job", tasks, 1234).save("final", step=9, manifest_sha256="f",
                                                        evaluation=_evaluation(0.75))
    ResultStore.for_run(store, "job", tasks, 7).save("final", step=9, manifest_sha256="f", evaluation=_evaluation(0.5))
    assert ResultStore.for_run(store, "job", tasks, 1234).load("final", manifest_sha256="f").score(
        "tiny_arith_mc", "acc").value == 0.75


def test_a_metric_that_is_not_a_fraction_is_not_reported_as_points():
    """A stored score is a fraction in [0, 1] (its gain is in points): a perplexity is left out at the source,
    never stored to be refused at every read."""
    output = {"results": {"t": {"acc,none": 0.5, "word_perplexity,none": 37.2, "acc_stderr,none": 0.1,
                                "word_perplexity_stderr,none": 0.5}, "u": {"bleu,none": 31.0}},
              "samples": {"t": [{"doc_id": 0, "filter": "none", "acc": 1.0, "word_perplexity": 37.2},
                                {"doc_id": 1, "filter": "none", "acc": 0.0, "word_perplexity": 37.2}]}}
    parsed = parse_results(output, ["t", "u"])
    assert parsed.scores == {"t": {"acc": {"value": 0.5, "stderr": 0.1}}}  # no stderr without its score
