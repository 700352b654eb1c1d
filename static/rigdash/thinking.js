/* A reasoning model's thoughts: a collapsible "thinking" block above each reply, and the chat's choice to ask for
 * thinking or not.
 *
 * The thoughts are model output: rendered through RigDashMarkdown (marked -> DOMPurify), never as raw HTML. The
 * block is open while the model thinks and folds once the answer starts (the user can open it again). The choice
 * ("model default", "think", "answer at once") is kept per chat in this browser and sent as the turn's `think`
 * param (Ollama's `think`, llama-server's `enable_thinking`).
 */
(function () {
  "use strict";

  class ThinkingBlock {
    constructor() {
      this.el = document.createElement("details");
      this.el.className = "thinking";
      this.el.dataset.testid = "thinking";
      this.el.hidden = true;
      const summary = document.createElement("summary");
      summary.textContent = "thinking";
      const body = document.createElement("div");
      body.className = "thinking-body markdown";
      this.el.append(summary, body);
      this.summary = summary;
      this.renderer = new RigDashMarkdown.ReplyRenderer(body);
      this.text = "";
      this.userToggled = false;
      this.el.addEventListener("toggle", () => {
        if (!this.settingOpen) this.userToggled = true;
      });
    }

    /** Show `text`; `thinking`: the model is thinking now (open, unless the user folded or opened it). */
    set(text, thinking) {
      this.el.hidden = !text;
      if (text !== this.text) {
        this.text = text;
        this.renderer.set(text);
      }
      this.summary.textContent = thinking ? "thinking…" : "thinking";
      if (!this.userToggled && this.el.open !== thinking) {
        this.settingOpen = true;
        this.el.open = thinking;
        this.settingOpen = false;
      }
    }
  }

  const CHOICES = [
    ["", "Thinking: model default"],
    ["on", "Thinking: on"],
    ["off", "Thinking: off"],
  ];

  // Effort levels, where the rig's server takes one (Ollama's `think: "low"`, llama-server's `reasoning_effort`):
  // gpt-oss reads its reasoning effort from them; a model without reasoning refuses them on Ollama (a clear error).
  const LEVELS = [
    ["low", "Thinking: low effort"],
    ["medium", "Thinking: medium effort"],
    ["high", "Thinking: high effort"],
  ];

  /** The turn's `think` param for a choice: true / false, an effort level, or nothing (the model's default). */
  function thinkValue(value) {
    if (value === "") return {};
    if (value === "on" || value === "off") return { think: value === "on" };
    return LEVELS.some(([level]) => level === value) ? { think: value } : {};
  }

  /** The per-chat choice, as a <select> put in `actions`; returns a function giving the turn's params. `levels`:
   * the rig's server takes effort levels. */
  function choice(sessionId, actions, levels) {
    const key = `rigdash:think:${sessionId}`;
    const select = document.createElement("select");
    select.dataset.testid = "think";
    select.title = "Ask a reasoning model to think before it answers (models without reasoning ignore it)";
    select.setAttribute("aria-label", "Thinking: ask a reasoning model to think first, or not");
    for (const [value, label] of levels ? [...CHOICES, ...LEVELS] : CHOICES) select.add(new Option(label, value));
    try {
      select.value = localStorage.getItem(key) || "";
      if (select.selectedIndex < 0) select.value = ""; // a level kept from a rig that took them
    } catch (e) {
      select.value = "";
    }
    select.addEventListener("change", () => {
      try {
        localStorage.setItem(key, select.value);
      } catch (e) {
        /* storage refused: the choice holds for this page */
      }
    });
    actions.prepend(select);
    return () => thinkValue(select.value);
  }

  /** The stats line's words for thinking, when the turn thought. */
  function statsParts(s) {
    const parts = [];
    const n = s.thinking_tokens;
    if (!n) return parts;
    parts.push(`thought ${n} tok`);
    if (s.first_answer_ms !== undefined && s.first_answer_ms !== null) parts.push(`first answer ${Math.round(s.first_answer_ms)} ms`);
    return parts;
  }

  window.RigDashThinking = { ThinkingBlock, choice, statsParts };
})();
