"""The scan report: totals by category and by file, the readiness score, JSON / CSV / HTML.

Readiness score (0-100): how far the code is from running off CUDA.

    score = 100 * (1 - D / (D + L / 10))

    D  the debt: the sum over findings of weight(severity) * share, with weights info 1,
       warning 3, error 10, and share 1 for a finding that needs a manual change, 0.25 for one
       `migrate apply` resolves (rewrites, or only marks because it is harmless)
    L  lines of source scanned: a large code base with a few leftovers scores higher than a
       small script that is nothing but leftovers

No findings: 100. Running `apply` only lowers D, so the score rises; `readiness_after_apply`
is the score once it has run (only the manual findings left). Parse errors count as manual
errors (nothing in that file was checked).
"""
from __future__ import annotations

import csv
import html
import io

from .rules import Finding
from .scan import ScanResult

WEIGHTS = {"info": 1, "warning": 3, "error": 10}
CSV_COLUMNS = ["file", "line", "column", "api", "category", "severity", "replacement", "hip", "sycl", "language", "rewritable",
               "resolved", "code", "note"]


RESOLVED_SHARE = 0.25
LINES_PER_UNIT = 10.0    # ten clean lines balance one info finding


def debt(findings: list[Finding], after_apply: bool = False) -> float:
    return sum(WEIGHTS[f.severity] * (1.0 if not f.resolved else 0.0 if after_apply else RESOLVED_SHARE)
               for f in findings)


def readiness(findings: list[Finding], lines: int, after_apply: bool = False) -> float:
    d = debt(findings, after_apply)
    if d == 0:
        return 100.0
    return round(100.0 * (1.0 - d / (d + lines / LINES_PER_UNIT)), 2)


def summarize(result: ScanResult) -> dict:
    by_category: dict[str, dict] = {}
    by_file: dict[str, dict] = {}
    by_severity = {s: 0 for s in WEIGHTS}
    for f in result.findings:
        c = by_category.setdefault(f.category, {"category": f.category, "findings": 0, "unresolved": 0})
        c["findings"] += 1
        c["unresolved"] += not f.resolved
        d = by_file.setdefault(f.file, {"file": f.file, "findings": 0, "unresolved": 0})
        d["findings"] += 1
        d["unresolved"] += not f.resolved
        by_severity[f.severity] += 1
    per_file = {}
    for name, d in by_file.items():
        own = [f for f in result.findings if f.file == name]
        d["lines"] = result.files.get(name, 0)
        d["readiness"] = readiness(own, d["lines"])
        per_file[name] = d
    return {
        "root": result.root,
        "files_scanned": len(result.files),
        "files_with_findings": len(by_file),
        "lines": result.lines,
        "findings_total": len(result.findings),
        "unresolved": sum(not f.resolved for f in result.findings),
        "readiness": readiness(result.findings, result.lines),
        "readiness_after_apply": readiness(result.findings, result.lines, after_apply=True),
        # NOTE: a score counts what the scanner saw; only a run on a non-CUDA device (`migrate check`) verifies it
        "verified": False,
        "score_formula": "100 * (1 - D / (D + lines/10)), D = sum of severity weight (" +
                         ", ".join(f"{k} {v}" for k, v in WEIGHTS.items()) +
                         f") x (1 if manual, {RESOLVED_SHARE} if migrate apply resolves it)",
        "by_severity": by_severity,
        "by_category": sorted(by_category.values(), key=lambda c: (-c["findings"], c["category"])),
        "by_file": sorted(per_file.values(), key=lambda d: (-d["unresolved"], -d["findings"], d["file"])),
        "skipped": [{"file": s.file, "reason": s.reason} for s in result.skipped],
    }


def to_json(result: ScanResult) -> dict:
    doc = summarize(result)
    doc["findings"] = [f.as_dict() for f in result.findings]
    return doc


