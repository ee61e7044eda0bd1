"""Soak: run one reliability scenario's own test with bigger numbers.

    python bench/soak.py crash --restarts 30 --up-seconds 10

Every field of the scenario's `Plan` (tests/reliability/SCENARIO.py) is a flag, `--up-seconds`
for `up_seconds`; fields not given keep the test's numbers. The test runs through pytest, so
the soak checks exactly the promises the test suite checks. Process logs stay in `--folder`
(a new temporary folder by default; emptied first). Exit status 1 when a promise broke.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click
import pytest

BENCH = Path(__file__).resolve().parent
RELIABILITY = BENCH.parent / "tests" / "reliability"
# Read by tests/reliability/soaked.py.
PLAN_VARIABLE = "CARPOOL_SOAK_PLAN"
# scenario -> its test, in tests/reliability/
SCENARIOS = {
    "crash": "test_crash.py::test_model_server_crashes_lose_no_request",
    "stall": "test_stall.py::test_hung_model_server_costs_callers_no_more_than_their_deadline",
    "overload": "test_overload.py::"
    "test_overload_is_refused_with_429_and_the_rest_meets_its_deadline",
    "fuzz": "test_bad_input.py::test_malformed_requests_get_4xx_and_good_ones_still_succeed",
    "api_schema": "test_api_schema.py::test_the_sidecar_keeps_to_its_own_openapi_document",
    "poison": "test_poison.py::test_poison_in_a_shared_batch_fails_only_its_caller",
    "cancellation": "test_cancellation.py::test_callers_who_hang_up_leave_no_trace",
    "shutdown": "test_shutdown.py::test_sigterm_under_load_answers_everything_accepted",
    "oversized": "test_oversized.py::"
    "test_an_oversized_request_is_refused_at_once_and_harms_no_neighbour",
    "stalled_body": "test_stalled_body.py::"
    "test_stalled_bodies_are_answered_by_their_timeouts_in_bounded_memory",
    "protocol_edges": "test_protocol_edges.py::"
    "test_protocol_edges_meet_what_kserve_and_triton_clients_expect",
    "operator": "test_operator_faults.py::"
    "test_operator_converges_through_api_faults_and_resyncs_without_writes",
    "serve_restart": "test_serving.py::test_serve_restarts_a_killed_child_and_is_ready_within_5_s",
    "serve_killed": "test_serving.py::test_a_killed_serve_leaves_no_process_and_no_folder",
    "long_text": "test_long_text.py::test_a_huge_text_costs_no_more_than_a_256_token_one",
    "bench_unreachable": "test_bench_unreachable.py::"
    "test_bench_against_a_closed_port_stops_at_once_with_one_clear_error",
    # carpool serve, carpool infer, carpool.batch and the weights fetcher at their edges
    "serve_port": "test_serve_edges.py::test_serve_owns_its_ports_or_says_which_is_taken",
    "serve_drain": "test_serve_edges.py::test_serve_answers_every_request_sent_before_sigterm",
    "infer_resume": "test_infer_resume.py::"
    "test_infer_resumes_its_own_runs_and_touches_nothing_else",
    "batch_edges": "test_batch_edges.py::"
    "test_a_function_that_hangs_exits_or_answers_none_harms_no_other_caller",
    "hostile_store": "test_hostile_store.py::"
    "test_a_hostile_store_writes_nothing_outside_and_nothing_unbounded",
    "long_prompt": "test_long_prompt.py::"
    "test_a_huge_prompt_is_refused_before_it_costs_the_model_anything",
    # The data plane at its edges (#25): answers, bodies, gRPC, model-server answers.
    "unread_answers": "test_unread_answers.py::"
    "test_answers_nobody_reads_are_dropped_and_the_drain_ends_on_time",
    "outsized_answers": "test_outsized_answers.py::test_an_answer_is_bounded_before_it_is_built",
    "lying_bodies": "test_lying_bodies.py::"
    "test_data_beyond_its_shape_is_refused_before_it_costs_a_neighbour",
    "grpc_flood": "test_grpc_flood.py::"
    "test_a_grpc_flood_is_refused_with_retry_after_and_counted_call_by_call",
    "bad_model_answers": "test_bad_model_answers.py::"
    "test_a_model_servers_bad_answers_are_502_and_its_timings_are_not_believed",
}


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("scenario", type=click.Choice(sorted(SCENARIOS)))
@click.option("--folder", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.argument("plan", nargs=-1, type=click.UNPROCESSED)
def main(scenario: str, folder: Path | None, plan: tuple[str, ...]) -> None:
    """Run SCENARIO's test with the Plan fields given as flags (--restarts 30 ...)."""
    if len(plan) % 2:
        raise click.UsageError(f"give each Plan field a value: {' '.join(plan)}")
    fields = {}
    for flag, value in zip(plan[::2], plan[1::2], strict=True):
        if not flag.startswith("--"):
            raise click.UsageError(f"{flag!r} is not a --field flag")
        fields[flag.removeprefix("--").replace("-", "_")] = value
    folder = folder or Path(tempfile.mkdtemp(prefix="carpool-soak-"))
    os.environ[PLAN_VARIABLE] = json.dumps(fields)
    # `python bench/soak.py` put bench/ first on sys.path, where library.py and engine.py
    # would shadow the tests' packages of those names.
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != BENCH]
    code = pytest.main(
        [
            str(RELIABILITY / SCENARIOS[scenario]),
            "-s",  # the plan and the summary, as the test prints them
            "--basetemp",
            str(folder),
            "--timeout",
            "0",  # a soak runs as long as its plan says
            "-p",
            "no:cacheprovider",
        ]
    )
    click.echo(f"logs in {folder}")
    click.echo("verdict: " + ("every promise kept" if code == 0 else "failed, see above"))
    sys.exit(0 if code == 0 else 1)


if __name__ == "__main__":
    main()
