/* A rig's dashboard: Plotly panels drawn from the server's figures, then extended live from samples.
 *
 * Each sample arrives over /ws/monitoring/rigs/<id>/ about once a second. Time-series panels are
 * extended with Plotly.extendTraces in a bounded window (never re-plotted); tables are rebuilt with
 * textContent only. A source that failed shows "unavailable: <reason>" on its panel.
 */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("page-config").textContent);
  const $ = (sel, root = document) => root.querySelector(sel);
  const PLOT_CONFIG = { displaylogo: false, responsive: true };
  const WINDOW = { "5m": 300, "15m": 900, "1h": 3600, "6h": 21600 };
  let range = cfg.range;
  let figures = cfg.figures;

  const fmt = (v, d = 1) => (v === null || v === undefined || Number.isNaN(v) ? "–" : Number(v).toFixed(d));
  const mib = (b) => (b === null || b === undefined ? "–" : `${(b / 2 ** 20).toFixed(1)} MiB`);
  const gib = (b) => (b === null || b === undefined ? "–" : `${(b / 2 ** 30).toFixed(2)} GiB`);

  function draw(name, figure) {
    const el = document.getElementById(`fig-${name}`);
    if (!el || !figure) return;
    // A panel with nothing to chart on this rig (no GPU, no power reading) stays hidden until a sample brings a value.
    el.hidden = Boolean(figure.meta && figure.meta.hide_empty) && figure.data.every((trace) => !trace.x.length);
    if (!el.hidden) Plotly.react(el, figure.data, figure.layout, PLOT_CONFIG);
  }

  function drawAll() {
    for (const [name, figure] of Object.entries(figures)) draw(name, figure);
  }

  function extendSeries(name, sample) {
    const figure = figures[name];
    const el = document.getElementById(`fig-${name}`);
    if (figure && el && el.hidden && figure.meta.series.some(([key]) => sample.series[key] !== undefined)) {
      el.hidden = false;
      Plotly.react(el, figure.data, figure.layout, PLOT_CONFIG);
    }
    if (!figure || !el || !el.data || !(range in WINDOW)) return; // long ranges: minute data, no live tail
    const xs = [];
    const ys = [];
    const idx = [];
    figure.meta.series.forEach(([key, scale], i) => {
      const value = sample.series[key];
      if (value === undefined) return;
      xs.push([sample.ts * 1000]);
      ys.push([value / scale]);
      idx.push(i);
    });
    if (idx.length) Plotly.extendTraces(el, { x: xs, y: ys }, idx, WINDOW[range]);
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cell;
      tr.appendChild(td);
    }
    return tr;
  }

  function gauge(fill) {
    const meter = document.createElement("meter");
    meter.min = 0;
    meter.max = 1;
    meter.high = 0.9;
    meter.value = fill || 0;
    meter.title = `${fmt((fill || 0) * 100, 0)} %`;
    return meter;
  }

  function showSource(panel, source) {
    const el = $(`[data-panel=${panel}] .unavailable`);
    if (!el) return;
    el.hidden = !source || source.ok;
    el.textContent = source && !source.ok ? `unavailable: ${source.error}` : "";
  }

  // llama-server's counters (llamacpp:spec_decode_num_*_tokens_total) move only once a draft model drafts, which
  // takes -md with --spec-type (draft-simple); a server without them (Ollama, older builds) does not report any.
  function backendAcceptance(s) {
    if (s.spec_acceptance !== undefined) return `${fmt(s.spec_acceptance * 100, 0)} % of ${fmt(s.llamacpp_spec_decode_num_draft_tokens_total, 0)} drafted tokens`;
    if (s.llamacpp_spec_decode_num_draft_tokens_total !== undefined) return "nothing drafted (no draft model, or -md without --spec-type)";
    return "not reported by the backend";
  }

  // The fair queue hands a server no more turns than it has slots (Rig.capacity): more would wait inside the server.
  function capacityText(c) {
    if (!c) return "–";
    if (c.server_slots == null) return `${c.capacity}, the rig's slots: ${c.unreported || "the server reports none"}`;
    if (c.server_slots === c.slots) return `${c.capacity} (the rig's slots, as the server's)`;
    if (c.server_slots < c.slots) return `${c.capacity}: the server has ${c.server_slots} slots, the rig is set to ${c.slots}`;
    return `${c.capacity}: the rig is set to ${c.slots}, the server has ${c.server_slots} (raise the rig's slots to use them)`;
  }

  function showSpeculative(spec) {
    const el = $("[data-testid=speculative]");
    if (!spec) return;
    el.hidden = !spec.drafted; // a rig without a draft model: the backend signals say so
    el.textContent = spec.drafted
      ? `Speculative decoding: ${fmt(spec.acceptance * 100, 1)} % of draft tokens accepted (${spec.accepted} of ${spec.drafted}) in ${spec.drafted_turns} of the last ${spec.turns} turns`
      : "";
  }

  function render(sample) {
    const d = sample.detail || {};
    const s = sample.series || {};
    const sources = d.sources || {};
    const backend = sources.backend || { ok: false, error: "no reading" };
    const badge = $("[data-testid=backend-state]");
    badge.textContent = backend.ok ? `up · ${d.model || ""}` : `unavailable: ${backend.error}`;
    badge.dataset.state = backend.ok ? "up" : "down";
    showSource("decode", backend);
    showSource("signals", sources.queue && !sources.queue.ok ? sources.queue : backend);
    showSource("kv", sources.kv);
    showSource("memory", sources.host);
    const agentBadge = $("[data-testid=agent-state]");
    agentBadge.hidden = !(d.agent && d.agent.expected);
    if (d.agent && d.agent.expected) {
      agentBadge.textContent = d.agent.label;
      agentBadge.dataset.state = d.agent.up ? "up" : "down";
    }
    const from = (d.provenance || {});

    const roof = $("[data-testid=roofline]");
    if (s.bound_tps !== undefined) {
      const ratio = s.roofline_ratio === undefined ? "idle" : `${fmt(s.roofline_ratio * 100, 0)} % of it`;
      roof.textContent = `bound ${fmt(s.bound_tps, 0)} tokens/s at ${fmt(d.roofline.bandwidth_gbs, 1)} GB/s (${d.roofline.bandwidth_source || "?"}) · measured ${fmt(s.decode_tps)} (${ratio})`;
    } else {
      roof.textContent = d.roofline ? `roofline: ${d.roofline.error}` : "";
    }

    const slots = $("[data-testid=slots] tbody");
    slots.replaceChildren(
      ...(d.slots || []).map((slot) => {
        let phase = slot.phase;
        if (phase === "prompt" && slot.prompt_tokens) phase += ` ${fmt((100 * slot.prompt_processed) / slot.prompt_tokens, 0)} %`;
        // A busy slot's context is null where the server does not report its prompt (sources.kv_used says why).
        return row([String(slot.id), phase, `${slot.context_tokens ?? "?"} / ${slot.n_ctx}`, slot.context_tokens == null ? "–" : gauge(slot.fill), fmt(slot.decode_tps), mib(slot.kv_bytes)]);
      })
    );

    const used = sources.kv_used && !sources.kv_used.ok ? `unknown (${sources.kv_used.error})` : mib(s.kv_used_bytes);
    const kv = d.kv ? `${d.kv.cache_type} · ${fmt(s.kv_bytes_per_token, 0)} bytes per token (${d.kv.arch.block_count} layers × ${d.kv.arch.head_count_kv} KV heads) · in use ${used} of ${mib(s.kv_allocated_bytes)} allocated` : "";
    $("[data-testid=kv-facts]").textContent = kv && from.kv ? `${kv} · geometry from ${from.kv}` : kv;

    const placement = d.placement || {};
    $("[data-testid=placement]").textContent = `${placement.label || ""} · weights ${gib(s.weight_bytes)} · system RAM ${gib(s.host_used_bytes)} / ${gib(s.host_total_bytes)} used · backend process ${gib(s.backend_rss_bytes)} resident${s.backend_vram_bytes === undefined ? "" : `, ${gib(s.backend_vram_bytes)} in VRAM`}`;
    if (d.loaded_models) {
      // Ollama's size taken apart (inference/backends/ollama/rules.py): weights, KV, compute buffers; its sequences,
      // batch, context and idle unload time.
      const split = (m) => (m.weight_bytes != null ? `: weights ${gib(m.weight_bytes)}, KV ${m.kv_allocated_bytes != null ? gib(m.kv_allocated_bytes) : "?"}, graph ${m.graph_bytes != null ? gib(m.graph_bytes) : "?"}` : "");
      const runs = (m) => (m.parallel ? `, ${m.parallel} sequence${m.parallel === 1 ? "" : "s"}, batch ${m.batch ?? "?"}` : "");
      const idle = (m) => (m.expires_at ? `, unloads ${new Date(m.expires_at).toLocaleTimeString()}` : "");
      const loaded = d.loaded_models.map((m) => `${m.name} (${gib(m.size_bytes)}${split(m)}, ${fmt(100 * (1 - (m.cpu_fraction ?? 1)), 0)} % in VRAM, context ${m.context_length ?? "?"}${runs(m)}${idle(m)})`);
      $("[data-testid=placement]").textContent += ` · loaded: ${loaded.join(", ") || "none"}`;
    }
    if (from.host) $("[data-testid=placement]").textContent += ` · host figures from ${from.host}`;
    $("[data-testid=spill]").hidden = !placement.spill;
    const gpu = sources.gpu;
    $("[data-testid=gpu]").textContent = gpu && gpu.ok
      ? (d.gpus || []).map((g) => `GPU ${g.index} ${g.name}${g.unified ? " (unified memory)" : ""}: ${gib(g.memory_used_bytes)} / ${gib(g.memory_total_bytes)}${g.memory_reserved_bytes ? ` (${gib(g.memory_reserved_bytes)} reserved by the driver)` : ""}${g.process_memory_bytes ? `, backend ${gib(g.process_memory_bytes)}` : ""}, ${fmt(g.utilization_gpu_pct, 0)} %, ${fmt(g.power_w, 0)} W, ${fmt(g.temperature_c, 0)} °C`).join(" · ")
      : `GPU: unavailable (${gpu ? gpu.error : "no reading"})`;
    const energy = d.energy || {};
    $("[data-testid=energy]").textContent = energy.ok && sample.series.energy_j_per_token !== undefined
      ? `${fmt(sample.series.energy_j_per_token, 3)} J per token at ${fmt(sample.series.power_gpus_w, 0)} W`
      : `Energy per token: ${energy.error || "not measured yet"}`;

    const signals = [
      ["busy slots", s.total_slots === undefined ? "–" : `${s.busy_slots} / ${s.total_slots}`],
      ["turns RigDash hands the server at once", capacityText(d.capacity)],
      ["deferred requests", fmt(s.deferred_requests, 0)],
      ["queued in Celery", fmt(s.queue_depth, 0)],
      ["prompt tokens (finished requests)", fmt(s.llamacpp_prompt_tokens_total, 0)],
      ["decoded tokens (finished requests)", fmt(s.llamacpp_tokens_predicted_total, 0)],
      ["speculative acceptance (llama-server, since it started)", backendAcceptance(s)],
    ];
    $("[data-testid=signals] tbody").replaceChildren(...signals.map(([k, v]) => row([k, v])));
    $("[data-testid=active-turns] tbody").replaceChildren(
      ...(d.turns || []).map((t) => {
        const live = t.live || {};
        const ctx = live.context_tokens ? `${live.context_tokens} / ${live.context_limit || "?"}` : "–";
        return row([`#${t.id}`, t.user, t.model, t.status, fmt(live.tokens, 0), fmt(live.decode_tps), ctx]);
      })
    );

    extendSeries("decode", sample);
    extendSeries("kv", sample);
    extendSeries("memory", sample);
    extendSeries("gpus", sample);
    extendSeries("energy", sample);
  }

  async function refetch(path) {
    const response = await fetch(path, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`${path}: ${response.status}`);
    return response.json();
  }

  async function refreshLatency() {
    try {
      const body = await refetch(`/monitoring/api/rigs/${cfg.rig}/latency`);
      Object.assign(figures, body.figures);
      for (const name of ["gaps", "histogram", "ttft"]) draw(name, figures[name]);
      showSpeculative(body.latency.speculative);
    } catch (err) {
      console.warn(err);
    }
  }

  $("[data-testid=range]").addEventListener("change", async (event) => {
    range = event.target.value;
    const body = await refetch(`/monitoring/api/rigs/${cfg.rig}/series?range=${encodeURIComponent(range)}`);
    Object.assign(figures, body.figures);
    for (const name of ["decode", "kv", "memory", "gpus", "energy"]) draw(name, figures[name]);
    history.replaceState(null, "", `?range=${encodeURIComponent(range)}`);
  });

  drawAll();
  showSpeculative(cfg.speculative);
  if (cfg.latest) render(cfg.latest);
  RigDashSocket.open(`/ws/monitoring/rigs/${cfg.rig}/`, {
    handlers: { "rig.sample": (msg) => render(msg.sample) },
    label: $("[data-testid=connection]"),
    minRetryMs: 2000,
    maxRetryMs: 2000,
  });
  setInterval(refreshLatency, 5000);
})();
