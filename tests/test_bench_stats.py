"""The benchmark's pure figures (bench/stats.py, bench/analyze.py, bench/report.py): no services needed."""

from __future__ import annotations

import math

import pytest

from bench import analyze, report, stats


def test_percentile_interpolates_between_closest_ranks_like_numpy():
    values = [10.0, 1.0, 4.0, 3.0, 2.0]  # unsorted on purpose
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 50) == 3.0
    assert stats.percentile(values, 100) == 10.0
    assert stats.percentile(values, 75) == 4.0
    assert math.isclose(stats.percentile(values, 90), 4.0 + 0.6 * 6.0)  # rank 3.6 between 4 and 10
    assert math.isclose(stats.percentile([1.0, 2.0], 99), 1.99)
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError):
        stats.percentile(values, 101)


def test_summarize_reports_the_tail_and_empty_input():
    s = stats.summarize([float(x) for x in range(1, 101)])
    assert (s["n"], s["min"], s["max"], s["mean"]) == (100, 1.0, 100.0, 50.5)
    assert s["p50"] == 50.5 and s["p99"] == 99.01
    assert stats.summarize([])["p50"] is None


def test_decode_rate_leaves_out_the_prompt_phase():
    # request at 0, first token at 1.0 s (prompt), then 10 tokens/s: (n - 1) / (t_last - t_first)
    times = [1.0 + i * 0.1 for i in range(11)]
    assert math.isclose(stats.decode_rate(times), 10.0)
    assert math.isclose(stats.ttft_ms(0.0, times), 1000.0)
    assert stats.decode_rate([1.0]) is None
    assert stats.decode_rate([1.0, 1.0]) is None


def test_utf16_lengths_match_javascript_string_lengths():
    assert stats.utf16_len("abc") == 3
    assert stats.utf16_len("é") == 1
    assert stats.utf16_len("😀") == 2  # a surrogate pair in JavaScript
    assert stats.cumulative_utf16_ends(["a", "😀", "bc"]) == [1, 3, 5]


def test_first_covering_maps_each_token_to_the_first_paint_showing_it():
    ends = [2, 4, 6, 8]
    shown = [(10.0, 0), (11.0, 3), (12.0, 2), (13.0, 8)]  # a shorter paint after a longer one is ignored
    assert stats.first_covering(ends, shown) == [11.0, 13.0, 13.0, 13.0]
    assert stats.first_covering([5], [(1.0, 4)]) == [None]


def test_seq_delivery_flags_gaps_duplicates_and_keeps_batch_arrival_per_seq():
    ok = stats.seq_delivery([(1.0, 1, 1, "a"), (2.0, 2, 4, "bcd"), (3.0, 5, 5, "e")])
    assert ok.arrivals == [1.0, 2.0, 2.0, 2.0, 3.0]
    assert (ok.text, ok.in_order, ok.gaps, ok.duplicates, ok.last_seq) == ("abcde", True, 0, 0, 5)
    bad = stats.seq_delivery([(1.0, 1, 2, "ab"), (2.0, 1, 2, "ab"), (3.0, 4, 4, "d")])
    assert (bad.in_order, bad.gaps, bad.duplicates, bad.last_seq) == (False, 1, 1, 4)


def test_growth_sees_a_lag_that_climbs_and_not_a_flat_one():
    flat = [20.0 + (i % 7) for i in range(2000)]
    climbing = [20.0 + i * 0.01 for i in range(2000)]  # 10 ms per 1,000 tokens
    g_flat, g_up = stats.growth(flat), stats.growth(climbing)
    assert abs(g_flat["slope_per_1000"]) < 0.5 and not report.grows(g_flat)
    assert math.isclose(g_up["slope_per_1000"], 10.0, rel_tol=1e-6) and report.grows(g_up)
    assert stats.growth([1.0] * 5)["slope_per_1000"] is None


def test_redis_commandstats_parsing_and_delta_leave_out_info():
    raw = "# Commandstats\r\ncmdstat_get:calls=10,usec=5\r\ncmdstat_publish:calls=3,usec=1\r\ncmdstat_info:calls=2\r\n"
    before = stats.command_calls(raw)
    assert before == {"get": 10, "publish": 3, "info": 2}
    parsed = {"cmdstat_get": {"calls": 14, "usec": 9}, "cmdstat_publish": {"calls": 3}, "cmdstat_info": {"calls": 9},
              "cmdstat_rpush": {"calls": 2}}  # fmt: skip
    assert stats.calls_delta(before, stats.command_calls(parsed)) == {"get": 4, "rpush": 2}


