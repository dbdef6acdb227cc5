"""Markdown from results files: a results file's rows as tables (one per row's "table"), its machine, rounds
and settings as lines. Every figure on the performance pages comes through here, from the files."""

from __future__ import annotations

import json
from typing import Any

DASH = "–"
UNITS = (("_tok_s", " tok/s"), ("_mb_s", " MB/s"), ("_gb_s", " GB/s"), ("_ms", " ms"), ("_us", " µs"),
         ("_s", " s"), ("_mib", " MiB"), ("_mb", " MB"))


def number(v: float) -> str:
    """Four significant figures; thousands separated from 1,000 up."""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if v == 0:
        return "0"
    return f"{v:.4g}"


def cell(v: Any) -> str:
    """A value as a table cell."""
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, float):
        return number(v)
    if isinstance(v, list):
        return ", ".join(cell(x) for x in v) if all(not isinstance(x, (dict, list)) for x in v) else "…"
    if isinstance(v, dict):
        return json.dumps(v, ensure_ascii=False)
    return str(v).replace("|", "\\|").replace("\n", " ")


def header(key: str) -> str:
    """A row's key as a column's name: `output_tok_s` -> `output tok/s`."""
    for suffix, unit in UNITS:
        if key.endswith(suffix) or f"{suffix}." in key:
            key = key.replace(suffix, unit.replace(" ", "\0"), 1)
            break
    return key.replace("_", " ").replace("\0", " ")


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its dict values spread one level (`phase_us_per_token.decode`)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict) and v and all(not isinstance(x, (dict, list)) for x in v.values()):
            out |= {f"{k}.{sub}": x for sub, x in v.items()}
        else:
            out[k] = v
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A markdown table of `rows`: the columns in the order first met, those empty in every row left out;
    numbers right-aligned."""
    rows = [flat({k: v for k, v in r.items() if k != "table"}) for r in rows]
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    columns = [c for c in columns if any(r.get(c) is not None for r in rows)]
    numeric = {c for c in columns if all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)}
    out = ["| " + " | ".join(header(c) for c in columns) + " |",
           "| " + " | ".join("---:" if c in numeric else "---" for c in columns) + " |"]
    out += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return out


def tables(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as one table per "table" name (the unnamed first), each under its name."""
    names: list[str] = []
    for r in rows:
        if r.get("table", "") not in names:
            names.append(r.get("table", ""))
    out: list[str] = []
    for name in sorted(names, key=lambda n: n != ""):
        if name:
            out += ["", f"*{name}*", ""]
        out += table([r for r in rows if r.get("table", "") == name])
    return out


def machine_line(doc: dict[str, Any]) -> str:
    m, v = doc["machine"], doc["versions"]
    gpu = f"{m['gpu']} · " if m.get("gpu") else ""
    cores = f", {m['cores']} cores" if m.get("cores") else ""
    commit = f"`{doc['commit'][:10]}`{' (dirty)' if str(doc['commit']).endswith('-dirty') else ''}" if doc[
        "commit"] else DASH
    soft = ", ".join(f"{k} {x}" for k, x in v.items() if x != "not recorded") or "versions not recorded"
    return f"{gpu}{m['cpu']} ({m['vector_class']}{cores}) · {doc['date']} · commit {commit} · {soft}"


def span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return number(low) if low == high else f"{number(low)}–{number(high)}"


def rounds_line(doc: dict[str, Any]) -> str:
    rounds = doc["rounds"]
    kept = sum(1 for r in rounds if r["kept"])
    probes = [r["probe"] for r in rounds if r.get("probe")]
    text = f"{len(rounds)} round{'s' * (len(rounds) != 1)}, {kept} kept"
    if not probes:
        return text + "; no machine probe recorded"
    bw = [p["bandwidth_gb_s"] for p in probes]
    steal = [p["steal"] for p in probes if p.get("steal") is not None]
    text += f"; probed bandwidth {span(bw)} GB/s"
    if steal:
        text += f", steal at most {max(steal):.1%}"
    load = [p["loadavg_1m_start"] for p in probes]
    return text + f", load average {span(load)}"


def settings_line(settings: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)

    return ", ".join(f"{k.replace('_', ' ')} `{value(v)}`" for k, v in settings.items())
