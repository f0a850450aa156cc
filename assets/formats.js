// Number formats the tables share (app/web/components.py's DURATION column): AG Grid calls these by name.
var dagfuncs = (window.dashAgGridFunctions = window.dashAgGridFunctions || {});

// A duration in ns in the unit that suits it, three significant digits: 56.2 ms, 812 us, 4.00 s; the unit
// chosen after rounding (999.96 us reads 1.00 ms). The same as app/web/components.py fmt_ns.
dagfuncs.duration = function (ns) {
  if (ns === null || ns === undefined || ns === "") return "";
  var v = Number(ns), a = Math.abs(Number(v.toPrecision(3)));
  if (a >= 1e12) return (v / 1e9).toFixed(0) + " s";          // 1000 s and more: never an exponent
  if (a >= 1e9) return (v / 1e9).toPrecision(3) + " s";
  if (a >= 1e6) return (v / 1e6).toPrecision(3) + " ms";
  if (a >= 1e3) return (v / 1e3).toPrecision(3) + " us";
  return Math.round(v) + " ns";
};

// B/A as "1.23x", "0.0042x", "1.2e-05x": never "0.00x" for a ratio that is not zero (app/cli/common.py fmt_ratio).
dagfuncs.ratio = function (x) {
  if (x === null || x === undefined || x === "") return "";
  var v = Number(x), a = Math.abs(v);
  if (!isFinite(v)) return v + "x";
  if (v === 0 || a >= 0.01) return v.toFixed(2) + "x";
  // Python's exponent has two digits at least (1.2e-05): the same text on the page as in the CLI
  return (a >= 1e-4 ? String(Number(v.toPrecision(2))) : v.toExponential(1).replace(/e([+-])(\d)$/, "e$10$2")) + "x";
};

// A rate with an SI prefix, three significant digits: 11.4 T, 19.1 G, 812 M (a column header names the unit,
// "achieved FLOP/s"). `scale` turns the stored value into units (GFLOP/s stored: 1e9). "11375.9" GFLOP/s was seven
// digits wide and was what a narrow card cut in half.
dagfuncs.si = function (x, scale) {
  if (x === null || x === undefined || x === "") return "";
  var v = Number(x) * (scale || 1), a = Math.abs(v);
  if (!isFinite(v)) return String(v);
  var units = [[1e15, " P"], [1e12, " T"], [1e9, " G"], [1e6, " M"], [1e3, " k"]];
  for (var i = 0; i < units.length; i++) {
    // the prefix chosen after rounding: 999.96 G reads 1.00 T
    if (Math.abs(Number(v.toPrecision(3))) >= units[i][0]) return (v / units[i][0]).toPrecision(3) + units[i][1];
  }
  return v === 0 ? "0" : v.toPrecision(3);
};
