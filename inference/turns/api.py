"""A request of the OpenAI-compatible API as a turn: a session of its own (marked with its key, holding the
request's earlier messages), then the chat's own submit, so quotas, the fair queue, the board and usage apply."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from inference.errors import InvalidInput
from inference.live import state as live
from inference.models import ApiKey, ChatSession, Rig, Turn
from inference.queue import early, quotas
from inference.queue.tickets import StartTicket
from inference.turns.params import one_answer, turn_params
from inference.turns.submit import turn_submit

TITLE_CHARS = 60
FORGOTTEN_TITLE = "(not stored)"
# What a key that stores nothing keeps of a request's params: how it was run, not what it said.
SECRET_PARAMS = ("message", "passthrough")
SECRET_STATS = ("tool_calls", "logprobs", "stop_sequence")  # the reply's calls, tokens and end are the reply
FORGET_BATCH = 500


def api_turn_submit(*, key: ApiKey, rig: Rig, model: str, history: list[dict[str, Any]], text: str,
                    params: dict[str, Any], placed: bool = False, client: str = "", hidden: bool = False,
                    early_sent: early.EarlyStart | None = None) -> Turn:  # fmt: skip
    """Store the request's session and turn and dispatch it; InvalidInput (QuotaExceeded...) stores nothing. ``key``:
    one its row confirmed (inference/board/apikeys.py), never one from memory alone. ``placed``: the request
    named the model, not a rig: it runs on any enabled rig serving it. ``client``: the request's user agent; the turn
    keeps it and its key's name for the board (``params["client"]``). ``hidden``: store nothing of its texts whatever
    the key says (``ChatSession.hidden``). ``early_sent``: the early request already sent for it on a guess
    (``api_early_offer``); it is used if it asks for what this turn does, and withdrawn otherwise."""
    sent = early_sent
    try:
        if key.unconfirmed:
            raise ValueError("a key from memory stores nothing before its row confirms it")
        params = _with_client(params, key, client)
        ticket = _early_ticket(rig=rig, model=model, history=history, text=text, params=params)
        if sent is not None and (sent.queue != rig.queue or sent.ticket != ticket):
            early.withdraw(sent, key_id=key.pk)
            sent = None
        if sent is None and ticket is not None:
            sent = early.offer(key_id=key.pk, queue=rig.queue, ticket=ticket)
        how = ChatSession.Placement.MODEL if placed else ChatSession.Placement.RIG
        hidden = hidden or key.storage == ApiKey.Storage.NOTHING
        title = FORGOTTEN_TITLE if hidden else text.strip()[:TITLE_CHARS]
        with transaction.atomic():
            session = ChatSession.objects.create(
                owner_id=key.owner_id, rig=rig, model_name=model, api_key=key, context_messages=history,
                title=f"API ({key.name}): {title}", placement=how, hidden=hidden,
            )  # fmt: skip
            turn = turn_submit(session=session, text=text, params=params, new_session=True, early=sent)
    except BaseException:
        if sent is not None:
            early.withdraw(sent, key_id=key.pk)
        raise
    if sent is not None and not sent.taken:
        early.withdraw(sent, key_id=key.pk)
    return turn


def api_early_offer(*, key: ApiKey, rig: Rig, model: str, history: list[dict[str, Any]], text: str,
                    params: dict[str, Any], client: str = "") -> early.EarlyStart | None:  # fmt: skip
    """Send a request's backend request down the early lane (inference/queue/early.py) before its key is confirmed
    and its turn stored, if the rig has one and an open slot: the EarlyStart to hand ``api_turn_submit`` (with the
    same arguments), or None. ``key`` may be one from memory (``ApiKey.unconfirmed``): the early request stores and
    publishes nothing until the submit's commit confirms it."""
    ticket = _early_ticket(rig=rig, model=model, history=history, text=text, params=_with_client(params, key, client))
    return None if ticket is None else early.offer(key_id=key.pk, queue=rig.queue, ticket=ticket)


def api_early_withdraw(sent: early.EarlyStart | None, *, key: ApiKey) -> None:
    """An early request sent on a guess (``api_early_offer``) whose request is answered without a submit (its key was
    refused, or its model is unknown): its worker closes it now."""
    if sent is not None:
        early.withdraw(sent, key_id=key.pk)


def _with_client(params: dict[str, Any], key: ApiKey, client: str) -> dict[str, Any]:
    return {**params, "client": {"key": key.name[:200], "agent": client[:200]}}


