/* Markdown for untrusted model output: marked -> DOMPurify, rendered incrementally.
 *
 * Raw HTML in the Markdown is shown as text, never parsed; DOMPurify then removes anything
 * executable that Markdown itself could produce (javascript:/data: links, event handlers), and the
 * page's Content-Security-Policy allows no inline script as a last line of defence.
 *
 * A growing reply is split at the last blank line outside a code fence: blocks before it are
 * rendered once and kept; only the tail is re-rendered, at most once per animation frame.
 */
(function () {
  "use strict";

  const escapeHtml = (s) =>
    String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  marked.use({
    gfm: true,
    breaks: false,
    renderer: {
      html(token) {
        return escapeHtml(typeof token === "string" ? token : token.text);
      },
    },
  });

  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  });

  const PURIFY = {
    FORBID_TAGS: ["style", "svg", "math", "form", "input", "button", "textarea", "select", "iframe", "object", "embed", "img"],
    FORBID_ATTR: ["style"],
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
  };

  function renderMarkdown(text) {
    return DOMPurify.sanitize(marked.parse(text), PURIFY);
  }

  /** Index just past the last blank line that is not inside a ``` fence (0 if none). */
  function stableEnd(text, from) {
    let end = from;
    let fences = 0;
    const re = /^```|\n\n/gm;
    re.lastIndex = from;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m[0] === "\n\n") {
        if (fences % 2 === 0) end = m.index + 2;
      } else {
        fences += 1;
      }
    }
    return end;
  }

  class ReplyRenderer {
    constructor(container) {
      this.container = container;
      this.stable = document.createElement("div");
      this.tail = document.createElement("div");
      container.replaceChildren(this.stable, this.tail);
      this.text = "";
      this.stableLen = 0;
      this.frame = 0;
    }

    /** Show `text`; appended text only re-renders the tail. */
    set(text) {
      if (!text.startsWith(this.text.slice(0, this.stableLen))) {
        this.stable.replaceChildren();
        this.stableLen = 0;
      }
      this.text = text;
      if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
    }

    flush() {
      this.frame = 0;
      // Fences opened in the stable part must be counted from the start; scanning from the
      // previous stable end is safe because a stable end is never inside a fence.
      const end = stableEnd(this.text, this.stableLen);
      if (end > this.stableLen) {
        const block = document.createElement("div");
        block.innerHTML = renderMarkdown(this.text.slice(this.stableLen, end));
        this.stable.appendChild(block);
        this.stableLen = end;
      }
      this.tail.innerHTML = renderMarkdown(this.text.slice(this.stableLen));
    }
  }

  window.RigDashMarkdown = { ReplyRenderer, renderMarkdown };
})();
