/* The chat page: one websocket per open session, turns rendered from snapshots and token batches.
 *
 * Delivery contract (docs/streaming.md): each token batch carries the turn id and seq_from..seq_to.
 * A batch whose seq_to we already hold is dropped (it was in a snapshot); a batch that skips a seq
 * means something was missed, so we ask for the turn's snapshot and continue from it. On reconnect
 * the server sends a snapshot of the session first, so a reload mid-turn loses and doubles nothing.
 */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("page-config").textContent);
  const list = document.querySelector("[data-testid=turns]");
  const form = document.querySelector("[data-testid=composer]");
  const input = document.querySelector("[data-testid=message]");
  const sendBtn = document.querySelector("[data-testid=send]");
  const stopBtn = document.querySelector("[data-testid=stop]");
  const banner = document.querySelector("[data-testid=error]");
  const connLabel = document.querySelector("[data-testid=connection]");
  const ACTIVE = new Set(["queued", "prompt", "decoding"]);

  const turns = new Map(); // id -> {id, text, thought, seq, status, stats, el, renderer, thinking, resyncing}
  let pendingText = null;
  const thinkParams = RigDashThinking.choice(cfg.session, form.querySelector(".actions"));

  function showError(message) {
    banner.textContent = message; // textContent: never parsed as HTML
    banner.hidden = false;
  }

  function clearError() {
    banner.hidden = true;
    banner.textContent = "";
  }

  function fmt(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  function statsText(t) {
    const s = t.stats || {};
    const parts = [];
    parts.push(t.status === "decoding" || t.status === "prompt" || t.status === "queued" ? t.status : t.finish_reason || t.status);
    if (t.status === "queued" && t.queue_position === 0) parts.push("starting");
    if (t.status === "queued" && t.queue_position > 0) {
      const ahead = t.queue_ahead === 1 ? "1 turn waits" : `${t.queue_ahead} turns wait`;
      parts.push(`position ${t.queue_position} in the queue (${ahead} ahead of yours)`);
    }
    if (t.status === "queued" && t.waiting_reason) parts.push(t.waiting_reason);
    if (s.ttft_ms !== undefined) parts.push(`TTFT ${fmt(s.ttft_ms, 0)} ms`);
    const n = s.output_tokens !== undefined ? s.output_tokens : s.tokens;
    if (n !== undefined) parts.push(`${n} tokens`);
    if (s.decode_tps !== undefined) parts.push(`${fmt(s.decode_tps, 1)} tok/s`);
    parts.push(...RigDashThinking.statsParts(s));
    if (s.prompt_tokens !== undefined && s.prompt_tokens !== null) parts.push(`prompt ${s.prompt_tokens} tok in ${fmt(s.prompt_ms, 0)} ms`);
    if (s.context_tokens && s.context_limit) parts.push(`context ${s.context_tokens} / ${s.context_limit}`);
    const timings = s.backend_timings || {};
    if (timings.draft_n > 0) parts.push(`drafts ${fmt((100 * timings.draft_n_accepted) / timings.draft_n, 0)} % accepted (${timings.draft_n_accepted} / ${timings.draft_n})`);
    return parts.join(" · ");
  }

  function ensureTurn(snapshot) {
    let t = turns.get(snapshot.id);
    if (!t) {
      const el = document.createElement("li");
      el.className = "turn";
      el.dataset.turn = String(snapshot.id);
      const user = document.createElement("div");
      user.className = "user-msg";
      user.dataset.testid = "user-message";
      const reply = document.createElement("div");
      reply.className = "reply markdown";
      reply.dataset.testid = "reply";
      const stats = document.createElement("div");
      stats.className = "stats muted";
      stats.dataset.testid = "stats";
      const gauge = document.createElement("meter");
      gauge.className = "ctx-gauge";
      gauge.dataset.testid = "context-gauge";
      gauge.min = 0;
      gauge.max = 1;
      gauge.high = 0.9;
      gauge.hidden = true;
      const err = document.createElement("div");
      err.className = "turn-error error";
      err.hidden = true;
      const thinking = new RigDashThinking.ThinkingBlock();
      el.append(user, thinking.el, reply, stats, gauge, err);
      list.appendChild(el);
      t = { id: snapshot.id, text: "", thought: "", seq: 0, status: "", stats: {}, el, renderer: new RigDashMarkdown.ReplyRenderer(reply), thinking, resyncing: false };
      turns.set(snapshot.id, t);
      user.textContent = snapshot.user_text;
    }
    return t;
  }

  function applySnapshot(snapshot) {
    const t = ensureTurn(snapshot);
    t.text = snapshot.reply || "";
    t.seq = snapshot.seq || 0;
    t.status = snapshot.status;
    t.finish_reason = snapshot.finish_reason;
    t.stats = snapshot.stats || {};
    t.queue_position = snapshot.queue_position;
    t.queue_ahead = snapshot.queue_ahead;
    t.waiting_reason = snapshot.waiting_reason || "";
    t.resyncing = false;
    t.thought = snapshot.thinking || "";
    t.thinking.set(t.thought, ACTIVE.has(t.status) && !t.text);
    t.renderer.set(t.text);
    const err = t.el.querySelector(".turn-error");
    err.textContent = snapshot.error || "";
    err.hidden = !snapshot.error;
    updateTurnChrome(t);
    return t;
  }

  function updateTurnChrome(t) {
    t.el.dataset.status = t.status;
    t.el.querySelector(".stats").textContent = statsText(t);
    const s = t.stats || {};
    const gauge = t.el.querySelector(".ctx-gauge");
    if (s.context_tokens && s.context_limit) {
      gauge.value = Math.min(1, s.context_tokens / s.context_limit);
      gauge.title = `context ${s.context_tokens} / ${s.context_limit} tokens`;
      gauge.hidden = false;
    }
    refreshControls();
  }

  function refreshControls() {
    const running = [...turns.values()].some((x) => ACTIVE.has(x.status));
    stopBtn.hidden = !running;
    sendBtn.disabled = running || pendingText !== null;
  }

  function resync(t) {
    if (t.resyncing) return;
    t.resyncing = true;
    send({ type: "turn.resync", turn: t.id });
  }

  function onToken(msg) {
    const t = turns.get(msg.turn);
    if (!t) return send({ type: "turn.resync", turn: msg.turn });
    if (t.resyncing || msg.seq_to <= t.seq) return; // already held
    if (msg.seq_from !== t.seq + 1) return resync(t); // a gap: fetch the reply so far
    t.text += msg.text;
    t.seq = msg.seq_to;
    if (t.status !== "decoding") t.status = "decoding";
    t.stats = msg.stats;
    if (msg.thinking) t.thought += msg.thinking;
    if (t.thought) t.thinking.set(t.thought, !t.text);
    t.renderer.set(t.text);
    updateTurnChrome(t);
  }

  const handlers = {
    "session.snapshot": (msg) => {
      msg.turns.forEach(applySnapshot);
      scrollToEnd();
    },
    "turn.snapshot": (msg) => applySnapshot(msg.turn),
    "turn.queued": (msg) => {
      if (pendingText !== null && msg.turn.user_text === pendingText) {
        pendingText = null;
        input.value = "";
      }
      applySnapshot(msg.turn);
      scrollToEnd();
    },
    "turn.state": (msg) => {
      const t = turns.get(msg.turn);
      if (t && ACTIVE.has(t.status)) {
        t.status = msg.status;
        if (msg.queue_position !== undefined) {
          t.queue_position = msg.queue_position;
          t.queue_ahead = msg.queue_ahead;
          t.waiting_reason = msg.waiting_reason || "";
        }
        updateTurnChrome(t);
      }
    },
    token: onToken,
    "turn.end": (msg) => applySnapshot(msg.turn),
    error: (msg) => {
      if (pendingText !== null) {
        // A refused message stays in the box: nothing typed is lost. One the server stored while its task queue
        // is down (queue_unavailable) leaves it, or it would be sent twice.
        if (msg.code === "queue_unavailable" && input.value === pendingText) input.value = "";
        pendingText = null;
        refreshControls();
      }
      showError(msg.message);
      turns.forEach((t) => (t.resyncing = false));
    },
  };

  function scrollToEnd() {
    list.lastElementChild?.scrollIntoView({ block: "end" });
  }

  const socket = RigDashSocket.open(`/ws/chat/${cfg.session}/`, {
    handlers,
    label: connLabel,
    onOpen: clearError,
    final: [4401, 4404],
    onFinal: (code) => showError(code === 4401 ? "Log in again to continue." : "This chat does not exist."),
  });

  function send(obj) {
    if (socket.send(obj)) return true;
    showError("Not connected to the server; retrying…");
    return false;
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value;
    clearError();
    if (!text.trim()) return showError("The message is empty.");
    if (send({ type: "turn.send", text, params: thinkParams() })) {
      pendingText = text;
      sendBtn.disabled = true;
    }
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  stopBtn.addEventListener("click", () => {
    turns.forEach((t) => {
      if (ACTIVE.has(t.status)) send({ type: "turn.cancel", turn: t.id });
    });
  });
})();