def test_render_table_is_a_markdown_table():
    table = stats.render_table(["a", "figure"], [["1", "x"], ["22", "yy"]])
    lines = table.splitlines()
    assert lines[0] == "| a  | figure |" and set(lines[1]) <= {"|", "-"} and lines[3] == "| 22 | yy     |"


def _turn(**overrides):
    # Tokens reach the direct reader every 10 ms from t=1.0; RigDash's tab gets them in two batches.
    ref = [(1.0 + i * 0.01, x) for i, x in enumerate(["He", "llo", " wor", "ld"])]
    args = {
        "t_send": 0.9,
        "batches": [(1.012, 1, 1, "He"), (1.045, 2, 4, "llo world")],
        "ref_events": ref,
        "ref_t_request": 0.95,
        "stored_reply": "Hello world",
        "flushes": [
            {"len": 2, "start": 1.02, "rendered": 1.021, "painted": 1.025},
            {"len": 11, "start": 1.05, "rendered": 1.052, "painted": 1.06},
        ],
        "page_text": "Hello world",
    }
    return analyze.turn_figures(**(args | overrides))


def test_turn_figures_align_tokens_across_reader_tab_and_page():
    f = _turn()
    assert f["tokens_backend"] == f["tokens_delivered"] == 4
    assert f["in_order"] and f["delivered_equals_stored"] and f["stored_equals_backend"] and f["page_equals_stored"]
    assert math.isclose(f["ttft_ms"], 112.0, abs_tol=1e-6)
    assert [round(x, 3) for x in f["ws_lag_ms"]] == [12.0, 35.0, 25.0, 15.0]
    assert [round(x, 3) for x in f["display_lag_ms"]] == [25.0, 50.0, 40.0, 30.0]
    parts = f["ttft_parts_ms"]
    assert [round(parts[k], 3) for k in ("to_backend", "backend", "to_client")] == [50.0, 50.0, 12.0]
    assert math.isclose(f["decode_tps"], 3 / 0.033) and math.isclose(f["ref_decode_tps"], 100.0)


def test_turn_figures_catch_a_reply_that_differs_or_was_not_painted():
    f = _turn(stored_reply="Hello there", page_text="Hello", flushes=[{"len": 5, "start": 1.0, "rendered": 1.0,
                                                                       "painted": 1.01}])  # fmt: skip
    assert not f["delivered_equals_stored"] and not f["stored_equals_backend"] and not f["page_equals_stored"]
    assert f["tokens_painted"] == 2 and len(f["display_lag_ms"]) == 2


def test_pair_ratios_and_render_flatness():
    ratios = analyze.pair_ratios(
        [{"decode_tps": 99.0, "backend_tps": 140.0, "ttft_ms": 130.0}],
        [{"decode_tps": 100.0, "backend_tps": 140.0, "ttft_ms": 120.0}],
    )
    assert ratios == {"decode": [0.99], "backend": [1.0], "added_ttft_ms": [10.0]}
    growing = [(n, n / 1000, None) for n in range(0, 30_000, 100)]  # 1 ms more per 1,000 characters
    flat = analyze.render_flatness(growing, max_len=30_000)
    assert math.isclose(flat["slope_ms_per_10k_chars"], 10.0, rel_tol=1e-6)
    assert [b["flushes"] for b in flat["bins"]] == [60] * 5
    assert flat["bins"][0]["p50_ms"] < flat["bins"][4]["p50_ms"]


def test_check_viewers_counts_whole_deliveries_per_viewer():
    swarm = {"turns": {
        "7": {"clients": 2, "ended": 2, "gaps": 0, "duplicates": 0, "text_sha1": ["s7"], "last_seq": [5], "rates": []},
        "8": {"clients": 2, "ended": 2, "gaps": 1, "duplicates": 0, "text_sha1": ["s8", "x"], "last_seq": [5],
              "rates": []},
    }}  # fmt: skip
    check = report.check_viewers(swarm, {7: "s7", 8: "s8", 9: "s9"}, {7: 1, 8: 1, 9: 2}, {1: 2, 2: 3})
    assert (check["expected_deliveries"], check["deliveries"], check["turns_ok"], check["turns"]) == (7, 4, 1, 3)
    assert len(check["problems"]) == 2


