#!/usr/bin/env python3
"""Accuracy of the package demo, per field, against ground truth parsed from the source.

usage: demo_report.py SHARDS_DIR INSPECT_JSON [--samples N]

SHARDS_DIR holds the JSONL shards `dpkg_jsonl.py` wrote (one {"id", "text"} object per package,
the text being the package's raw /var/lib/dpkg/status entry). INSPECT_JSON is the output of
`quarry inspect OUT_DIR --all --json` over the job's accepted files. The ground truth is parsed
here, directly from each raw entry, with the rules the demo's prompt states:

  name        the Package field
  version     the Version field
  maintainer  the Maintainer field
  depends     the Depends field split at commas (an empty list when there is none)
  homepage    the Homepage field, or null
  summary     the first line of the Description field

A field is right when the extracted value equals the truth exactly (strings compared after
trimming surrounding spaces, depends as the whole list). Accuracy is over every document: a
rejected document counts as wrong in every field. Standard library only, so `make demo` needs no
Python packages.
"""
import argparse
import glob
import json
import os
import sys

FIELDS = ["name", "version", "maintainer", "depends", "homepage", "summary"]


def parse_entry(text):
    """The control fields of one dpkg status entry; continuation lines join their field."""
    fields, key = {}, None
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip()
            if key in fields:  # the prompt says: the first occurrence wins
                key = None
                continue
            fields[key] = value.strip()
    return fields


def truth(text):
    f = parse_entry(text)
    depends = [d.strip() for d in f.get("Depends", "").split(",") if d.strip()]
    return {
        "name": f.get("Package"),
        "version": f.get("Version"),
        "maintainer": f.get("Maintainer"),
        "depends": depends,
        "homepage": f.get("Homepage"),
        "summary": f.get("Description", "").split("\n", 1)[0] or None,
    }


def same(field, got, want):
    if field == "depends":
        return isinstance(got, list) and [str(x).strip() for x in got] == want
    if got is None or want is None:
        return got is None and want is None
    return str(got).strip() == want


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("inspect_json")
    ap.add_argument("--samples", type=int, default=3)
    a = ap.parse_args()

    docs = {}
    for path in sorted(glob.glob(os.path.join(a.shards, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    docs[d["id"]] = truth(d["text"])
    if not docs:
        sys.exit(f"no documents under {a.shards}")
    with open(a.inspect_json, encoding="utf-8") as f:
        report = json.load(f)
    rows = {}
    for file in report["files"]:
        if file["dataset"] != "accepted":
            continue
        for r in file["sample"]:
            rows[r["_doc_id"]] = r
    unknown = sorted(set(rows) - set(docs))
    if unknown:
        sys.exit(f"extracted rows for documents that are not in {a.shards}: {unknown[:5]}")

    right = {k: 0 for k in FIELDS}
    all_right = 0
    for doc_id, want in docs.items():
        got = rows.get(doc_id)
        ok = [got is not None and same(k, got.get(k), want[k]) for k in FIELDS]
        for k, good in zip(FIELDS, ok):
            right[k] += good
        all_right += all(ok)

    n = len(docs)
    print(f"accuracy against the dpkg database, {n} documents "
          f"({len(rows)} accepted; a rejected document counts as wrong):")
    for k in FIELDS:
        print(f"  {k:<11} {right[k]:>4}/{n}  {100.0 * right[k] / n:5.1f}%")
    print(f"  {'all six':<11} {all_right:>4}/{n}  {100.0 * all_right / n:5.1f}%")
    shown = 0
    for doc_id, want in docs.items():
        got = rows.get(doc_id)
        if got is None or shown >= a.samples:
            continue
        shown += 1
        print(f"\n  {doc_id}:")
        for k in FIELDS:
            mark = "ok " if same(k, got.get(k), want[k]) else "BAD"
            print(f"    {mark} {k:<11} {json.dumps(got.get(k), ensure_ascii=False)[:90]}")
            if mark == "BAD":
                print(f"        {'truth':<11} {json.dumps(want[k], ensure_ascii=False)[:90]}")


if __name__ == "__main__":
    main()
