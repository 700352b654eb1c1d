/* A turn's stats line (status, the rig that runs it, queue position, TTFT, tokens, tok/s, prompt, context), shared by the chat and
 * compare pages. */
(function () {
  "use strict";

  function fmt(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  // The backend read clearly less of the prompt than was sent: Ollama dropped the oldest messages to fit its
  // context window, without saying so (stats.history_truncated, set by the worker).
  function truncationText(cut) {
    if (!cut || typeof cut !== "object") return "";
    const read = Number(cut.read);
    const sent = Number(cut.sent_estimate);
    if (!Number.isFinite(read) || !Number.isFinite(sent)) return "";
    const size = Number(cut.window);
    const within = Number.isFinite(size) && size > 0 ? ` to fit its ${size}-token context` : "";
    return `⚠ history cut: the model read ${read} of about ${sent} prompt tokens; older messages were dropped${within}`;
  }

  // "prompt N tok" is the whole prompt on every backend (cached tokens included); "in M ms" the time the server took
  // for the part it did not have cached; prefill the rate of that part. Ollama does not tell its cached part apart:
  // its rate is then an upper bound (≤). Older turns stored only prompt_tokens.
  function promptParts(s) {
    const total = s.prompt_total_tokens !== undefined ? s.prompt_total_tokens : s.prompt_tokens;
    if (total === undefined || total === null) return [];
    const cached = s.prompt_cached_tokens ? ` (${s.prompt_cached_tokens} cached)` : "";
    const parts = [`prompt ${total} tok${cached} in ${fmt(s.prompt_ms, 0)} ms`];
    if (s.prefill_tps) parts.push(`prefill ${s.prefill_tps_at_most ? "≤ " : ""}${fmt(s.prefill_tps, 0)} tok/s`);
    return parts;
  }

  function statsText(t) {
    const s = t.stats || {};
    const parts = [];
    const live = ["decoding", "prompt", "queued", "loading"];
    parts.push(t.status === "loading" ? "loading the model" : live.includes(t.status) ? t.status : t.finish_reason || t.status);
    if (t.rig) parts.push(`on ${t.rig}`);
    if (t.status === "queued" && t.queue_position === 0) parts.push("starting");
    if (t.status === "queued" && t.queue_position > 0) {
      const ahead = t.queue_ahead === 1 ? "1 turn waits" : `${t.queue_ahead} turns wait`;
      parts.push(`position ${t.queue_position} in the queue (${ahead} ahead of yours)`);
    }
    if (t.status === "queued" && t.waiting_reason) parts.push(t.waiting_reason);
    // A reply that loaded its model first: the load apart from the time to first token (Ollama's load_duration).
    if (s.ttft_after_load_ms !== undefined) {
      parts.push(`model loaded in ${fmt(s.load_ms, 0)} ms`, `TTFT ${fmt(s.ttft_after_load_ms, 0)} ms after the load`);
    } else if (s.ttft_ms !== undefined) parts.push(`TTFT ${fmt(s.ttft_ms, 0)} ms`);
    const n = s.output_tokens !== undefined ? s.output_tokens : s.tokens;
    if (n !== undefined) parts.push(`${n} tokens`);
    if (s.decode_tps !== undefined) parts.push(`${fmt(s.decode_tps, 1)} tok/s`);
    if (window.RigDashThinking) parts.push(...window.RigDashThinking.statsParts(s));
    parts.push(...promptParts(s));
    if (s.context_tokens && s.context_limit) parts.push(`context ${s.context_tokens} / ${s.context_limit}`);
    const cut = truncationText(s.history_truncated);
    if (cut) parts.push(cut);
    if (s.energy_j_per_token !== undefined) parts.push(`${fmt(s.energy_j_per_token, 2)} J/tok`);
    const timings = s.backend_timings || {};
    if (timings.draft_n > 0) parts.push(`drafts ${fmt((100 * timings.draft_n_accepted) / timings.draft_n, 0)} % accepted (${timings.draft_n_accepted} / ${timings.draft_n})`);
    return parts.join(" · ");
  }

  window.RigDashStats = { statsText, truncationText, promptParts };
})();
