"""Render the report as Markdown and as one self-contained HTML page.

The HTML page has inline CSS and PNGs embedded as base64 data URIs; it loads
nothing from outside. Every piece of run-provided text is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from typing import Any

from .hypotheses import HypothesisResult
from .runs import Run
from .tables import ArmTable, Delta, fmt_num, fmt_stat, md_table, table_rows

MAX_PROMPT_CHARS = 800
MAX_COMPLETION_CHARS = 2000


@dataclass
class SampleSet:
    """A few completions of one arm, from the last logged step of one seed."""

    run_name: str
    seed: int | None
    step: int | None
    samples: list[dict[str, Any]]


@dataclass
class ReportContent:
    runs: list[Run]
    table: ArmTable
    metrics: list[str]
    reference_arm: str | None
    deltas: dict[str, Delta] | None
    hypotheses: list[HypothesisResult] | None
    samples: dict[str, SampleSet]
    images: dict[str, str] = field(default_factory=dict)  # caption -> PNG file name
    title: str = "rhlab report"


# ---------------------------------------------------------------- shared pieces

def _run_rows(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    header = ["run", "arm", "seed", "status", "steps", "in stats", "note"]
    rows = [[r.run_name, r.arm, _s(r.seed), r.status, _s(r.steps), "yes" if r.complete else "no", r.note]
            for r in runs]
    return header, rows


def _delta_rows(c: ReportContent) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "n", "SafePass", f"Δ SafePass vs {c.reference_arm}", "n ref"]
    rows = []
    for arm, stats in c.table.items():
        sp = stats.get("safe_pass")
        d = (c.deltas or {}).get(arm)
        rows.append([
            arm, str(sp.n if sp else 0), fmt_stat(sp.mean, sp.sem, sp.n) if sp else "—",
            "(reference)" if arm == c.reference_arm else fmt_stat(d.delta, d.sem, d.n, d.df) if d else "—",
            str(d.n_ref) if d else "",
        ])
    return header, rows


def _hyp_rows(results: list[HypothesisResult]) -> tuple[list[str], list[list[str]]]:
    header = ["hypothesis", "verdict", "metric", "op", "threshold", "arm mean", "ref mean", "diff ± se [95 %]",
              "n (arm/ref)", "check", "why"]
    rows = []
    for h in results:
        for i, c in enumerate(h.checks):
            rows.append([
                h.name if i == 0 else "", h.verdict.upper() if i == 0 else "", c.metric, c.op, f"{c.delta:g}",
                fmt_num(c.arm_mean), fmt_num(c.ref_mean),
                f"{fmt_stat(c.diff, c.se)} [{fmt_num(c.lo)}, {fmt_num(c.hi)}]", f"{c.n_arm}/{c.n_ref}",
                c.verdict, c.reason,
            ])
    return header, rows


def _s(x: Any) -> str:
    return "—" if x is None else str(x)


def _clip(text: Any, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"\n… [{len(text) - limit} more chars]"


def _sample_meta(s: dict[str, Any]) -> str:
    reward = s.get("reward")
    reward = fmt_num(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else _s(reward)
    score = s.get("task_score")
    score = fmt_num(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else _s(score)
    return f"reward {reward}, task_score {score}, hack {_s(s.get('hack'))}"


# ---------------------------------------------------------------- Markdown

def _md_fence(text: str) -> str:
    """A fenced block whose fence is longer than any backtick run in the text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def render_markdown(c: ReportContent) -> str:
    out = [f"# {c.title}", ""]
    out += ["## Runs", "", md_table(*_run_rows(c.runs)), "",
            "Only runs with status `complete` enter the statistics below.", ""]
    out += ["## Final metrics by arm (mean ± SEM over seeds)", "",
            md_table(*table_rows(c.table, None, c.metrics)), "",
            "SEM = std(ddof=1)/sqrt(n); '—' where n < 2.", ""]
    if c.deltas is not None:
        out += [f"## Δ SafePass vs `{c.reference_arm}`", "", md_table(*_delta_rows(c)), "",
                "SafePass = pass_rate − hack_rate per run; Δ = mean(arm) − mean(reference), "
                "SEM = sqrt(sem_arm² + sem_ref²).", ""]
    out += _md_hypotheses(c.hypotheses)
    out += ["## Figures", ""]
    out += [f"![{cap}]({fname})\n" for cap, fname in c.images.items()]
    out += ["## Sample completions", ""]
    for arm, ss in c.samples.items():
        out += [f"### {arm} — {ss.run_name} (seed {_s(ss.seed)}), step {_s(ss.step)}", ""]
        for s in ss.samples:
            out += [f"*{_sample_meta(s)}*", "", "Prompt:", "", _md_fence(_clip(s.get("prompt", ""), MAX_PROMPT_CHARS)),
                    "", "Completion:", "", _md_fence(_clip(s.get("completion", ""), MAX_COMPLETION_CHARS)), ""]
    if not c.samples:
        out += ["(no samples logged)", ""]
    return "\n".join(out)