def _agg(backend_ratios: list[float]) -> dict:
    rd = [{"decode_tps": 100.0, "backend_tps": 100.0 * r, "ttft_ms": 110.0, "decode_ratio_vs_ref": 1.0,
           "tokens_delivered": 10, "tokens_backend": 10, "in_order": True, "delivered_equals_stored": True,
           "stored_equals_backend": True} for r in backend_ratios]  # fmt: skip
    direct = [{"decode_tps": 100.0, "backend_tps": 100.0, "ttft_ms": 100.0} for _ in backend_ratios]
    cost = {"cpu_s": {"web": 0.001, "worker": 0.001}, "redis": {"publish": 2}, "wall_s": 1.0}
    return {"level1": report.figures(rd, direct, [cost], [10], [], None)}


def test_paired_figures_get_no_verdict_when_the_machine_drifted_between_runs():
    steady = {row[1]: row[4] for row in report.table_rows(_agg([1.0, 0.995]))}
    drifted = {row[1]: row[4] for row in report.table_rows(_agg([1.0, 2.5]))}
    key = "decode tok/s, RigDash client / direct: paired runs (median; min)"
    assert steady[key] == "ok" and drifted[key] == "-"
    assert steady["TTFT added by RigDash: paired p50 / p99 (ms)"] == "ok"  # 10 ms added
    assert steady["server CPU per token, web + worker + sampler (us; net of idle)"] == "MISS"  # 200 us per token


def test_scattered_pairs_all_on_one_side_of_the_target_still_get_a_verdict():
    """The pairs alternate which side runs first: drift alone would scatter them on both sides of the target."""
    key = "backend's own tok/s with RigDash / without: paired (median; min..max)"
    below = [0.75, 0.80, 0.86, 0.87, 0.90, 0.94]  # max / min = 1.25+, every pair below 0.98 (as on 2026-12-03)
    rows = {row[1]: (row[2], row[4]) for row in report.table_rows(_agg(below))}
    assert rows[key][1] == "MISS" and "all 6 pairs below 0.98" in rows[key][0]
    straddling = [0.75, 0.80, 0.86, 0.87, 0.99, 1.05]
    assert {row[1]: row[4] for row in report.table_rows(_agg(straddling))}[key] == "-"
    agg = _agg(below)
    agg["level1"]["independent_pairs"] = 2  # six turns in two rounds (levels 2 and 3): two units, no verdict
    assert {row[1]: row[4] for row in report.table_rows(agg)}[key] == "-"
    five = [0.70, 0.80, 0.86, 0.87, 0.94]  # scattered too, all below, but too few pairs for the sign test
    assert {row[1]: row[4] for row in report.table_rows(_agg(five))}[key] == "-"


def test_scattered_pairs_mostly_on_one_side_get_a_verdict_from_the_sign_test_at_the_same_level():
    """Eleven of thirteen pairs below the target is as unlikely under drift alone as six of six (p 0.011 against
    0.016), as in the full run of 2026-12-03 17:26; ten of thirteen (p 0.046) is not."""
    key = "backend's own tok/s with RigDash / without: paired (median; min..max)"
    eleven = [0.81, 0.83, 0.85, 0.87, 0.88, 0.90, 0.90, 0.91, 0.92, 0.94, 0.95, 1.02, 1.08]
    rows = {row[1]: (row[2], row[4]) for row in report.table_rows(_agg(eleven))}
    assert rows[key][1] == "MISS" and "11 of 13 pairs below 0.98: sign test p = 0.011" in rows[key][0]
    ten = [0.81, 0.83, 0.85, 0.87, 0.88, 0.90, 0.90, 0.91, 0.92, 0.94, 0.99, 1.02, 1.08]
    assert {row[1]: row[4] for row in report.table_rows(_agg(ten))}[key] == "-"
    above = [0.95, 0.97, 0.99, 1.00, 1.01, 1.02, 1.03, 1.04, 1.05, 1.07, 1.10, 1.15, 1.25]
    rows = {row[1]: (row[2], row[4]) for row in report.table_rows(_agg(above))}
    assert rows[key][1] == "ok" and "11 of 13 pairs at or above 0.98" in rows[key][0]
    agg = _agg(eleven)
    agg["level1"]["independent_pairs"] = 4  # turns run a round at a time: not thirteen independent pairs
    assert {row[1]: row[4] for row in report.table_rows(agg)}[key] == "-"
    assert report.sign_test_p(6, 6) == report.SIGN_P == 1 / 64


