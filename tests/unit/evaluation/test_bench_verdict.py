"""The verdict on a job's benchmark points (continue / stop / change), each with its numbers, and the chart's
points as stored results give them (the base at $0)."""
from __future__ import annotations

from orchestrator.evaluation import curve
from orchestrator.evaluation.curve import Point
from orchestrator.evaluation.stats import gains
from tests.helpers.bench import result

IDENTITY = {"harness_version": "0.4.9", "task_hash": "ab12cd34", "seed": 1234}
ITEMS = curve.items_of(IDENTITY)


def _points(*scores, stderr=0.03, usd_per_eval=0.01):
    return [Point(step=10 * i, usd=usd_per_eval * i, value=v, stderr=stderr) for i, v in enumerate(scores)]


def test_still_gaining_beyond_noise_continues_with_its_dollars_per_point():
    v = curve.judge(_points(0.30, 0.45, 0.60, 0.75))
    assert v.decision == "continue"
    # 0.30 -> 0.75 over the last 3 evaluations, +-8.3 points (two stderrs of 0.03), $0.03 for 45 points
    assert v.reason == ("+45.0+-8.3 points over the last 3 evaluation(s) (steps 0-30: 0.300 -> 0.750, from the two "
                        "standard errors) for $0.0300: $0.0007/pt, still gaining beyond noise")


def test_flat_within_noise_over_the_last_k_evaluations_stops():
    v = curve.judge(_points(0.30, 0.50, 0.52, 0.51, 0.53))  # +3 points over the last 3, +-8.3: noise
    assert v.decision == "stop" and v.reason.endswith("flat within noise")
    assert ("+3.0+-8.3 points over the last 3 evaluation(s) (steps 10-40: 0.500 -> 0.530, from the two standard "
            "errors) for $0.0300") in v.reason


def test_a_change_within_stderr_is_not_a_gain_even_if_it_rises_every_time():
    v = curve.judge(_points(0.30, 0.31, 0.32, 0.33, 0.34, stderr=0.05), window=4)
    assert v.decision == "stop" and "+4.0+-13.9 points" in v.reason


def test_too_few_evaluations_for_a_plateau_continue_and_say_so():
    v = curve.judge(_points(0.30, 0.31))
    assert v.decision == "continue" and "only 1 evaluation(s) after the base (a plateau needs 3)" in v.reason


def test_past_the_dollars_per_point_threshold_stops():
    v = curve.judge(_points(0.30, 0.45, 0.60, 0.75), max_usd_per_point=0.0005)
    assert v.decision == "stop" and "$0.0007/pt, past $0.0005/pt" in v.reason


def test_worse_than_the_base_beyond_noise_says_change_the_method():
    v = curve.judge(_points(0.60, 0.50, 0.40))
    assert v.decision == "change"
    assert v.reason == ("-20.0+-8.3 points against the base (0.600 -> 0.400, from the two standard errors) after "
                        "$0.0200: worse beyond noise")


def test_the_job_verdict_is_change_before_continue_before_stop_with_every_metric():
    decision, reason = curve.job_verdict({"a/acc": _points(0.30, 0.50, 0.52, 0.51, 0.53),
                                          "b/acc": _points(0.30, 0.45, 0.60, 0.75)})
    assert decision == "continue" and reason.startswith("a/acc: ") and "; b/acc: " in reason
    assert curve.job_verdict({"a/acc": _points(0.30)}) is None  # nothing evaluated after the base


def _paired(base_right: int, gained: int, n: int = 100):
    """The base right on ``base_right`` of ``n`` items; the checkpoint right on those and ``gained`` more."""
    base = [1.0] * base_right + [0.0] * (n - base_right)
    after = [1.0] * (base_right + gained) + [0.0] * (n - base_right - gained)
    se = lambda xs: (sum((x - sum(xs) / n) ** 2 for x in xs) / (n - 1) / n) ** 0.5  # noqa: E731
    return (Point(0, 0.0, sum(base) / n, se(base), tuple(base), ITEMS),
            Point(10, 0.01, sum(after) / n, se(after), tuple(after), ITEMS))


