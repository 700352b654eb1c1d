"""Hostile numbers get a 4xx, never a 500, by every route that takes input, and change nothing: integers of 310+
digits, Unicode digits, underscores, non-finite floats, deep JSON nesting (rigdash/numbers.py, rigdash/strictjson.py).

The routes come from the URLconf: a new route must be named in NUMERIC (with its numeric parameters) or in
NO_NUMBERS, or this test fails. Every route with an ``<int:...>`` path parameter is also asked with a 310-digit id.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.board import apikeys
from inference.models import ApiKey, AuditLog, ChatSession, Quota, Rig, Sweep, Turn

pytestmark = pytest.mark.django_db(transaction=True)  # the API views read the key on a thread of their own

HOSTILE_TEXT = ["9" * 310, "-" + "9" * 400, "²", "٣", "١٢", "1_000", "nan", "NaN", "inf", "-Infinity", "1e400",
                "0x10", "1e309", "𝟗", "٣.٥", "1" * 5000]  # fmt: skip  # noqa: RUF001
HOSTILE_JSON = ["9" * 310, "-" + "9" * 400, "1e400", "NaN", "Infinity", "-Infinity", "1" * 5000, "[" * 5000]
hostile_text = st.sampled_from(HOSTILE_TEXT) | st.integers(min_value=10**309, max_value=10**330).map(str)
hostile_json = st.sampled_from(HOSTILE_JSON)

# route name -> (method, path with {session}/{rig}, where the numbers go: query, form or json, their names)
NUMERIC: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "inference:session_list": ("GET", "/", "query", ("before",)),
    "inference:session_settings": (
        "POST",
        "/sessions/{session}/settings",
        "form",
        ("temperature", "top_k", "max_tokens", "seed", "num_ctx"),
    ),
    "inference:session_preset": ("POST", "/sessions/{session}/preset", "form", ("preset",)),
    "inference:session_create": ("POST", "/sessions/new", "form", ("rig",)),
    "inference:api_session_settings": ("POST", "/api/sessions/{session}/settings", "json", ("temperature", "seed")),
    "inference:api_session_turns": ("POST", "/api/sessions/{session}/turns", "json", ("max_tokens", "temperature")),
    "inference:openai_chat_completions": ("POST", "/v1/chat/completions", "json", ("max_tokens", "temperature")),
    "inference:openai_completions": ("POST", "/v1/completions", "json", ("max_tokens", "temperature")),
    "inference:root_chat_completions": ("POST", "/chat/completions", "json", ("max_tokens", "temperature")),
    "inference:root_responses": ("POST", "/responses", "json", ("max_output_tokens", "temperature")),
    "inference:anthropic_messages": ("POST", "/v1/messages", "json", ("max_tokens", "temperature", "top_k")),
    "inference:openai_embeddings": ("POST", "/v1/embeddings", "json", ("dimensions",)),
    "inference:openai_responses": ("POST", "/v1/responses", "json", ("max_output_tokens", "temperature")),
    "inference:openai_responses_input_tokens": ("POST", "/v1/responses/input_tokens", "json", ("max_output_tokens",)),
    "inference:anthropic_count_tokens": ("POST", "/v1/messages/count_tokens", "json", ("max_tokens", "top_k")),
    "inference:ollama_embeddings": ("POST", "/api/embeddings", "json", ("options", "keep_alive")),
    "inference:llamacpp_completion": ("POST", "/completion", "json", ("n_predict", "temperature")),
    "inference:llamacpp_completions": ("POST", "/completions", "json", ("n_predict", "top_k")),
    "inference:llamacpp_infill": ("POST", "/infill", "json", ("n_predict", "n_indent")),
    "inference:llamacpp_tokenize": ("POST", "/tokenize", "json", ("add_special",)),
    "inference:llamacpp_detokenize": ("POST", "/detokenize", "json", ("tokens",)),
    "inference:rerank": ("POST", "/v1/rerank", "json", ("top_n",)),
    "inference:reranking": ("POST", "/v1/reranking", "json", ("top_n",)),
    "inference:llamacpp_rerank": ("POST", "/rerank", "json", ("top_n",)),
    "inference:llamacpp_reranking": ("POST", "/reranking", "json", ("top_n",)),
    "inference:ollama_chat": ("POST", "/api/chat", "json", ("options", "keep_alive")),
    "inference:ollama_generate": ("POST", "/api/generate", "json", ("options", "keep_alive")),
    "inference:ollama_embed": ("POST", "/api/embed", "json", ("dimensions", "truncate")),
    "inference:ollama_show": ("POST", "/api/show", "json", ("verbose",)),
    "inference:api_keys": ("POST", "/keys/", "form", ("expires_in_days",)),
    "board:quotas": ("POST", "/board/quotas/", "form", ("max_concurrent_turns", "max_context_tokens", "user")),
    "board:rig_new": ("POST", "/board/rigs/new", "form", ("slots",)),
    "board:audit": ("GET", "/board/audit/", "query", ("before",)),
    "board:usage": ("GET", "/usage/", "query", ("days", "user", "page")),
    "board:usage_csv": ("GET", "/usage.csv", "query", ("days", "user")),
    "board:api_sweep_start": ("POST", "/board/api/sweeps", "json", ("rig", "max_tokens", "contexts", "sessions")),
    "monitoring:calculator": ("GET", "/monitoring/calculator/", "query", ("rig", "context_tokens", "batch")),
    "api_calculator": ("GET", "/api/calculator", "query", ("rig", "context_tokens", "batch")),
    "monitoring:rig_dashboard": ("GET", "/monitoring/rigs/{rig}/", "query", ("range",)),
    "monitoring:api_rig_series": ("GET", "/monitoring/api/rigs/{rig}/series", "query", ("range",)),
    "monitoring:sweep": ("GET", "/monitoring/sweeps/{sweep}/", "query", ("context", "sessions")),
    "alerts:rule_new": ("POST", "/alerts/rules/new", "form", ("threshold", "for_s", "clear_s", "window_s", "rig")),
    "alerts:silence_new": ("POST", "/alerts/silences/new", "form", ("minutes", "rule", "rig")),
}
# Routes whose only numbers are path ids (asked below with a 310-digit id) or that take no input at all.
NO_NUMBERS = {
    "healthz", "metrics", "login", "logout", "sso_login", "sso_callback", "inference:session_import",
    "inference:session_detail",
    "inference:session_rename", "inference:session_delete", "inference:session_export", "inference:api_session_import",
    "inference:api_turn_branch", "inference:compare_new", "inference:compare", "inference:api_turn_detail",
    "inference:api_turn_cancel", "inference:api_rig_models", "inference:api_key_revoke", "inference:api_key_storage",
    "inference:openai_models", "inference:root_models",
    "inference:openai_model", "inference:rig_models", "inference:api_rig_models_state", "inference:api_rig_models_pull",
    "inference:api_rig_models_delete", "inference:api_rig_models_load", "inference:api_rig_models_unload",
    "board:board", "board:api_turns",
    "board:api_cancel", "board:users", "board:user_action", "board:quota_edit", "board:quota_delete", "board:rigs",
    "board:rig_edit", "board:rig_delete", "board:rig_agent_key", "board:api_sweep_cancel", "board:sweep_csv",
    "monitoring:overview", "monitoring:sweeps", "monitoring:rig_profile", "monitoring:api_rig_latency",
    "alerts:page", "alerts:acknowledge", "alerts:rule_edit", "alerts:rule_delete", "alerts:channel_new",
    "alerts:channel_edit", "alerts:channel_delete", "alerts:silence_end",
    "inference:ollama_tags", "inference:ollama_ps", "inference:ollama_version", "inference:ollama_pull",
    "inference:ollama_push", "inference:ollama_create", "inference:ollama_copy", "inference:ollama_delete",
}  # fmt: skip


def _routes(patterns=None, prefix: str = "", namespace: str = "") -> list[tuple[str, str]]:
    """(name, route) of every named route but Django's admin site's (its own forms, tested by Django)."""
    found = []
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace == "admin":
                continue
            space = f"{entry.namespace}:" if entry.namespace else namespace
            found += _routes(entry.url_patterns, prefix + str(entry.pattern), space)
        elif isinstance(entry, URLPattern) and entry.name:
            found.append((namespace + entry.name, prefix + str(entry.pattern)))
    return found


def test_every_route_is_covered_or_allowed():
    names = {name for name, _ in _routes()}
    assert names - set(NUMERIC) - NO_NUMBERS == set(), "name the new route's numbers in NUMERIC or it in NO_NUMBERS"


@pytest.fixture
def world(admin_user):
    rig = Rig.objects.create(name="quiet", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.nobody-listens")
    session = ChatSession.objects.create(owner=admin_user, rig=rig, model_name="m")
    sweep = Sweep.objects.create(rig=rig, owner=admin_user, model_name="m", contexts=[512], sessions=[1], max_tokens=8)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(admin_user)
    key = apikeys.api_key_create(owner=admin_user, name="hostile").secret  # a real key: the API's body is read
    return {"client": client, "session": session.pk, "rig": rig.pk, "sweep": sweep.pk, "key": key}


def _state() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (ApiKey, AuditLog, ChatSession, Quota, Rig, Sweep, Turn))


def _ask(world, method: str, path: str, where: str, fields: dict[str, str]):
    client = world["client"]
    url = path.format(**{name: value for name, value in world.items() if name != "client"})
    if where == "query":
        return client.get(url, fields)
    if where == "form":
        return client.post(url, fields)
    body = "{" + ",".join(f'"{name}": {value}' for name, value in fields.items()) + "}"
    return client.post(url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {world['key']}")


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_hostile_numbers_get_a_4xx_and_change_nothing(world, name):
    method, path, where, names = NUMERIC[name]
    before = _state()

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.sampled_from(names), hostile_json if where == "json" else hostile_text)
    def ask(field, value):
        base = {"text": "hi", "model": "m", "name": "k", "messages": [{"role": "user", "content": "hi"}]}
        if where == "json":
            fields = {key: json.dumps(v) for key, v in base.items()} | {field: value}
        else:
            fields = {"name": "k", "model": "m", field: value}
        response = _ask(world, method, path, where, fields)
        if where == "query" and response.status_code == 200:
            return  # a page that ignores what it cannot read (a cursor, a range) is fine: no 500
        assert 400 <= response.status_code < 500, (name, field, value[:40], response.status_code)
        if where == "json":  # the body is refused as read, before any lookup (a 404 would hide the parser)
            assert response.status_code == 400, (name, field, value[:40], response.status_code)

    ask()
    assert _state() == before


def test_a_310_digit_id_in_any_path_is_a_4xx(world):
    client = world["client"]
    for name, route in _routes():
        if "<int:" not in route:
            continue
        path = "/" + route
        for converter in ("<int:session_id>", "<int:turn_id>", "<int:rig_id>", "<int:key_id>", "<int:user_id>",
                          "<int:quota_id>", "<int:sweep_id>", "<int:left_id>", "<int:right_id>", "<int:alert_id>",
                          "<int:rule_id>", "<int:channel_id>", "<int:silence_id>"):  # fmt: skip
            path = path.replace(converter, "9" * 310)
        path = path.replace("<str:kind>", "json").replace("<path:model_id>", "m")
        for method in (client.get, client.post):
            status = method(path).status_code
            assert 400 <= status < 500 or status in (301, 302), (name, method.__name__, status)
