#!/usr/bin/env python3
"""`make lint`'s check of the repository's text: pages must tell the truth about where things are.

Fails (exit 1, one line per finding) on
  - a Markdown link to a file that does not exist, or that resolves outside the repository;
  - a path outside the repository written anywhere (`../shared/…`, `/work/…`);
  - a reference to a tracker's issue number ("issue 25") in code or docs: the tracker is not in
    the repository, so a reader cannot follow it; name the capability instead.
Reads the files git tracks (and new ones not ignored), leaving out raw results and fixtures.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = ("bench/results/", "tests/fixtures/")
SKIP_SUFFIXES = (".json", ".gz", ".parquet", ".gguf", ".bin", ".lock", ".png")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
OUTSIDE = re.compile(r"(\.\./shared/|(?<![\w.])/work/)")


def files():
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for name in out.splitlines():
        if name.startswith(SKIP_DIRS) or name.endswith(SKIP_SUFFIXES) or name == "infra/lint_docs.py":
            continue
        path = ROOT / name
        if path.is_file():
            yield name, path


def main():
    findings = []
    for name, path in files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if ISSUE.search(line):
                findings.append(f"{name}:{n}: a tracker's issue number ({ISSUE.search(line).group(0)}): name the capability")
            if OUTSIDE.search(line):
                findings.append(f"{name}:{n}: a path outside the repository ({OUTSIDE.search(line).group(0)}…)")
            if not name.endswith(".md"):
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                resolved = (path.parent / target.split("#")[0]).resolve()
                if not resolved.is_relative_to(ROOT):
                    findings.append(f"{name}:{n}: link outside the repository: {target}")
                elif not resolved.exists():
                    findings.append(f"{name}:{n}: link to a missing file: {target}")
    for f in findings:
        print(f)
    if findings:
        print(f"lint_docs: {len(findings)} finding(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