def _early_ticket(*, rig: Rig, model: str, history: list[dict[str, Any]], text: str,
                  params: dict[str, Any]) -> StartTicket | None:  # fmt: skip
    """The start ticket the submit will make for the request, as far as can be known before it: the turn's parameters
    are the request's alone (an API session has no chat settings), the token cap is the request's within the server's
    (an owner's per-reply limit makes the tickets differ, and the worker then starts the turn without it). None where
    the rig has no early lane (inference/queue/early.py) or the submit refuses the parameters."""
    if not settings.RIGDASH_EARLY_LANE or one_answer(params) or not rig.enabled or rig.agent_key or not rig.queue:
        return None
    try:
        clean = turn_params(session=ChatSession(), raw=params)
    except InvalidInput:
        return None  # the submit refuses it, with its reason
    stub = Turn(user_text=text, params=clean)
    return StartTicket(
        turn_id=0, rig_id=rig.pk, model=model, messages=[*history, stub.prompt_message()], params=clean,
        max_tokens=quotas.reply_cap(stub, quotas.Limits()), context_limit=None,
    )  # fmt: skip


def api_embeddings_submit(*, key: ApiKey, rig: Rig, model: str, body: dict[str, Any], placed: bool = False,
                          client: str = "") -> Turn:  # fmt: skip
    """An embeddings request (its OpenAI body, checked) as a turn: it waits in the fair queue and counts in quotas,
    the board and usage as a chat request does, and its worker asks the rig for the vectors
    (inference/worker/embed.py). Never a chat: its inputs are not a conversation, so its texts are kept only until
    it is answered, whatever the key stores. Its reply is no tokens: it reserves one of a daily allowance."""
    inputs = body.get("input")
    count = len(inputs) if isinstance(inputs, list) else 1
    params = {"embeddings": True, "max_tokens": 1, "passthrough": {k: v for k, v in body.items() if k != "model"}}
    return api_turn_submit(key=key, rig=rig, model=model, history=[], text=f"embeddings of {count} input(s)",
                           params=params, placed=placed, client=client, hidden=True)  # fmt: skip


def api_rerank_submit(*, key: ApiKey, rig: Rig, model: str, body: dict[str, Any], placed: bool = False,
                      client: str = "") -> Turn:  # fmt: skip
    """A rerank request (its body, checked: a query and documents, Jina's or TEI's names) as a turn, as an embeddings
    request is (``api_embeddings_submit``): queued, counted, answered whole, its texts never kept."""
    documents = body.get("documents", body.get("texts"))
    count = len(documents) if isinstance(documents, list) else 0
    params = {"rerank": True, "max_tokens": 1, "passthrough": {k: v for k, v in body.items() if k != "model"}}
    return api_turn_submit(key=key, rig=rig, model=model, history=[], text=f"rerank of {count} document(s)",
                           params=params, placed=placed, client=client, hidden=True)  # fmt: skip


def api_turn_texts_forget(turn_id: int) -> bool:
    """Wipe the texts of an ended turn of a key that stores nothing, once its view has the reply it answers with:
    the request's messages (the session's ``context_messages``, the turn's ``user_text`` and last message), the
    passed fields (a completion's ``suffix``, a schema, the tools), the reply, its thoughts, tool calls and logprobs,
    and its live text in Redis. Kept: the rows, status, token counts, timings and stats, the key and the client (the
    board, usage and quotas still count it). A turn still waiting or running is left to ``api_texts_forget_ended``.
    True when it wiped the turn."""
    return bool(_forget(Turn.objects.filter(pk=turn_id)))


def api_texts_forget_ended(*, older_than_s: float) -> list[int]:
    """The periodic pass: the turns of keys that store nothing, ended at least ``older_than_s`` ago, whose texts
    their view did not wipe (its client went away before the end, or the web server stopped). The wait leaves a
    slow client's stream time to read the ended row."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    return _forget(Turn.objects.filter(finished_at__lte=cutoff))


def _forget(turns: Any) -> list[int]:
    kept = ~Q(user_text="") | ~Q(reply_text="") | ~Q(thinking_text="") | Q(params__has_any_keys=list(SECRET_PARAMS))
    kept |= Q(stats__has_any_keys=list(SECRET_STATS)) | ~Q(session__context_messages=[])
    with transaction.atomic():
        found = list(
            turns.filter(kept, session__hidden=True)
            .exclude(status__in=Turn.ACTIVE)
            .select_for_update(of=("self",), skip_locked=True)
            .only("pk", "session_id", "params", "stats")[:FORGET_BATCH]
        )
        for turn in found:
            turn.params = {k: v for k, v in (turn.params or {}).items() if k not in SECRET_PARAMS}
            turn.params["forgotten"] = True
            turn.stats = {k: v for k, v in (turn.stats or {}).items() if k not in SECRET_STATS}
            turn.user_text = turn.reply_text = turn.thinking_text = ""
        Turn.objects.bulk_update(found, ["params", "stats", "user_text", "reply_text", "thinking_text"])
        ChatSession.objects.filter(pk__in={turn.session_id for turn in found}).update(context_messages=[])
        ids = [turn.pk for turn in found]
        transaction.on_commit(lambda: _forget_live(ids), robust=True)
    return ids


def _forget_live(turn_ids: list[int]) -> None:
    if turn_ids:
        live.sync_client().delete(*[live.live_key(pk) for pk in turn_ids])
