/* Every page: the theme toggle (stored in localStorage, read back by theme.js) and the narrow-screen menu. */
(function () {
  "use strict";

  const root = document.documentElement;
  const dark = window.matchMedia("(prefers-color-scheme: dark)");

  function current() {
    return root.dataset.theme || (dark.matches ? "dark" : "light");
  }

  function label(button) {
    const isDark = current() === "dark";
    button.setAttribute("aria-pressed", String(isDark));
    button.title = isDark ? "Switch to the light theme" : "Switch to the dark theme";
    root.dispatchEvent(new CustomEvent("rigdash:theme", { detail: current() }));
  }

  const toggle = document.querySelector("[data-testid=theme-toggle]");
  if (toggle) {
    label(toggle);
    dark.addEventListener("change", () => label(toggle));
    toggle.addEventListener("click", () => {
      const next = current() === "dark" ? "light" : "dark";
      root.dataset.theme = next;
      try {
        window.localStorage.setItem("rigdash-theme", next);
      } catch (e) {
        /* not stored: this page keeps it */
      }
      label(toggle);
    });
  }

  const menu = document.querySelector("[data-testid=menu-toggle]");
  const nav = document.getElementById("site-nav");
  if (menu && nav) {
    menu.addEventListener("click", () => {
      const open = menu.getAttribute("aria-expanded") !== "true";
      menu.setAttribute("aria-expanded", String(open));
      nav.classList.toggle("open", open);
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && nav.classList.contains("open")) {
        menu.setAttribute("aria-expanded", "false");
        nav.classList.remove("open");
        menu.focus();
      }
    });
  }
})();
