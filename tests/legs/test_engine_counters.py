"""A throughput leg's share of vLLM's counters and its cold start, against a local HTTP server that
answers as vLLM's API server does (`/metrics` in Prometheus text, dev-mode `/reset_prefix_cache`)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tica.legs.telemetry import engine_counts, read_counters, reset_prefix_cache


class _Vllm(BaseHTTPRequestHandler):
    hits, queries, resets, dev_mode, steps, step_tokens = 0.0, 0.0, 0, True, 0.0, 0.0
    gaps, gap_seconds = 0.0, 0.0

    def do_GET(self):  # noqa: N802
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = (f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {type(self).hits}\n'
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {type(self).queries}\n'
                'vllm:num_preemptions_total{engine="0",model_name="m"} 0.0\n'
                f'vllm:iteration_tokens_total_bucket{{engine="0",le="1.0",model_name="m"}} 7.0\n'
                f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {type(self).steps}\n'
                f'vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} {type(self).step_tokens}\n'
                f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.01",model_name="m"}} 3.0\n'
                f'vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {type(self).gaps}\n'
                f'vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {type(self).gap_seconds}\n').encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        if self.path != "/reset_prefix_cache" or not type(self).dev_mode:
            self.send_error(404)
            return
        type(self).resets += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("Handler", (_Vllm,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_a_legs_hit_rate_is_read_from_the_servers_counters_before_and_after_it(server):
    handler, url = server
    handler.hits, handler.queries = 100.0, 1000.0
    before = read_counters(url)
    handler.hits, handler.queries = 100.0 + 990, 1000.0 + 1000
    assert engine_counts(before, read_counters(url)) == {"prefix_cache_hit_rate": 0.99, "preemptions": 0,
                                                         "engine_steps": 0, "tokens_per_step": None,
                                                         "engine_itl_ms_mean": None}


def test_a_legs_engine_steps_and_tokens_per_step_are_its_share_of_the_step_histogram(server):
    """The leg's steps and tokens per step from the count and sum of vLLM's tokens-per-step
    histogram, before and after it; its buckets are not a count. Control: a counter that went back
    (a restarted server) is unread, never a negative or a guess."""
    handler, url = server
    handler.steps, handler.step_tokens = 50.0, 1000.0
    before = read_counters(url)
    handler.steps, handler.step_tokens = 50.0 + 400, 1000.0 + 16000
    got = engine_counts(before, read_counters(url))
    assert (got["engine_steps"], got["tokens_per_step"]) == (400, 40.0)
    handler.steps, handler.step_tokens = 10.0, 100.0
    got = engine_counts(before, read_counters(url))
    assert (got["engine_steps"], got["tokens_per_step"]) == (None, None)


def test_a_legs_engine_time_between_tokens_is_its_share_of_the_inter_token_histogram(server):
    """The engine core's mean gap between a request's tokens over the leg, from the count and sum
    of vLLM's inter-token histogram. Control: a server restarted mid-leg (counters went back) is unread."""
    handler, url = server
    handler.gaps, handler.gap_seconds = 100.0, 0.5
    before = read_counters(url)
    handler.gaps, handler.gap_seconds = 100.0 + 2000, 0.5 + 10.0
    assert engine_counts(before, read_counters(url))["engine_itl_ms_mean"] == 5.0
    handler.gaps, handler.gap_seconds = 10.0, 0.01
    assert engine_counts(before, read_counters(url))["engine_itl_ms_mean"] is None


def test_a_cold_leg_empties_the_cache_only_where_the_server_says_it_did(server):
    handler, url = server
    assert reset_prefix_cache(url) is True and handler.resets == 1
    handler.dev_mode = False  # vLLM without VLLM_SERVER_DEV_MODE has no such route
    assert reset_prefix_cache(url) is False and handler.resets == 1


def test_no_server_reads_as_unknown_never_as_zero():
    assert read_counters("http://127.0.0.1:9") == {}
    assert reset_prefix_cache("http://127.0.0.1:9") is False
    assert engine_counts({}, {}) == {"prefix_cache_hit_rate": None, "preemptions": None, "engine_steps": None,
                                     "tokens_per_step": None, "engine_itl_ms_mean": None}
