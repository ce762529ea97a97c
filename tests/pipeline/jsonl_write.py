#!/usr/bin/env python3
"""Independent writer of compressed JSONL inputs, used by the dataset job's end-to-end tests.

usage: jsonl_write.py PATH CODEC < input.jsonl

Copies stdin to PATH compressed as CODEC: `gzip` with Python's gzip module (zlib), `zstd` with
pyarrow's compressed stream (libzstd). Prints the number of bytes written.
"""
import gzip
import sys

import pyarrow as pa


def main():
    path, codec = sys.argv[1], sys.argv[2]
    data = sys.stdin.buffer.read()
    if codec == "gzip":
        with gzip.open(path, "wb") as f:
            f.write(data)
    elif codec == "zstd":
        with pa.CompressedOutputStream(path, "zstd") as f:
            f.write(data)
    else:
        sys.exit(f"unknown codec {codec}")
    print(len(open(path, "rb").read()))


if __name__ == "__main__":
    main()
