/* The decode calculator: every input change asks /api/calculator for the answer, redraws the outputs and the
 * charts (figures are built in Python, monitoring/calculator_plots.py) and puts the inputs in the URL, so a copied
 * URL restores the result. A preset select fills its fields; each stays editable. Text is set with textContent only.
 */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("page-config").textContent);
  const $ = (sel, root = document) => root.querySelector(sel);
  const form = $("[data-testid=calc-form]");
  const PLOT_CONFIG = { displaylogo: false, responsive: true };
  const GIB = 2 ** 30;
  let pending = null;
  let seq = 0;

  const num = (v, d = 1) => (v === null || v === undefined || Number.isNaN(v) ? "–" : Number(v).toLocaleString("en", { maximumFractionDigits: d, minimumFractionDigits: d }));
  const bytes = (b) => (b === null || b === undefined ? "–" : b >= GIB ? `${num(b / GIB, 2)} GiB` : `${num(b / 2 ** 20, 2)} MiB`);
  const secs = (s) => (s === null || s === undefined ? "–" : s < 1 ? `${num(s * 1000, 1)} ms` : `${num(s, 2)} s`);

  function setField(name, value) {
    const el = form.elements.namedItem(name);
    if (!el) return;
    el.value = value === null || value === undefined ? "" : String(value);
  }

  function applyPreset(group, key) {
    let fields = null;
    if (key === "rig") {
      const rig = cfg.rigs.find((r) => String(r.id) === form.elements.namedItem("rig").value);
      fields = rig ? rig[group] : null;
    } else if (cfg.presets[group] && cfg.presets[group][key]) {
      fields = cfg.presets[group][key].fields;
      if (group === "hw" && cfg.presets.hw[key].host) {
        setField("host", cfg.presets.hw[key].host);
        applyPreset("host", cfg.presets.hw[key].host);
      }
    }
    if (fields) for (const [name, value] of Object.entries(fields)) setField(name, value);
    if (group === "hw" && key === "rig") {
      setField("host", "rig");
      applyPreset("host", "rig");
    }
  }

  function showSources() {
    const parts = [];
    for (const group of ["model", "hw", "host", "link"]) {
      const key = form.elements.namedItem(group).value;
      const preset = cfg.presets[group] && cfg.presets[group][key];
      if (preset) parts.push(`${preset.label}: ${preset.source}`);
      if (key === "rig") {
        const rig = cfg.rigs.find((r) => String(r.id) === form.elements.namedItem("rig").value);
        if (rig) parts.push(rig.source);
      }
    }
    $("[data-testid=preset-sources]").textContent = parts.length ? `Sources: ${parts.join(" · ")}` : "";
  }

  function showErrors(errors) {
    for (const el of form.querySelectorAll(".field-error")) el.textContent = "";
    const banner = $("[data-testid=calc-error]");
    if (!errors) {
      banner.hidden = true;
      banner.textContent = "";
      return;
    }
    const general = [];
    for (const [field, messages] of Object.entries(errors)) {
      const slot = form.querySelector(`.field-error[data-field="${field}"]`);
      if (slot) slot.textContent = messages.join(" ");
      else general.push(messages.join(" "));
    }
    banner.hidden = false;
    banner.textContent = `Nothing computed: ${Object.keys(errors).join(", ")} ${general.length ? "— " + general.join(" ") : "need fixing."}`;
  }

  function outputRows(r) {
    const full = r.at_full_context;
    const start = r.at_prompt;
    const p = r.placement;
    const e = r.energy;
    return [
      ["weights", bytes(r.weight_bytes), "weights"],
      ["KV cache per token", `${num(r.kv_bytes_per_token, 0)} bytes`, "kv-per-token"],
      ["KV cache (context × sessions)", bytes(r.kv_bytes), "kv-total"],
      ["fits", p.fits ? (p.spilled_bytes > 0 ? `yes, ${bytes(p.spilled_bytes)} (${num(p.spill_fraction * 100, 1)} %) spilled to system RAM` : "yes, all in fast memory") : `no: ${bytes(p.short_bytes)} short`, "fits"],
      ["decode tokens/s per session (full context)", full ? num(full.per_session_tps, 1) : "–", "tps-session"],
      ["decode tokens/s total (full context)", full ? `${num(full.total_tps, 1)}${full.compute_bound ? " (compute-bound: FLOP/s, not bandwidth, sets it)" : ""}` : "–", "tps-total"],
      ["decode tokens/s per session at the prompt", start ? num(start.per_session_tps, 1) : "–", "tps-start"],
      ["prefill", secs(r.prefill_s), "prefill"],
      ["time to first token", secs(r.ttft_s), "ttft"],
      ["most sessions at this context", `${r.max_sessions_fast} in fast memory, ${r.max_sessions_total} in all memory`, "max-sessions"],
      ["spills from", `${r.spill_context === null ? "–" : num(r.spill_context, 0)} tokens a session · ${r.spill_sessions === null ? "–" : num(r.spill_sessions, 0)} sessions`, "spill-at"],
      ["energy per million output tokens", e ? `${num(e.joules_per_million / 1e6, 2)} MJ (${num(e.kwh_per_million, 3)} kWh)` : "–", "energy"],
      ["cost per million output tokens (the price's currency)", e && e.cost_per_million !== null ? num(e.cost_per_million, 4) : "–", "cost"],
      ["reading pace", r.reading_pace === null ? "–" : `${num(r.reading_pace, 1)} × a reader's ${num(r.reading_tps, 1)} tokens/s (238 words/min)`, "reading"],
    ];
  }

  function render(answer) {
    const tbody = $("[data-testid=outputs] tbody");
    tbody.replaceChildren();
    for (const [label, value, id] of outputRows(answer.result)) {
      const tr = document.createElement("tr");
      const th = document.createElement("td");
      th.textContent = label;
      const td = document.createElement("td");
      td.textContent = value;
      td.dataset.testid = `out-${id}`;
      tr.append(th, td);
      tbody.appendChild(tr);
    }
    for (const [name, figure] of Object.entries(answer.figures)) {
      const el = document.getElementById(`fig-${name}`);
      if (el && typeof Plotly !== "undefined") Plotly.react(el, figure.data, figure.layout, PLOT_CONFIG);
    }
    const m = answer.measured;
    $("[data-testid=measured-note]").textContent = m.rig ? `${m.points} finished turns of the rig plotted as measured points.` : "Pick a rig above to plot its finished turns beside the prediction.";
    $("[data-testid=share-link]").href = answer.url;
    if (location.pathname + location.search !== answer.url) history.replaceState(null, "", answer.url);
  }

  async function compute() {
    const mine = ++seq;
    const state = $("[data-testid=calc-state]");
    state.textContent = "computing…";
    const params = new URLSearchParams(new FormData(form));
    let response;
    try {
      response = await fetch(`${cfg.api}?${params}`, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    } catch (err) {
      state.textContent = `request failed: ${err}`;
      return;
    }
    if (mine !== seq) return; // a newer input's answer is on its way
    const body = await response.json();
    if (mine !== seq) return;
    if (response.ok) {
      showErrors(null);
      render(body);
      state.textContent = "";
      form.dataset.computed = String(mine);
    } else {
      showErrors(body.error.fields || { __all__: [body.error.message] });
      state.textContent = "inputs need fixing";
    }
    showSources();
  }

  function schedule() {
    clearTimeout(pending);
    pending = setTimeout(compute, 250);
  }

  form.addEventListener("change", (event) => {
    const name = event.target.name;
    if (["model", "hw", "host", "link"].includes(name)) applyPreset(name, event.target.value);
    if (name === "rig") {
      for (const group of ["model", "hw"]) {
        if (form.elements.namedItem(group).value === "rig") applyPreset(group, "rig");
      }
    }
    schedule();
  });
  form.addEventListener("input", (event) => {
    if (event.target.tagName === "INPUT") schedule();
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    compute();
  });

  showSources();
  form.dataset.computed = "0";
  if (cfg.answer) {
    const draw = () => render(cfg.answer);
    if (typeof Plotly !== "undefined") draw();
    else window.addEventListener("load", draw);
  } else {
    showErrors(cfg.errors);
  }
})();
