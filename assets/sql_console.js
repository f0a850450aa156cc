// The SQL page (app/pages/sql.py): Ctrl+Enter in the query box runs it; an example button puts its query there.
(function () {
  "use strict";
  document.addEventListener("keydown", function (e) {
    if (e.target && e.target.id === "sql-text" && e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      var run = document.getElementById("sql-run");
      if (run) run.click();
    }
  });
  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest(".sql-example");
    if (!b || !window.dash_clientside || !window.dash_clientside.set_props) return;
    window.dash_clientside.set_props("sql-text", {value: b.getAttribute("data-sql")});
  });
})();