def _md_hypotheses(results: list[HypothesisResult] | None) -> list[str]:
    out = ["## Preregistered hypotheses", ""]
    if results is None:
        return out + ["(no hypotheses file given)", ""]
    for h in results:
        out.append(f"- **{h.name}** — {h.verdict.upper()}: {h.claim} (`{h.arm}` vs `{h.reference}`)")
    return out + ["", md_table(*_hyp_rows(results)), ""]


# ---------------------------------------------------------------- HTML

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right;vertical-align:top}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.verdict-supported{color:#1a7f37;font-weight:bold}.verdict-falsified{color:#c62828;font-weight:bold}
.verdict-inconclusive{color:#8a6d00;font-weight:bold}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.6em;white-space:pre-wrap;word-break:break-word;
max-height:24em;overflow:auto}
img{max-width:100%;border:1px solid #eee}
.note{color:#666;font-size:.9em}
"""


def _h(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _html_table(header: list[str], rows: list[list[str]], verdict_cols: tuple[int, ...] = ()) -> str:
    th = "".join(f"<th>{_h(c)}</th>" for c in header)
    body = []
    for r in rows:
        tds = []
        for i, cell in enumerate(r):
            cls = f' class="verdict-{_h(cell.lower())}"' if i in verdict_cols and cell else ""
            tds.append(f"<td{cls}>{_h(cell)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    # wide tables (many metrics) scroll sideways inside the page instead of being cut off
    return f"<div class=\"scroll\"><table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def render_html(c: ReportContent, pngs: dict[str, bytes]) -> str:
    """The whole page; ``pngs`` maps image file name -> PNG bytes to embed."""
    p = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_h(c.title)}</title>",
         f"<style>{CSS}</style></head><body>", f"<h1>{_h(c.title)}</h1>"]
    p += ["<h2>Runs</h2>", _html_table(*_run_rows(c.runs)),
          '<p class="note">Only runs with status <code>complete</code> enter the statistics below.</p>']
    p += ["<h2>Final metrics by arm (mean ± SEM over seeds)</h2>", _html_table(*table_rows(c.table, None, c.metrics)),
          '<p class="note">SEM = std(ddof=1)/sqrt(n); — where n &lt; 2.</p>']
    if c.deltas is not None:
        p += [f"<h2>Δ SafePass vs <code>{_h(c.reference_arm)}</code></h2>", _html_table(*_delta_rows(c)),
              '<p class="note">SafePass = pass_rate − hack_rate per run; Δ = mean(arm) − mean(reference), '
              "SEM = sqrt(sem_arm² + sem_ref²).</p>"]
    p += ["<h2>Preregistered hypotheses</h2>"]
    if c.hypotheses is None:
        p.append('<p class="note">(no hypotheses file given)</p>')
    else:
        items = "".join(
            f'<li><b>{_h(h.name)}</b> — <span class="verdict-{_h(h.verdict)}">{_h(h.verdict.upper())}</span>: '
            f"{_h(h.claim)} (<code>{_h(h.arm)}</code> vs <code>{_h(h.reference)}</code>)</li>" for h in c.hypotheses)
        p += [f"<ul>{items}</ul>", _html_table(*_hyp_rows(c.hypotheses), verdict_cols=(1, 9))]
    p.append("<h2>Figures</h2>")
    for cap, fname in c.images.items():
        if fname in pngs:
            p.append(f'<figure><img src="{data_uri(pngs[fname])}" alt="{_h(cap)}"><figcaption>{_h(cap)}'
                     "</figcaption></figure>")
    p.append("<h2>Sample completions</h2>")
    for arm, ss in c.samples.items():
        p.append(f"<h3>{_h(arm)} — {_h(ss.run_name)} (seed {_h(_s(ss.seed))}), step {_h(_s(ss.step))}</h3>")
        for s in ss.samples:
            p += [f'<p class="note">{_h(_sample_meta(s))}</p>',
                  f"<details><summary>prompt</summary><pre>{_h(_clip(s.get('prompt', ''), MAX_PROMPT_CHARS))}</pre>"
                  "</details>",
                  f"<pre>{_h(_clip(s.get('completion', ''), MAX_COMPLETION_CHARS))}</pre>"]
    if not c.samples:
        p.append('<p class="note">(no samples logged)</p>')
    p.append("</body></html>")
    return "\n".join(p)
