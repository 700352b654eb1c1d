/* A rig's model-management page (staff only): installed and loaded models, pull with a live progress
 * bar, delete, load, unload.
 *
 * Actions are POSTs to the page's JSON API; a pull runs in a worker and reports progress over the
 * websocket /ws/rigs/<id>/models/ (frames pull.progress, pull.end, models.changed). After anything
 * changes the page re-reads the rig's state. Every name and message is set with textContent.
 */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("page-config").textContent);
  const banner = document.querySelector("[data-testid=error]");
  const connLabel = document.querySelector("[data-testid=connection]");
  const installedBody = document.querySelector("[data-testid=installed]");
  const loadedBody = document.querySelector("[data-testid=loaded]");
  const pullForm = document.querySelector("[data-testid=pull-form]");
  const pullList = document.querySelector("[data-testid=pulls]");
  let capabilities = cfg.overview.capabilities;
  const pulls = new Map(); // pull id -> {el, bar, status}

  function showError(message) {
    banner.textContent = message;
    banner.hidden = false;
  }

  function clearError() {
    banner.hidden = true;
    banner.textContent = "";
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["bytes", "KB", "MB", "GB", "TB"];
    let value = Number(n);
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return unit === 0 ? `${value} bytes` : `${value.toFixed(1)} ${units[unit]}`;
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined || text === "" ? "–" : String(text);
    row.appendChild(td);
    return td;
  }

  function actionCell(row, action, label, model, allowed) {
    const td = document.createElement("td");
    if (allowed) {
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.action = action;
      button.dataset.model = model;
      button.textContent = label;
      if (action === "delete") button.className = "danger";
      td.appendChild(button);
    }
    row.appendChild(td);
  }

  function emptyRow(body, columns, text) {
    const row = document.createElement("tr");
    const td = cell(row, text);
    td.colSpan = columns;
    td.className = "muted";
    body.appendChild(row);
  }

  function render(overview) {
    capabilities = overview.capabilities;
    installedBody.replaceChildren();
    for (const m of overview.models) {
      const row = document.createElement("tr");
      row.dataset.model = m.name;
      cell(row, m.name);
      cell(row, bytes(m.size_bytes));
      cell(row, (m.details || {}).family);
      cell(row, (m.details || {}).quantization_level);
      const loaded = overview.loaded.some((l) => l.name === m.name);
      actionCell(row, "load", "Load", m.name, capabilities.load && !loaded);
      actionCell(row, "delete", "Delete", m.name, capabilities.delete);
      installedBody.appendChild(row);
    }
    if (!overview.models.length) emptyRow(installedBody, 6, "No models.");
    if (loadedBody) {
      loadedBody.replaceChildren();
      for (const m of overview.loaded) {
        const row = document.createElement("tr");
        row.dataset.model = m.name;
        cell(row, m.name);
        cell(row, bytes(m.size_bytes));
        cell(row, bytes(m.size_vram_bytes));
        cell(row, m.context_length);
        cell(row, m.expires_at);
        actionCell(row, "unload", "Unload", m.name, capabilities.unload);
        loadedBody.appendChild(row);
      }
      if (!overview.loaded.length) emptyRow(loadedBody, 6, "Nothing is loaded.");
    }
    if (overview.errors.length) showError(overview.errors.join(" "));
  }

  async function api(path, body) {
    const options = body === undefined
      ? {headers: {Accept: "application/json"}}
      : {
          method: "POST",
          headers: {"Content-Type": "application/json", "X-CSRFToken": cfg.csrfToken, Accept: "application/json"},
          body: JSON.stringify(body),
        };
    let response;
    try {
      response = await fetch(`${cfg.api}/${path}`, {credentials: "same-origin", ...options});
    } catch (err) {
      throw new Error("RigDash is unreachable; try again.");
    }
    let payload = {};
    try {
      payload = await response.json();
    } catch (err) {
      payload = {};
    }
    if (!response.ok) {
      const error = payload.error || {};
      throw new Error(error.message || `The request failed (${response.status}).`);
    }
    return payload;
  }

  async function refresh() {
    try {
      clearError();
      render(await api("state"));
    } catch (err) {
      showError(err.message);
    }
  }

  function ensurePull(id, model) {
    let pull = pulls.get(id);
    if (!pull) {
      const el = document.createElement("li");
      el.dataset.pull = id;
      el.dataset.state = "running";
      const name = document.createElement("span");
      name.className = "pull-model";
      name.textContent = model;
      const bar = document.createElement("progress");
      bar.max = 1;
      bar.removeAttribute("value"); // indeterminate until a layer reports its size
      bar.setAttribute("aria-label", `Pull of ${model}`);
      const status = document.createElement("span");
      status.className = "pull-status muted";
      status.textContent = "queued";
      el.append(name, bar, status);
      pullList.prepend(el);
      pull = {el, bar, status};
      pulls.set(id, pull);
    }
    return pull;
  }

  function onProgress(msg) {
    const pull = ensurePull(msg.pull, msg.model);
    if (msg.total) {
      pull.bar.max = msg.total;
      pull.bar.value = msg.completed || 0;
      const pct = Math.floor((100 * (msg.completed || 0)) / msg.total);
      pull.status.textContent = `${msg.status} · ${pct}% of ${bytes(msg.total)}`;
    } else {
      pull.status.textContent = msg.status;
    }
  }

  function onEnd(msg) {
    const pull = ensurePull(msg.pull, msg.model);
    if (msg.ok) {
      pull.el.dataset.state = "done";
      pull.bar.max = 1;
      pull.bar.value = 1;
      pull.status.textContent = "done";
      refresh();
    } else {
      pull.el.dataset.state = "failed";
      pull.bar.max = 1;
      pull.bar.value = 0;
      pull.status.textContent = (msg.error && msg.error.message) || "failed";
      showError(`Pull of ${msg.model} failed: ${pull.status.textContent}`);
    }
  }

  RigDashSocket.open(`/ws/rigs/${cfg.rig}/models/`, {
    handlers: {
      "pull.progress": onProgress,
      "pull.end": onEnd,
      "models.changed": () => refresh(),
      error: (msg) => showError(msg.message),
    },
    label: connLabel,
    onReconnect: refresh, // events sent while the socket was down are lost: re-read the state
    maxRetryMs: 10000,
  });

  if (pullForm) {
    pullForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const input = pullForm.elements.model;
      const model = input.value.trim();
      if (!model) return;
      try {
        clearError();
        const reply = await api("pull", {model});
        ensurePull(reply.pull.id, reply.pull.model);
        input.value = "";
      } catch (err) {
        showError(err.message);
      }
    });
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const {action, model} = button.dataset;
    if (action === "delete" && !window.confirm(`Delete ${model} from ${cfg.overview.rig.name}? Its files are removed.`)) return;
    button.disabled = true;
    try {
      clearError();
      await api(action, {model});
      await refresh();
    } catch (err) {
      showError(err.message);
      button.disabled = false;
    }
  });
})();
