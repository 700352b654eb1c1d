"""scripts/test-compose's checks as a user, over HTTP to the published web port: log in, an API key from the keys
page, a chat through the bundled llama.cpp rig on the /v1/ API, /healthz (the rig and its agent up), the agent's
figures in the rig page's JSON. State (the key, the first chat's reply) is kept in a file so that later steps
(after a restart, a stop and start, an upgrade, a restore) check that the data is still there.

Usage: python usercheck.py BASE_URL STATE_FILE {first,again} [SINCE] (SINCE: epoch seconds the agent's heartbeat
and figures must be newer than; the admin's name and password: RIGDASH_ADMIN_USER,
RIGDASH_ADMIN_PASSWORD in the environment). Exits non-zero with the reason when a check fails.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

DEADLINE_S = float(os.environ.get("USERCHECK_DEADLINE_S", "240"))
SINCE = 0.0  # figures and heartbeats must be this recent (epoch seconds): after a restart, the new agent's


def wait_for(what: str, probe: Any, deadline_s: float = DEADLINE_S) -> Any:
    """probe() until it returns something true; the last reason it gave when the deadline passes."""
    end, last = time.monotonic() + deadline_s, "never answered"
    while time.monotonic() < end:
        try:
            result = probe()
            if result:
                return result
            last = "not yet"
        except (httpx.HTTPError, ValueError, KeyError, AssertionError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(2)
    sys.exit(f"FAIL {what}: {last}")


def login(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=30, follow_redirects=False)
    page = client.get("/login/")
    page.raise_for_status()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    form = {"csrfmiddlewaretoken": token, "username": os.environ.get("RIGDASH_ADMIN_USER", "admin"),
            "password": os.environ["RIGDASH_ADMIN_PASSWORD"]}  # fmt: skip
    answer = client.post("/login/", data=form, headers={"Referer": f"{base}/login/"})
    assert answer.status_code == 302, f"login answered {answer.status_code}"
    assert client.get("/").status_code == 200
    print("ok   logged in as", form["username"])
    return client


def new_api_key(client: httpx.Client) -> str:
    page = client.get("/keys/")
    token = client.cookies["csrftoken"]
    answer = client.post("/keys/", data={"csrfmiddlewaretoken": token, "name": "test-compose"},
                         headers={"Referer": str(page.url)})  # fmt: skip
    assert answer.status_code == 201, f"keys page answered {answer.status_code}"
    return re.search(r'data-testid="new-key-secret">([^<]+)<', answer.text).group(1)  # type: ignore[union-attr]


def chat(base: str, key: str) -> str:
    api = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {key}"})
    models = api.get("/v1/models")
    assert models.status_code == 200, f"/v1/models answered {models.status_code}"
    ids = [model["id"] for model in models.json()["data"]]
    model = next((name for name in ids if "SmolLM2" in name), None)
    assert model, f"no SmolLM2 model in /v1/models: {ids}"
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
    answer = api.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, f"chat answered {answer.status_code}: {answer.text[:300]}"
    reply = answer.json()["choices"][0]["message"]["content"]
    assert reply.strip(), "an empty reply"
    print(f"ok   chat through {model}: {reply.strip()[:60]!r}")
    return reply


def healthz(base: str, client: httpx.Client | None = None) -> dict[str, Any]:
    """Anonymous: up or down only; with an admin's session, what is down and why."""
    answer = (client or httpx.Client(base_url=base, timeout=30)).get("/healthz")
    data = answer.json()
    assert answer.status_code == 200, f"/healthz {answer.status_code}: {json.dumps(data)[:600]}"
    if client is None:
        assert data == {"status": "up"}, data
        print("ok   /healthz (anonymous): up")
        return data
    rig = data["checks"]["rigs"]["embedded"]
    assert rig["ok"] and rig["agent"]["up"], f"rig embedded: {rig}"
    assert float(rig["agent"]["last_seen"] or 0) >= SINCE, f"the agent's last heartbeat is older than {SINCE}: {rig}"
    print(f"ok   /healthz (admin): {data['status']}, rig embedded up, its agent up ({rig['agent']['label']})")
    return data


def agent_figures(client: httpx.Client) -> bool:
    overview = client.get("/monitoring/")
    rig_id = int(re.search(r'href="/monitoring/rigs/(\d+)/"', overview.text).group(1))  # type: ignore[union-attr]
    assert client.get(f"/monitoring/rigs/{rig_id}/").status_code == 200
    columns = client.get(f"/monitoring/api/rigs/{rig_id}/series", params={"range": "15m"}).json()["columns"]
    series = columns["series"]
    rss = [value for ts, value in zip(columns["ts"], series.get("backend_rss_bytes", []), strict=True)
           if value and ts >= SINCE]  # fmt: skip
    assert rss, f"no backend_rss_bytes since {SINCE} yet (series: {sorted(series)})"
    print(f"ok   the agent's figures on rig {rig_id}'s page: llama-server RSS {rss[-1] / 2**20:.0f} MiB")
    return True


def main() -> None:
    global SINCE
    base, state_path, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    SINCE = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    wait_for("/healthz", lambda: healthz(base))
    client = wait_for("login", lambda: login(base), 60)
    wait_for("/healthz as an admin", lambda: healthz(base, client))
    if mode == "first":
        key = new_api_key(client)
        state_path.write_text(json.dumps({"key": key}))
        print("ok   an API key from the keys page")
    else:
        key = json.loads(state_path.read_text())["key"]
    wait_for("chat", lambda: chat(base, key))
    if mode != "first":
        print("ok   the API key made before still works (data kept)")
    wait_for("the agent's figures", lambda: agent_figures(client))


if __name__ == "__main__":
    main()
