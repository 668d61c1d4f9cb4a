"""The benchmark's run order: what a ratio compares runs next to it."""

from bench.run import FULL_RUN_SCENARIOS, parse_args, run_order


def test_each_scenario_runs_right_after_its_raw_twin() -> None:
    order = run_order(FULL_RUN_SCENARIOS)
    assert order == [
        "raw",
        "happy",
        "happy-no-otel",
        "happy-warnings",
        "happy-no-journal",
        "raw-retry",
        "retry",
        "raw-failure",
        "failure",
        "raw-retry-jitter",
        "retry-jitter",
        "raw-retry-delay",
        "retry-type-ladder",
    ]


def test_an_ab_run_keeps_both_sides_next_to_their_twin() -> None:
    assert run_order(["retry-jitter", "retry-jitter@base"]) == [
        "raw",
        "raw-retry-jitter",
        "retry-jitter",
        "retry-jitter@base",
    ]


def test_a_part_run_alone_runs_nothing_else() -> None:
    cfg = parse_args(["--queues", "--quick"])
    assert (cfg.scenarios, cfg.parts, cfg.out.name) == ([], ["queues"], "queues")
    assert "queues" in parse_args([]).parts  # a full run includes it
    assert parse_args(["--wait"]).scenarios == ["retry-jitter", "retry-type-ladder"]
