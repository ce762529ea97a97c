#!/usr/bin/env python3
"""Turns the Debian package database into JSONL shards for the package demo.

usage: dpkg_jsonl.py OUT_DIR [--status /var/lib/dpkg/status] [--packages N] [--shard-size M]

Each package's raw status entry becomes one line {"id": <Package>, "text": <entry>}; entries are
sorted by name and N of them are taken evenly spread over the database. Shards are named
part-00000.jsonl, part-00001.jsonl, ...; existing shards are left as they are (idempotent).
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--status", default="/var/lib/dpkg/status")
    ap.add_argument("--packages", type=int, default=24)
    ap.add_argument("--shard-size", type=int, default=8)
    a = ap.parse_args()
    with open(a.status, encoding="utf-8", errors="replace") as f:
        entries = [e.strip("\n") for e in f.read().split("\n\n") if e.startswith("Package: ")]
    entries.sort()
    n = min(a.packages, len(entries))
    step = max(1, len(entries) // n)
    picked = [entries[i * step] for i in range(n)]
    os.makedirs(a.out, exist_ok=True)
    for k in range(0, n, a.shard_size):
        path = os.path.join(a.out, f"part-{k // a.shard_size:05d}.jsonl")
        if os.path.exists(path):
            continue
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for e in picked[k:k + a.shard_size]:
                name = e.split("\n", 1)[0][len("Package: "):]
                f.write(json.dumps({"id": name, "text": e + "\n"}) + "\n")
        os.replace(path + ".tmp", path)
    print(f"{n} packages in {(n + a.shard_size - 1) // a.shard_size} shards under {a.out}")


if __name__ == "__main__":
    main()
