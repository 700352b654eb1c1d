"""CSRF is enforced on every state-changing route: with the test client's CSRF checks on (it skips them by
default), a POST without the token is refused (403) and changes nothing; with the token it passes the check."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from inference.models import AuditLog, ChatSession, Quota, Rig, Turn

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(owner, admin_user):
    rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    turn = Turn.objects.create(session=session, user_text="waiting")
    quota = Quota.objects.create(user=owner, max_concurrent_turns=3)
    group = Group.objects.create(name="lab")
    return {"rig": rig, "session": session, "turn": turn, "quota": quota, "group": group}


def _routes(world, owner) -> list[str]:
    return [
        "/sessions/new",
        f"/api/sessions/{world['session'].pk}/turns",
        f"/api/turns/{world['turn'].pk}/cancel",
        f"/api/rigs/{world['rig'].pk}/models/pull",
        f"/api/rigs/{world['rig'].pk}/models/delete",
        f"/api/rigs/{world['rig'].pk}/models/load",
        f"/api/rigs/{world['rig'].pk}/models/unload",
        f"/board/api/turns/{world['turn'].pk}/cancel",
        "/board/api/sweeps",
        "/board/api/sweeps/1/cancel",  # refused before the view looks the sweep up
        "/board/users/",
        f"/board/users/{owner.pk}/",
        "/board/quotas/",
        f"/board/quotas/{world['quota'].pk}/",
        f"/board/quotas/{world['quota'].pk}/delete",
        "/logout/",
        "/login/",
        f"/admin/auth/user/{owner.pk}/change/",
        "/admin/auth/user/add/",
        f"/admin/inference/rig/{world['rig'].pk}/delete/",
        "/keys/",
        "/compare/",
        "/board/rigs/new",
        f"/board/rigs/{world['rig'].pk}/delete",
        f"/monitoring/rigs/{world['rig'].pk}/profile/",
        "/alerts/1/acknowledge",  # the CSRF check refuses before the view looks the alert up
        "/alerts/rules/new",
        "/alerts/rules/1/delete",
        "/alerts/channels/new",
        "/alerts/silences/new",
        "/alerts/silences/1/end",
    ]


def test_every_post_route_is_in_the_list(world, owner):
    """A new route that takes a POST must be added to the list above (and so be checked)."""
    listed = {path.split("/")[1] for path in _routes(world, owner)}

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern)

    tops = {route.split("/")[0] for route in walk(get_resolver().url_patterns) if route}
    read_only = {"healthz", "favicon.ico", "metrics", "monitoring", "usage", "usage.csv", "static", "rigs"}  # GET only
    # The OpenAI API and llama-server's own: an API key, never a session cookie (test_openai_api, test_llamacpp_native)
    bearer_only = {"v1", "completion", "completions", "infill", "tokenize", "detokenize", "rerank", "reranking",
                   "chat", "responses", "models"}  # fmt: skip
    assert tops - read_only - bearer_only <= listed


@pytest.mark.parametrize("who", ["owner", "admin"])
def test_a_post_without_the_csrf_token_is_refused_on_every_state_changing_route(world, owner, admin_user, who):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner if who == "owner" else admin_user)
    before = (Turn.objects.filter(status=Turn.Status.QUEUED).count(), Quota.objects.count(), AuditLog.objects.count())
    for path in _routes(world, owner):
        response = client.post(path, {"action": "deactivate", "text": "hi", "username": "x", "password": "y"})
        assert response.status_code == 403, (path, response.status_code)
        assert b"CSRF" in response.content, path
    after = (Turn.objects.filter(status=Turn.Status.QUEUED).count(), Quota.objects.count(), AuditLog.objects.count())
    assert before == after
    owner.refresh_from_db()
    assert owner.is_active


def test_with_the_token_the_same_post_passes_the_check(world, owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    client.get("/")  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = client.post(
        f"/api/turns/{world['turn'].pk}/cancel", headers={"X-CSRFToken": token}, content_type="application/json"
    )
    assert response.status_code == 202