def test_a_long_task_is_placed_among_its_turns_flushes():
    flushes = [{"start": 10.0}, {"start": 10.5}, {"start": None}, {"start": 12.0}]
    placed = analyze.place_longtask({"start": 11.0, "duration": 55}, flushes)
    assert placed == {
        "start": 11.0, "duration": 55, "flushes_before": 2, "from_first_flush_s": 1.0, "from_last_flush_s": -1.0,
    }  # fmt: skip
    assert analyze.place_longtask({"start": 9.0, "duration": 60}, flushes)["flushes_before"] == 0  # the turn's start
    assert analyze.place_longtask({"start": 9.0, "duration": 60}, []) == {"start": 9.0, "duration": 60}


def test_the_split_of_send_to_request_shows_both_parts_and_the_claims_side_of_the_request():
    """A ticketed turn's claim runs beside its request (inference/queue/tickets.py): before or after it."""
    agg = _agg([1.0, 1.0])
    parts = {"to_backend": 12.0, "backend": 100.0, "to_client": 2.0, "submit": 3.0, "stored_to_request": 9.0}
    agg["level1"]["ttft_parts_ms_p50"] = parts | {"claim_from_request": -1.25}
    rows = {row[1]: row[2] for row in report.table_rows(agg)}
    key = "  send->backend request = web stores turn + stored->request (p50 ms); claim, from request"
    assert rows[key] == "3.0 + 9.0; -1.2"
    agg["level1"]["ttft_parts_ms_p50"] = parts | {"claim_from_request": None}
    assert {row[1]: row[2] for row in report.table_rows(agg)}[key] == "3.0 + 9.0; -"


def test_steal_is_a_share_of_every_core_over_the_window():
    assert stats.steal_share(0.5, 10.0, 2) == pytest.approx(0.025)  # 0.5 s of 20 core-seconds
    assert stats.steal_share(-0.01, 1.0, 2) == 0.0  # a counter read out of order never goes negative
    assert stats.steal_share(1.0, 0.0, 2) is None


def test_steal_is_reported_for_both_sides_of_the_pairs_and_left_out_for_old_results():
    steal = "CPU the hypervisor took (steal, % of the machine): RigDash / direct (p50; max)"
    old = {row[1].strip(): row[2] for row in report.table_rows(_agg([1.0, 1.0]))}
    assert steal not in old  # results from before the steal figures: no row rather than zeros
    cost = {"cpu_s": {"web": 0.001}, "redis": {}, "wall_s": 1.0}
    figures = report.steal_figures(
        [cost | {"steal_share": 0.0}, cost | {"steal_share": 0.08}], [{"steal_share": 0.01}, {"steal_share": 0.03}]
    )
    assert figures["rigdash"]["max"] == 8.0 and figures["direct"]["p50"] == 2.0
    agg = _agg([1.0, 1.0])
    agg["level1"]["steal_pct"] = figures
    rows = {row[1].strip(): row[2] for row in report.table_rows(agg)}
    assert rows[steal] == "4.00; 8.00 / 2.00; 3.00"


def test_llama_servers_wait_for_a_core_is_reported_on_both_sides_of_the_pairs():
    key = "llama-server's threads waiting for a core (ms/s): RigDash / direct (p50; max)"
    assert key not in {row[1].strip() for row in report.table_rows(_agg([1.0, 1.0]))}  # results without the figure
    rd = [{"ttft_ms": 110.0, "tokens_delivered": 1, "tokens_backend": 1}]
    cost = {"cpu_s": {}, "redis": {}, "wall_s": 1.0, "llama_wait_ms_per_s": 180.0}
    agg = {"level1": report.figures(rd, [{"ttft_ms": 100.0, "llama_wait_ms_per_s": 90.0}], [cost], [1], [], None)}
    rows = {row[1].strip(): row[2] for row in report.table_rows(agg)}
    assert rows[key] == "180.0; 180.0 / 90.0; 90.0"
