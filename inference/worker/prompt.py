"""A turn's 'prompt' phase as its page sees it."""

from __future__ import annotations

import asyncio

from inference import events
from inference.models import Turn

LOADING = "loading"


class PromptState:
    """A turn's 'prompt' state for its page, sent only when the prompt outlasts ``delay_s`` (PROMPT_STATE_DELAY_S).

    A page takes a turn's first token as the end of its prompt phase. When the first token comes sooner, the
    state would only flash by, and many turns starting together would double the frames the web writes to every
    watching socket. A long prompt, the case the state is for, still shows it after one interval."""

    def __init__(self, turn: Turn, delay_s: float) -> None:
        self._turn = turn
        self._sending = False
        self._loading = False
        self._task = asyncio.create_task(self._send_after(delay_s))

    def _status(self) -> str:
        # "loading": the server loads the model before it reads the prompt (a page-only state: the turn's row
        # stays in its prompt phase).
        return LOADING if self._loading else Turn.Status.PROMPT

    async def _send_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self._sending = True
        await events.turn_state(session_id=self._turn.session_id, turn_id=self._turn.pk, status=self._status())

    async def loading(self) -> None:
        """The model was not loaded when the turn began: its page shows "loading the model" until the first token
        (at once if the 'prompt' state went out already, else in its place)."""
        self._loading = True
        if self._sending:
            await asyncio.gather(self._task, return_exceptions=True)
            await events.turn_state(session_id=self._turn.session_id, turn_id=self._turn.pk, status=LOADING)

    async def settle(self) -> None:
        """Before the first batch and before the end: drop the state if it has not begun to go out, else wait
        until it has (a failed send is dropped too: the page sees the turn's tokens or its end instead)."""
        if not self._sending:
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
