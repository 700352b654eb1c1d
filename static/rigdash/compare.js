/* Compare: two chats side by side, each on its own websocket, both streaming; one box sends to both.
 *
 * Each pane follows the chat page's delivery contract (docs/streaming.md) in brief: snapshots set a turn, token
 * batches append when their seq follows, a gap asks for the turn's snapshot. */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("page-config").textContent);
  const form = document.querySelector("[data-testid=compare-composer]");
  const input = document.querySelector("[data-testid=message]");
  const banner = document.querySelector("[data-testid=error]");
  const ACTIVE = new Set(["queued", "prompt", "loading", "decoding"]); // "loading": a page-only state (the model loads first)

  function showError(message) {
    banner.textContent = message;
    banner.hidden = false;
  }

  function pane(sessionId, root) {
    const list = root.querySelector("[data-testid=turns]");
    const turns = new Map();
    let socket = null;

    function ensure(snapshot) {
      let t = turns.get(snapshot.id);
      if (t) return t;
      const el = document.createElement("li");
      el.className = "turn";
      const user = document.createElement("div");
      user.className = "user-msg";
      user.textContent = snapshot.user_text;
      const reply = document.createElement("div");
      reply.className = "reply markdown";
      reply.dataset.testid = "reply";
      const stats = document.createElement("div");
      stats.className = "stats muted";
      stats.dataset.testid = "stats";
      el.append(user, reply, stats);
      list.appendChild(el);
      t = { id: snapshot.id, text: "", seq: 0, status: "", stats: {}, el, renderer: new RigDashMarkdown.ReplyRenderer(reply) };
      turns.set(snapshot.id, t);
      return t;
    }

    function chrome(t) {
      t.el.dataset.status = t.status;
      t.el.querySelector(".stats").textContent = RigDashStats.statsText(t);
    }

    function apply(snapshot) {
      const t = ensure(snapshot);
      Object.assign(t, {
        text: snapshot.reply || "", seq: snapshot.seq || 0, status: snapshot.status, finish_reason: snapshot.finish_reason,
        stats: snapshot.stats || {}, queue_position: snapshot.queue_position, queue_ahead: snapshot.queue_ahead, resyncing: false,
      });
      t.renderer.set(t.text);
      chrome(t);
    }

    const handlers = {
      "session.snapshot": (msg) => msg.turns.forEach(apply),
      "turn.snapshot": (msg) => apply(msg.turn),
      "turn.queued": (msg) => apply(msg.turn),
      "turn.end": (msg) => apply(msg.turn),
      "turn.state": (msg) => {
        const t = turns.get(msg.turn);
        if (t && ACTIVE.has(t.status)) {
          t.status = msg.status;
          chrome(t);
        }
      },
      token: (msg) => {
        const t = RigDashTurnStream.accept(turns, msg, (id) => socket.send({ type: "turn.resync", turn: id }));
        if (!t) return;
        t.status = "decoding";
        t.renderer.set(t.text);
        chrome(t);
      },
      error: (msg) => showError(msg.message),
    };
    socket = RigDashSocket.open(`/ws/chat/${sessionId}/`, {
      handlers,
      label: root.querySelector("[data-testid=connection]"),
      final: [4401, 4404],
      onFinal: () => showError("This chat is not available."),
    });
    return {
      send: (text) => socket.send({ type: "turn.send", text }),
      busy: () => [...turns.values()].some((t) => ACTIVE.has(t.status)),
      stop: () => turns.forEach((t) => ACTIVE.has(t.status) && socket.send({ type: "turn.cancel", turn: t.id })),
    };
  }

  const roots = document.querySelectorAll("[data-testid=pane]");
  const panes = cfg.sessions.map((id, i) => pane(id, roots[i]));

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    banner.hidden = true;
    const text = input.value;
    if (!text.trim()) return showError("The message is empty.");
    if (panes.some((p) => p.busy())) return showError("Wait for both replies to finish (or press Esc to stop them).");
    panes.forEach((p) => p.send(text));
    input.value = "";
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") panes.forEach((p) => p.stop());
  });
})();
