#!/usr/bin/env python3
"""Independent reader for quarry's Parquet output (pyarrow), used by the end-to-end tests.

usage: pq_dump.py ROOT [--s3-endpoint URL]

ROOT is a local folder or s3://bucket/prefix. Every *.parquet under it is opened with pyarrow; a
file whose footer cannot be read makes the script exit 1 naming it. Prints one JSON object:
  {"files": [{"path", "rows", "schema": [[name, type, nullable]], "metadata": {k: v}}],
   "rows":  [{column: value, ... , "_file": path}]}
Values are converted with to_pylist(); timestamps and bytes are printed as strings.
"""
import json
import sys

import pyarrow.fs as pafs
import pyarrow.parquet as pq


def main():
    root = sys.argv[1]
    endpoint = None
    if "--s3-endpoint" in sys.argv:
        endpoint = sys.argv[sys.argv.index("--s3-endpoint") + 1]
    if root.startswith("s3://"):
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint, scheme="http", access_key="test", secret_key="test",
            region="us-east-1")
        base = root[len("s3://"):].rstrip("/")
    else:
        fs = pafs.LocalFileSystem()
        base = root.rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    paths = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))
    files, rows = [], []
    for p in paths:
        try:
            f = pq.ParquetFile(p, filesystem=fs)
            table = f.read()
        except Exception as e:  # noqa: BLE001 - the path and the reason are the message
            print(f"unreadable parquet file {p}: {e}", file=sys.stderr)
            sys.exit(1)
        meta = {k.decode(): v.decode() for k, v in (f.schema_arrow.metadata or {}).items()
                if not k.startswith(b"ARROW:")}
        kv = f.metadata.metadata or {}
        meta.update({k.decode(): v.decode() for k, v in kv.items() if not k.startswith(b"ARROW:")})
        files.append({
            "path": p,
            "rows": table.num_rows,
            "row_groups": f.num_row_groups,
            "compression": f.metadata.row_group(0).column(0).compression if f.num_row_groups else None,
            "schema": [[fld.name, str(fld.type), fld.nullable] for fld in table.schema],
            "metadata": meta,
        })
        for r in table.to_pylist():
            r = {k: (v.hex() if isinstance(v, bytes) else str(v) if hasattr(v, "isoformat") else v)
                 for k, v in r.items()}
            r["_file"] = p
            rows.append(r)
    json.dump({"files": files, "rows": rows}, sys.stdout)


if __name__ == "__main__":
    main()
