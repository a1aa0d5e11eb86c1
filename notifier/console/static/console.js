// Live counts on the overview: poll /live.json and write the numbers in (as text, never HTML).
(function () {
  "use strict";
  var section = document.querySelector("[data-live]");
  if (!section) return;
  var url = section.getAttribute("data-live");
  function update() {
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) return;
        document.querySelectorAll("[data-key]").forEach(function (el) {
          var v = data[el.getAttribute("data-key")];
          if (v !== undefined && v !== null) el.textContent = String(v);
        });
        document.querySelectorAll("[data-count]").forEach(function (el) {
          var v = data.counts[el.getAttribute("data-count")];
          el.textContent = String(v === undefined ? 0 : v);
        });
        section.setAttribute("data-updated", new Date().toISOString());
      })
      .catch(function () {});
  }
  setInterval(update, 5000);
  update();
})();
