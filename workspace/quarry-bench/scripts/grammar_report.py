#!/usr/bin/env python3
"""Turns grammar-bench JSON into the Markdown tables of BENCHMARKS.md.

usage: grammar_report.py RESULTS.json
"""
import json
import sys

data = json.load(open(sys.argv[1]))
rows = data["results"]
models = list(dict.fromkeys(r["model"] for r in rows))
engines = ["quarry", "quarry (eager)", "outlines-core", "llguidance"]


def get(model, case, engine):
    for r in rows:
        if r["model"] == model and r["case"] == case and r["engine"] == engine:
            return r
    return None


def fmt(us):
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.1f} µs" if us >= 10 else f"{us:.2f} µs"


for model in models:
    cases = list(dict.fromkeys(r["case"] for r in rows if r["model"] == model))
    print(f"\n#### {model}\n")
    print("| case | engine | compile | time to first mask | cold p50 / p99 / max | warm p50 / p99 / max |")
    print("|---|---|---:|---:|---:|---:|")
    for case in cases:
        for e in engines:
            r = get(model, case, e)
            if r is None:
                continue
            if "error" in r:
                print(f"| {case} | {e} | error: {r['error']} | | | |")
                continue
            c, w = r["cold"], r["warm"]
            print(
                f"| {case} ({r['walk_tokens']} tokens) | {e} | {fmt(r['compile_us'])} | {fmt(r['time_to_first_mask_us'])} | "
                f"{fmt(c['p50_us'])} / {fmt(c['p99_us'])} / {fmt(c['max_us'])} | "
                f"{fmt(w['p50_us'])} / {fmt(w['p99_us'])} / {fmt(w['max_us'])} |"
            )
    print("\nRatios (peer ÷ quarry; above 1 means quarry is faster):\n")
    print("| case | compile vs outlines-core | compile (eager) vs outlines-core | compile vs llguidance | cold p50 vs llguidance | warm p50 vs llguidance | cold p50 vs outlines-core |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        q, qe = get(model, case, "quarry"), get(model, case, "quarry (eager)")
        o, l = get(model, case, "outlines-core"), get(model, case, "llguidance")
        if not all(x and "error" not in x for x in (q, qe, o, l)):
            continue
        ratio = lambda a, b: f"{a / b:.1f}×"
        print(
            f"| {case} | {ratio(o['compile_us'], q['compile_us'])} | {ratio(o['compile_us'], qe['compile_us'])} | "
            f"{ratio(l['compile_us'], q['compile_us'])} | {ratio(l['cold']['p50_us'], q['cold']['p50_us'])} | "
            f"{ratio(l['warm']['p50_us'], q['warm']['p50_us'])} | {ratio(o['cold']['p50_us'], q['cold']['p50_us'])} |"
        )
