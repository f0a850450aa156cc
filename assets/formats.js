// Number formats the tables share (app/web/components.py's DURATION column): AG Grid calls these by name.
var dagfuncs = (window.dashAgGridFunctions = window.dashAgGridFunctions || {});

// A duration in ns in the unit that suits it, three significant digits: 56.2 ms, 812 us, 4.00 s.
dagfuncs.duration = function (ns) {
  if (ns === null || ns === undefined || ns === "") return "";
  var v = Number(ns), a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toPrecision(3) + " s";
  if (a >= 1e6) return (v / 1e6).toPrecision(3) + " ms";
  if (a >= 1e3) return (v / 1e3).toPrecision(3) + " us";
  return Math.round(v) + " ns";
};