def test_the_verdict_is_paired_over_the_same_items_where_the_points_have_them():
    base, after = _paired(30, 10)
    # +10 points: within the two standard errors' +-13.2, beyond the per-item differences' +-5.9
    unpaired = curve.judge([Point(0, 0.0, base.value, base.stderr), Point(10, 0.01, after.value, after.stderr)],
                           window=1)
    paired = curve.judge([base, after], window=1)
    assert unpaired.decision == "stop" and "+10.0+-13.2 points" in unpaired.reason, unpaired
    assert "(steps 0-10: 0.300 -> 0.400, from the two standard errors)" in unpaired.reason
    assert paired.decision == "continue" and paired.reason == (
        "+10.0+-5.9 points over the last 1 evaluation(s) (steps 0-10: 0.300 -> 0.400, paired over 100 items) for "
        "$0.0100: $0.0010/pt, still gaining beyond noise"), paired
    # a worse checkpoint: change only once paired (the items it lost)
    worse = Point(10, 0.01, 0.2, after.stderr, tuple([1.0] * 20 + [0.0] * 80), ITEMS)
    assert curve.judge([base, worse], window=1).decision == "change"
    assert curve.judge([Point(0, 0.0, base.value, base.stderr), worse.__class__(10, 0.01, 0.2, after.stderr)],
                       window=1).decision != "change"


def test_per_item_values_read_back_from_mlflow_are_checked():
    assert curve.read_items(curve.items_payload(5, {"t": {"acc": [1, 0.0]}}, IDENTITY)) == (
        5, ITEMS, {"t/acc": (1.0, 0.0)})
    for bad in ({"step": 5, "items_of": ITEMS, "samples": {"t": {"acc": [1, float("nan")]}}},
                {"step": -1, "items_of": ITEMS, "samples": {}}, {"step": 5, "items_of": ITEMS, "samples": {"t": {"acc": "10"}}},
                {"step": True, "items_of": ITEMS, "samples": {}}, [1],
                {"step": 5, "samples": {"t": {"acc": [1, 0.0]}}}):  # written without the items' identity
        assert curve.read_items(bad) is None, bad


def test_equal_counts_of_other_items_are_not_paired():
    """Two evaluations of 100 items each, but of another task configuration (or seed): the verdict uses the two
    standard errors, as if it had no per-item values, instead of pairing unrelated items."""
    base, after = _paired(30, 10)
    other = Point(after.step, after.usd, after.value, after.stderr, after.items, "0.4.9/other-task-hash/1234")
    verdict = curve.judge([base, other], window=1)
    assert "from the two standard errors" in verdict.reason and "+10.0+-13.2 points" in verdict.reason, verdict
    assert "paired over 100 items" in curve.judge([base, after], window=1).reason
    # stored results (the final gain): the same rule
    record = lambda acc, items, **kw: result(scores={"t": {"acc": {"value": acc, "stderr": after.stderr}}},  # noqa: E731
                                             samples={"t": {"acc": list(items)}}, **dict(IDENTITY, **kw))
    stored_after, stored_base = record(after.value, after.items), record(base.value, base.items)
    assert gains(stored_after, stored_base)["t/acc"].paired
    assert not gains(record(after.value, after.items, task_hash="other-task-hash"), stored_base)["t/acc"].paired


def test_stored_results_become_points_the_base_at_zero_dollars(tmp_path):
    def record(step, acc, cost):
        return result(step, cost_usd=cost, scores={"t": {"acc": {"value": acc, "stderr": 0.02}}})

    series = curve.from_records([record(20, 0.5, 0.02), record(0, 0.3, None), record(10, 0.4, 0.01)])
    assert series == {"t/acc": [Point(0, 0.0, 0.3, 0.02), Point(10, 0.01, 0.4, 0.02), Point(20, 0.02, 0.5, 0.02)]}
    out = tmp_path / "c.png"
    assert curve.plot(series, str(out)) == 3 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_items_file_unlike_its_score_is_left_out_of_the_report_with_a_warning(caplog):
    """Issue 42.3: the report printed "0.350 -> 0.350" beside "+65.0 points ... still gaining": the per-item
    file of a step was not the items of its score. It is now checked against the score before any gain uses it."""
    from types import SimpleNamespace as M

    history = {"bench/t/acc": [M(step=0, value=0.35, timestamp=1), M(step=10, value=0.35, timestamp=2)],
               "bench/t/acc_stderr": [M(step=0, value=0.107, timestamp=1), M(step=10, value=0.107, timestamp=2)],
               "cost_usd": [M(step=10, value=0.01, timestamp=2)]}
    base_items, edited = tuple([1.0] * 7 + [0.0] * 13), tuple([1.0] * 20)
    items = {0: (ITEMS, {"t/acc": base_items}), 10: (ITEMS, {"t/acc": edited})}
    with caplog.at_level("WARNING"):
        series = curve.from_history(history, items)
    verdict = curve.judge(series["t/acc"], window=1)
    assert "+0.0" in verdict.reason and "from the two standard errors" in verdict.reason, verdict
    assert verdict.decision != "continue"
    assert "bench/items/step_000000010.json" in caplog.text and "not those of its score" in caplog.text
