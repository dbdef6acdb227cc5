"""onnxruntime's profiler output summarised: where a run's time goes, per operator type and per node."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def summarize(runs: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-operator time (µs per run), the heaviest nodes and the time outside nodes of these `runs`
    (the profile's model_run events), from the profile's node events."""
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
             and any(a <= e["ts"] <= b for a, b in spans)]
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    per_node: dict[str, float] = defaultdict(float)
    for e in nodes:
        op = e["args"].get("op_name", "?")
        per_op[op][0] += e["dur"]
        per_op[op][1] += 1
        per_node[f"{e['name'].removesuffix('_kernel_time')} ({op})"] += e["dur"]
    n = len(runs)
    run_us = sum(r["dur"] for r in runs) / n
    node_us = sum(e["dur"] for e in nodes) / n
    ops = sorted(({"op": k, "us_per_step": v[0] / n, "nodes": v[1] // n, "share": v[0] / n / run_us}
                  for k, v in per_op.items()), key=lambda r: -r["us_per_step"])
    top = sorted(({"node": k, "us_per_step": v / n} for k, v in per_node.items()), key=lambda r: -r["us_per_step"])
    return {"us_per_step": run_us, "us_in_nodes_per_step": node_us, "us_outside_nodes_per_step": run_us - node_us,
            "nodes_per_step": len(nodes) // n, "by_op_type": ops, "top_nodes": top[:15]}


def model_runs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The profile's session runs, in time order."""
    return sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
