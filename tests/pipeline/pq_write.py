#!/usr/bin/env python3
"""Independent writer of Parquet inputs (pyarrow), used by the dataset job's end-to-end tests.

usage: pq_write.py DIR ROW_GROUP_ROWS CODEC... < rows.json

rows.json is a JSON list of objects with the same keys. For each CODEC (a name pyarrow knows:
none, snappy, gzip, brotli, lz4, zstd) the rows are written to DIR/CODEC.parquet in row groups of
ROW_GROUP_ROWS rows, with pyarrow's own type inference (strings, and nulls where a value is
null). Prints one JSON object: {CODEC: {"rows", "row_groups", "compression"}} as pyarrow reads
the files back.
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def main():
    out, group, codecs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    table = pa.Table.from_pylist(json.load(sys.stdin))
    os.makedirs(out, exist_ok=True)
    report = {}
    for codec in codecs:
        path = os.path.join(out, f"{codec}.parquet")
        pq.write_table(table, path, compression=codec, row_group_size=group)
        meta = pq.ParquetFile(path).metadata
        report[codec] = {
            "rows": meta.num_rows,
            "row_groups": meta.num_row_groups,
            "compression": meta.row_group(0).column(0).compression,
        }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
