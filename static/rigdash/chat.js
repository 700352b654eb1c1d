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
  const ACTIVE = new Set(["queued", "prompt", "loading", "decoding"]); // "loading": a page-only state (the model loads first)

  const turns = new Map(); // id -> {id, text, thought, seq, status, stats, el, renderer, thinking, resyncing}
  let pendingText = null;
  const thinkParams = RigDashThinking.choice(cfg.session, form.querySelector(".actions"), cfg.thinkLevels);

  function showError(message) {
    banner.textContent = message; // textContent: never parsed as HTML
    banner.hidden = false;
  }

  function clearError() {
    banner.hidden = true;
    banner.textContent = "";
  }

  const statsText = RigDashStats.statsText;

  function copyButton(testid, label, text) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.dataset.testid = testid;
    button.textContent = "Copy";
    button.setAttribute("aria-label", label);
    button.addEventListener("click", () => RigDashMarkdown.copyFeedback(button, RigDashMarkdown.copyText(text())));
    return button;
  }

  // Branches (inference/chat_branch.py): regenerate and edit-and-resend make a new chat holding the conversation up to
  // that turn; both chats link to each other's version here.
  const versionsCfg = cfg.versions || { origin: null, branches: {} };
  const csrfInput = document.querySelector("[name=csrfmiddlewaretoken]");

  function versionLinks(turnId, index) {
    const links = [];
    const origin = versionsCfg.origin;
    if (origin && origin.index === index) links.push({ href: `/sessions/${origin.session}/`, text: `earlier version: ${origin.title}` });
    (versionsCfg.branches[String(turnId)] || []).forEach((b) => links.push({ href: `/sessions/${b.session}/`, text: b.title }));
    if (!links.length) return null;
    const nav = document.createElement("nav");
    nav.className = "versions muted";
    nav.dataset.testid = "versions";
    nav.setAttribute("aria-label", "Other versions of this message");
    nav.append("Other versions: ");
    links.forEach((link, i) => {
      const a = document.createElement("a");
      a.href = link.href;
      a.textContent = link.text; // textContent: titles are user text
      if (i) nav.append(" · ");
      nav.append(a);
    });
    return nav;
  }

  function actionButton(testid, text, label, onClick) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy turn-action";
    button.dataset.testid = testid;
    button.textContent = text;
    button.setAttribute("aria-label", label);
    button.addEventListener("click", onClick);
    return button;
  }

  async function branch(t, text, button, continueReply) {
    clearError();
    if (button) button.disabled = true;
    try {
      const response = await fetch(`/api/turns/${t.id}/branch`, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfInput ? csrfInput.value : "" },
        body: JSON.stringify(continueReply ? { continue: true } : text === null ? {} : { text }),
        credentials: "same-origin",
      });
      const body = await response.json().catch(() => ({}));
      if (response.ok && body.url) {
        window.location.assign(body.url);
        return;
      }
      showError((body.error && body.error.message) || `The branch was refused (HTTP ${response.status}).`);
    } catch (e) {
      showError("Could not reach the server.");
    }
    if (button) button.disabled = false;
  }

  function startEdit(t) {
    const user = t.el.querySelector(".user-msg");
    if (t.el.querySelector(".edit-form")) return;
    const editor = document.createElement("form");
    editor.className = "edit-form";
    const area = document.createElement("textarea");
    area.value = t.userText;
    area.rows = 3;
    area.dataset.testid = "edit-text";
    area.setAttribute("aria-label", "Edited message");
    const send = document.createElement("button");
    send.type = "submit";
    send.textContent = "Send as a branch";
    send.dataset.testid = "edit-send";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "secondary";
    cancel.textContent = "Cancel";
    cancel.addEventListener("click", () => editor.remove());
    editor.append(area, send, cancel);
    editor.addEventListener("submit", (event) => {
      event.preventDefault();
      if (!area.value.trim()) return showError("The message is empty.");
      branch(t, area.value, send);
    });
    area.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.stopPropagation();
        editor.remove();
      }
    });
    user.after(editor);
    area.focus();
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
      const userTools = document.createElement("div");
      userTools.className = "msg-tools user-tools";
      const versions = versionLinks(snapshot.id, list.children.length);
      if (versions) userTools.append(versions);
      const edit = actionButton("edit", "Edit", "Edit this message and send it as a branch", () => startEdit(t));
      const regen = actionButton("regenerate", "Regenerate", "Regenerate: answer this message again, keeping this reply", () => branch(t, null, regen));
      userTools.append(edit, regen, copyButton("copy-message", "Copy your message", () => t.userText));
      const tools = document.createElement("div");
      tools.className = "msg-tools";
      const more = actionButton("continue", "Continue", "Continue this reply where it was cut off", () => branch(t, null, more, true));
      more.classList.add("continue-action");
      tools.append(stats, gauge, copyButton("copy-reply", "Copy the reply as Markdown", () => t.text), more);
      el.append(user, userTools, thinking.el, reply, tools, err);
      list.appendChild(el);
      t = { id: snapshot.id, text: "", thought: "", seq: 0, status: "", stats: {}, el, renderer: new RigDashMarkdown.ReplyRenderer(reply), thinking, resyncing: false };
      turns.set(snapshot.id, t);
      user.textContent = snapshot.user_text;
      t.userText = snapshot.user_text;
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
    t.rig = snapshot.rig || t.rig || "";
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

  // inference/live/consumers.py NO_WORKER: the waiting reason of a turn whose rig's queue no worker consumes.
  const NO_WORKER = "waiting: no worker serves this rig right now";

  // The "no worker" banner follows the turns: shown when a waiting turn is told no worker serves the rig, hidden
  // once a turn reaches a worker or the reason goes away (the page may have loaded with either).
  function updateWorkerBanner(t) {
    let banner = document.querySelector('[data-testid="no-consumer"]');
    const stuck = t.status === "queued" && t.waiting_reason === NO_WORKER;
    if (stuck && !banner) {
      banner = document.createElement("p");
      banner.className = "banner error";
      banner.setAttribute("role", "alert");
      banner.dataset.testid = "no-consumer";
      banner.textContent = "No worker is serving this rig right now: messages sent here wait until one starts.";
      document.querySelector(".chat-head").after(banner);
    }
    if (!banner) return;
    if (stuck) banner.hidden = false;
    else if (t.status === "prompt" || t.status === "decoding" || (t.status === "queued" && t.reasonWas === NO_WORKER)) banner.hidden = true;
    t.reasonWas = t.waiting_reason;
  }

  function updateTurnChrome(t) {
    updateWorkerBanner(t);
    t.el.dataset.status = t.status;
    t.el.querySelectorAll(".turn-action").forEach((b) => (b.hidden = ACTIVE.has(t.status)));
    // Continue: a reply cut by its token cap or stopped, with text to go on from.
    const cut = t.finish_reason === "length" || t.status === "cancelled";
    t.el.querySelector(".continue-action").hidden = ACTIVE.has(t.status) || !cut || !t.text;
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

  function onToken(msg) {
    const t = RigDashTurnStream.accept(turns, msg, (id) => send({ type: "turn.resync", turn: id }));
    if (!t) return;
    if (t.status !== "decoding") t.status = "decoding";
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
    // After the replies' next render (ReplyRenderer draws on the animation frame this one follows).
    requestAnimationFrame(() => list.lastElementChild?.scrollIntoView({ block: "end" }));
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
  function stopReplies() {
    turns.forEach((t) => {
      if (ACTIVE.has(t.status)) send({ type: "turn.cancel", turn: t.id });
    });
  }
  stopBtn.addEventListener("click", stopReplies);

  // Keyboard: Esc stops a running reply; "/" outside a text field goes to the message box.
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !stopBtn.hidden) {
      event.preventDefault();
      stopReplies();
      return;
    }
    const target = event.target;
    const typing = target.closest && target.closest("input, textarea, select, [contenteditable]");
    if (event.key === "/" && !typing && !event.ctrlKey && !event.metaKey && !event.altKey) {
      event.preventDefault();
      input.focus();
    }
  });

  const sidebar = document.querySelector("[data-testid=sidebar]");
  const sidebarToggle = document.querySelector("[data-testid=sidebar-toggle]");
  sidebarToggle.addEventListener("click", () => {
    const open = sidebarToggle.getAttribute("aria-expanded") !== "true";
    sidebarToggle.setAttribute("aria-expanded", String(open));
    sidebar.classList.toggle("open", open);
  });
})();