def to_csv(result: ScanResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for f in result.findings:
        d = f.as_dict()
        w.writerow([d[c] for c in CSV_COLUMNS])
    return buf.getvalue()


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#1d2330;background:#fafbfc}
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.6em 0 .5em}
.score{font-size:3em;font-weight:700}.good{color:#1a7f37}.fair{color:#b58105}.poor{color:#c0362c}
.cards{display:flex;gap:1em;flex-wrap:wrap}.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:.8em 1.2em}
.card b{display:block;font-size:1.4em}
table{border-collapse:collapse;background:#fff;width:100%}th,td{border:1px solid #dde1e6;padding:.3em .6em;text-align:left;
vertical-align:top}th{background:#eef1f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap}
.sev-error{color:#c0362c;font-weight:600}.sev-warning{color:#b58105;font-weight:600}.sev-info{color:#57606a}
.muted{color:#57606a}
"""


def to_html(result: ScanResult) -> str:
    s = summarize(result)
    e = html.escape
    grade = "good" if s["readiness"] >= 80 else "fair" if s["readiness"] >= 50 else "poor"

    def rows(items, cols, numeric=()):
        return "".join("<tr>" + "".join(f'<td class="n">{e(str(i[c]))}</td>' if c in numeric else
                                         f"<td>{e(str(i[c]))}</td>" for c in cols) + "</tr>" for i in items)

    findings = "".join(
        f"<tr><td>{e(f.file)}</td><td class=\"n\">{f.line}</td><td class=\"n\">{f.column}</td><td><code>{e(f.api)}</code></td>"
        f"<td>{e(f.category)}</td><td class=\"sev-{f.severity}\">{f.severity}</td><td>{e(f.replacement)}</td>"
        f"<td><code>{e(f.hip)}</code></td><td><code>{e(f.sycl)}</code></td>"
        f"<td>{'rewritten by apply' if f.rewritable else 'resolved' if f.resolved else 'manual'}</td>"
        f"<td><code>{e(f.code)}</code>{('<br><span class=muted>' + e(f.note) + '</span>') if f.note else ''}</td></tr>"
        for f in result.findings)
    skipped = ("<h2>Skipped files</h2><table><tr><th>file</th><th>why</th></tr>" + rows(s["skipped"], ["file", "reason"])
               + "</table>") if s["skipped"] else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>opscope migrate: {e(s['root'])}</title>
<style>{_CSS}</style></head><body>
<h1>CUDA migration report</h1><div class="muted">{e(s['root'])}</div>
<div class="cards" style="margin-top:1em">
<div class="card">readiness<span class="score {grade}"> {s['readiness']:.1f}</span></div>
<div class="card"><b>{s['readiness_after_apply']:.1f}</b>after <code>opscope migrate apply</code></div>
<div class="card"><b>{s['findings_total']}</b>findings</div>
<div class="card"><b>{s['unresolved']}</b>left after apply</div>
<div class="card"><b>{s['files_scanned']}</b>files scanned ({s['lines']} lines)</div>
<div class="card"><b>{len(s['skipped'])}</b>skipped</div></div>
<p class="muted">score = {e(s['score_formula'])}</p>
<h2>By category</h2><table><tr><th>category</th><th>findings</th><th>left after apply</th></tr>
{rows(s['by_category'], ['category', 'findings', 'unresolved'], {'findings', 'unresolved'})}</table>
<h2>By file</h2><table><tr><th>file</th><th>findings</th><th>left after apply</th><th>lines</th><th>readiness</th></tr>
{rows(s['by_file'], ['file', 'findings', 'unresolved', 'lines', 'readiness'], {'findings', 'unresolved', 'lines', 'readiness'})}</table>
<h2>Findings</h2><table><tr><th>file</th><th>line</th><th>col</th><th>API</th><th>category</th><th>severity</th>
<th>use instead</th><th>HIP</th><th>SYCL</th><th>after apply</th><th>code</th></tr>{findings}</table>
{skipped}
</body></html>
"""
