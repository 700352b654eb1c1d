/* The admin board: every turn across users and rigs, live over /ws/board/.
 *
 * Frames: board.snapshot {turns, rigs} replaces everything; turn {turn: row} upserts a row; progress
 * {turn, status, tokens, decode_tps, context_used, n_ctx, context_ratio} updates a running row (the
 * worker sends it at most ~2/s per turn); queue {rig, positions} updates queue positions; sweep {sweep}
 * shows a decode sweep's step (a running sweep's turns are rows like any other). Stop sends turn.cancel. Everything from the server is shown with textContent, never parsed as HTML.
 */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("page-config").textContent);
  const tbody = document.querySelector("[data-testid=board-rows]");
  const banner = document.querySelector("[data-testid=board-error]");
  const connLabel = document.querySelector("[data-testid=board-connection]");
  const rigsLabel = document.querySelector("[data-testid=rigs]");
  const ACTIVE = new Set(["queued", "prompt", "decoding"]);
  const rows = new Map(); // id -> {data, el}
  const sweepsList = document.querySelector("[data-testid=board-sweeps]");
  const sweeps = new Map(); // id -> li

  function showSweep(sw) {
    let li = sweeps.get(sw.id);
    if (sw.status !== "running") {
      if (li) li.remove();
      sweeps.delete(sw.id);
      sweepsList.hidden = sweeps.size === 0;
      return;
    }
    if (!li) {
      li = document.createElement("li");
      li.dataset.sweep = sw.id;
      sweepsList.appendChild(li);
      sweeps.set(sw.id, li);
    }
    const link = document.createElement("a");
    link.href = `/monitoring/sweeps/${sw.id}/`;
    link.textContent = `sweep ${sw.id}`;
    const step = sw.running_step ? `: ${sw.running_step.context} tokens, ${sw.running_step.sessions} at once` : "";
    const text = document.createTextNode(
      ` of ${sw.rig_name} by ${sw.owner} (${sw.model}), step ${Math.min(sw.step + 1, sw.steps)} of ${sw.steps}${step}`);
    li.replaceChildren(link, text);
    sweepsList.hidden = false;
  }

  function showError(message) {
    banner.textContent = message;
    banner.hidden = false;
  }

  function setText(td, text) {
    td.textContent = text === null || text === undefined ? "–" : String(text);
  }

  function stateText(d) {
    if (d.status === "queued") {
      // Why it waits, as its chat page says (a rig that cannot take turns, no worker, a model swap).
      const why = d.waiting_reason ? ` · ${d.waiting_reason}` : "";
      if (d.queue_position === 0) return `queued (starting)${why}`;
      if (d.queue_position) return `queued #${d.queue_position} (${d.queue_position - 1} ahead)${why}`;
      return `queued${why}`;
    }
    if (ACTIVE.has(d.status)) return d.status;
    return d.finish_reason && d.finish_reason !== d.status ? `${d.status} (${d.finish_reason})` : d.status;
  }

  function fillContext(td, d) {
    td.replaceChildren();
    if (d.context_used === null || d.context_used === undefined) {
      td.textContent = "–";
      return;
    }
    const label = document.createElement("span");
    label.textContent = d.n_ctx ? `${d.context_used} / ${d.n_ctx} ` : `${d.context_used} `;
    td.appendChild(label);
    if (d.n_ctx) {
      const bar = document.createElement("span");
      bar.className = "fill";
      const inner = document.createElement("span");
      inner.style.width = `${Math.min(100, Math.round((d.context_ratio || 0) * 100))}%`; // CSSOM: allowed by the CSP
      bar.appendChild(inner);
      td.appendChild(bar);
    }
    const cut = window.RigDashStats ? window.RigDashStats.truncationText(d.history_truncated) : "";
    if (cut) {
      const warn = document.createElement("span");
      warn.className = "history-cut";
      warn.dataset.testid = "history-cut";
      warn.textContent = " ⚠ history cut";
      warn.title = cut;
      td.appendChild(warn);
    }
  }

  function started(d) {
    const at = d.started_at || d.created_at;
    return at ? new Date(at).toLocaleTimeString() : null;
  }

  const COLUMNS = ["id", "user", "rig", "model", "state", "tokens", "tps", "context", "started", "actions"];

  function build(d) {
    const tr = document.createElement("tr");
    const cells = {};
    COLUMNS.forEach((name) => {
      const td = document.createElement("td");
      td.dataset.testid = name;
      tr.appendChild(td);
      cells[name] = td;
    });
    const stop = document.createElement("button");
    stop.type = "button";
    stop.className = "small danger";
    stop.textContent = "Cancel";
    stop.dataset.testid = "cancel";
    stop.addEventListener("click", () => {
      stop.disabled = true;
      send({ type: "turn.cancel", turn: d.id });
    });
    cells.actions.appendChild(stop);
    return { data: d, el: tr, cells, stop };
  }

  // An API request's key name and client (its user agent, shortened to its first word).
  function apiClient(client) {
    if (!client) return "";
    const agent = (client.agent || "").split(" ")[0];
    return `: ${client.key}${agent ? `, ${agent}` : ""}`;
  }

  function render(d) {
    let entry = rows.get(d.id);
    const fresh = !entry;
    if (fresh) {
      entry = build(d);
      rows.set(d.id, entry);
    }
    const moved = fresh || ACTIVE.has(entry.data.status) !== ACTIVE.has(d.status);
    entry.data = d;
    const c = entry.cells;
    entry.el.dataset.turn = String(d.id);
    entry.el.dataset.status = d.status;
    entry.el.dataset.user = d.user;
    setText(c.id, d.id);
    setText(c.user, d.via_api ? `${d.user} (via API${apiClient(d.api_client)})` : d.user);
    setText(c.rig, d.rig);
    setText(c.model, d.model);
    setText(c.state, stateText(d));
    setText(c.tokens, d.tokens);
    setText(c.tps, d.decode_tps === null || d.decode_tps === undefined ? null : Number(d.decode_tps).toFixed(1));
    fillContext(c.context, d);
    setText(c.started, started(d));
    entry.stop.hidden = !ACTIVE.has(d.status);
    if (moved) place(entry);
  }

  // Active turns first (oldest first), then ended ones (newest first).
  function place(entry) {
    const sorted = [...rows.values()].sort((a, b) => {
      const aa = ACTIVE.has(a.data.status), ba = ACTIVE.has(b.data.status);
      if (aa !== ba) return aa ? -1 : 1;
      return aa ? a.data.id - b.data.id : b.data.id - a.data.id;
    });
    const index = sorted.indexOf(entry);
    const next = sorted[index + 1];
    tbody.insertBefore(entry.el, next ? next.el : null);
  }

  const handlers = {
    "board.snapshot": (msg) => {
      rows.clear();
      tbody.replaceChildren();
      msg.turns.forEach(render);
      sweeps.forEach((li) => li.remove());
      sweeps.clear();
      (msg.sweeps || []).forEach(showSweep);
      sweepsList.hidden = sweeps.size === 0;
      rigsLabel.textContent = msg.rigs.map((r) => `${r.name}: ${r.slots} slots${r.server_slots != null && r.server_slots > r.slots ? ` (the server has ${r.server_slots})` : ""}${r.enabled ? "" : " (disabled)"}`).join(" · ");
    },
    turn: (msg) => render(msg.turn),
    sweep: (msg) => showSweep(msg.sweep),
    progress: (msg) => {
      const entry = rows.get(msg.turn);
      if (!entry || !ACTIVE.has(entry.data.status)) return;
      const d = { ...entry.data, status: msg.status, tokens: msg.tokens, decode_tps: msg.decode_tps,
        prompt_tokens: msg.prompt_tokens, context_used: msg.context_used, n_ctx: msg.n_ctx, context_ratio: msg.context_ratio };
      render(d);
    },
    queue: (msg) => {
      Object.entries(msg.positions).forEach(([id, position]) => {
        const entry = rows.get(Number(id));
        const waiting_reason = (msg.reasons || {})[id] || "";
        if (entry && entry.data.status === "queued") render({ ...entry.data, queue_position: position, waiting_reason });
      });
    },
    "cancel.accepted": () => {},
    error: (msg) => {
      showError(msg.message);
      const entry = msg.turn !== undefined ? rows.get(Number(msg.turn)) : null;
      if (entry) entry.stop.disabled = false;
    },
  };

  const socket = RigDashSocket.open(cfg.ws, {
    handlers,
    label: connLabel,
    onOpen: () => (banner.hidden = true),
    final: [4401, 4403],
    onFinal: () => showError("You no longer have access to the board. Log in again as an admin."),
  });

  function send(obj) {
    if (socket.send(obj)) return true;
    showError("Not connected to the server; retrying…");
    return false;
  }
})();
