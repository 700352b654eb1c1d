/* Decode sweeps. The list page: the start form posts to the sweep API and opens the new sweep's page, or shows
 * what is wrong. A sweep's page: live over /ws/monitoring/sweeps/<id>/ (sweep.snapshot {sweep} on connect with
 * every point so far, then progress {sweep, points} as steps start and end), its progress bar, its points in a
 * table and on the prediction's charts, and Cancel. Everything from the server is shown with textContent.
 */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("page-config").textContent);
  const $ = (sel) => document.querySelector(sel);
  const csrf = () => ($("[name=csrfmiddlewaretoken]") || {}).value || "";

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf(), Accept: "application/json" },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    const data = await response.json().catch(() => ({ error: { message: `HTTP ${response.status}` } }));
    return { ok: response.ok, data };
  }

  function showError(el, message) {
    el.textContent = message || "";
    el.hidden = !message;
  }

  // The list page -----------------------------------------------------------------------------------------------
  const form = $("[data-testid=sweep-form]");
  if (form) {
    const error = $("[data-testid=sweep-error]");
    const rigSelect = $("[data-testid=sweep-rig]");
    const modelInput = $("[data-testid=sweep-model]");
    const list = document.getElementById("sweep-models");

    async function loadModels() {
      if (!rigSelect.value) return;
      const response = await fetch(cfg.models.replace("{rig}", rigSelect.value), { credentials: "same-origin" });
      if (!response.ok) return;
      const data = await response.json();
      list.replaceChildren(...data.models.map((m) => Object.assign(document.createElement("option"), { value: m.name })));
      if (!modelInput.value && data.models.length) modelInput.value = data.models[0].name;
    }
    rigSelect.addEventListener("change", () => {
      modelInput.value = "";
      loadModels();
    });
    loadModels();

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const values = Object.fromEntries(new FormData(form));
      delete values.csrfmiddlewaretoken;
      values.force = form.elements.force.checked;
      const button = $("[data-testid=sweep-start]");
      button.disabled = true;
      const { ok, data } = await post(cfg.start, values);
      button.disabled = false;
      if (ok) location.assign(data.url);
      else showError(error, data.error ? data.error.message : "The sweep could not start.");
    });
    return;
  }

  // A sweep's page ----------------------------------------------------------------------------------------------
  const PLOT_CONFIG = { displaylogo: false, responsive: true };
  const figures = cfg.figures;
  const points = [];
  let sweep = JSON.parse(document.getElementById("sweep-snapshot").textContent);

  function draw() {
    if (!figures || typeof Plotly === "undefined") return;
    for (const [name, figure] of Object.entries(figures)) {
      const trace = figure.data.find((t) => t.name === cfg.trace);
      const done = points.filter((p) => p.decode_tps !== null && p.context_mean !== null);
      trace.x = done.map((p) => (name === "context" ? p.context_mean : p.decoding_together || p.sessions));
      trace.y = done.map((p) => p.decode_tps);
      trace.text = done.map((p) => `turn ${p.turn}: step ${p.step + 1}, ${p.prompt_tokens} prompt tokens, ${p.decoding_together} running`);
      Plotly.react(document.getElementById(`fig-${name}`), figure.data, figure.layout, PLOT_CONFIG);
    }
  }

  function fmt(value, digits) {
    if (value === null || value === undefined) return "–";
    return digits === undefined ? String(value) : Number(value).toFixed(digits);
  }

  function addRows(rows) {
    const tbody = $("[data-testid=sweep-points] tbody");
    for (const p of rows) {
      points.push(p);
      const tr = document.createElement("tr");
      tr.dataset.turn = p.turn;
      const predicted = cfg.predicted ? cfg.predicted[p.step] : null;
      const pct = predicted && p.decode_tps !== null ? (100 * p.decode_tps) / predicted : null;
      const ratio = pct === null ? null : `${pct >= 10 ? Math.round(pct) : pct.toFixed(1)} %`;
      for (const value of [p.step + 1, p.context_target, p.sessions, p.turn, p.prompt_tokens, p.output_tokens,
        p.decoding_together, fmt(p.decode_tps, 1), fmt(predicted, 1), ratio]) {
        const td = document.createElement("td");
        td.textContent = fmt(value);
        tr.appendChild(td);
      }
      tbody.appendChild(tr);
    }
  }

  function showState(s) {
    sweep = s;
    const bar = $("[data-testid=sweep-progress]");
    bar.max = s.steps;
    bar.value = s.step;
    const step = s.running_step ? `; now ${s.running_step.context} tokens, ${s.running_step.sessions} at once` : "";
    $("[data-testid=sweep-step]").textContent = `${s.step} of ${s.steps} steps${step}`;
    $("[data-testid=sweep-status]").textContent = s.status;
    $("[data-testid=sweep-cancel]").hidden = s.status !== "running";
    showError($("[data-testid=sweep-error]"), s.error);
  }

  RigDashSocket.open(cfg.ws, {
    label: $("[data-testid=sweep-connection]"),
    final: [4401, 4403, 4404],
    onFinal: () => showError($("[data-testid=sweep-error]"), "You no longer have access to this sweep."),
    handlers: {
      "sweep.snapshot": (msg) => {
        points.length = 0;
        $("[data-testid=sweep-points] tbody").replaceChildren();
        addRows(msg.sweep.points || []);
        showState(msg.sweep);
        draw();
      },
      progress: (msg) => {
        const known = new Set(points.map((p) => p.turn));
        addRows((msg.points || []).filter((p) => !known.has(p.turn)));
        showState(msg.sweep);
        if (msg.points && msg.points.length) draw();
      },
    },
  });

  $("[data-testid=sweep-cancel]").addEventListener("click", async (event) => {
    event.target.disabled = true;
    const { ok, data } = await post(cfg.cancel, {});
    event.target.disabled = false;
    if (ok) showState({ ...sweep, ...data.sweep });
    else showError($("[data-testid=sweep-error]"), data.error ? data.error.message : "The sweep could not be cancelled.");
  });
  showState(sweep);
  addRows(sweep.points || []);
  window.addEventListener("load", draw);
})();
