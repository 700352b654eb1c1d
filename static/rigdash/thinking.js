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

  /** The per-chat choice, as a <select> put in `actions`; returns a function giving the turn's params. */
  function choice(sessionId, actions) {
    const key = `rigdash:think:${sessionId}`;
    const select = document.createElement("select");
    select.dataset.testid = "think";
    select.title = "Ask a reasoning model to think before it answers (models without reasoning ignore it)";
    select.setAttribute("aria-label", "Thinking: ask a reasoning model to think first, or not");
    for (const [value, label] of CHOICES) select.add(new Option(label, value));
    try {
      select.value = localStorage.getItem(key) || "";
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
    return () => (select.value === "" ? {} : { think: select.value === "on" });
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
