"""Produces Kafka record batches with kafka-python, a Kafka client that is not librdkafka, so the
worker's codec tests read what a foreign producer writes.

    kafka_produce.py BOOTSTRAP TOPIC < plan.json

plan.json is a list of batches, each produced by its own producer so that it has its own codec:

    [{"codec": "zstd",              # none | gzip | snappy | lz4 | zstd
      "corrupt": false,             # true: the batch's compressed bytes are not valid for its codec
      "records": [{"partition": 0, "key": "k0", "value": "...", "headers": {"h": "v"}}]}]

A record's "value" may be null (a tombstone) or "" (an empty value). Prints one JSON list with the
(partition, offset) the broker gave each record, in plan order.

kafka-python sends a batch uncompressed when compressing does not make it smaller; a test of a
codec would then test nothing, so that makes this script fail (exit 3) instead.
"""

import json
import sys

import kafka.record.default_records as default_records
from kafka import KafkaProducer


ENCODERS = ("gzip_encode", "snappy_encode", "lz4_encode", "zstd_encode")
REAL = {name: getattr(default_records, name) for name in ENCODERS}


def set_corrupt(corrupt):
    """With `corrupt`, every codec writes bytes its decoder rejects: a batch no consumer can decode."""
    garbage = lambda data: b"\x00not-compressed\x00" + bytes(len(data) % 7)  # noqa: E731
    for name in ENCODERS:
        setattr(default_records, name, garbage if corrupt else REAL[name])


# Batches that asked for a codec but went out uncompressed.
UNCOMPRESSED = []
_maybe_compress = default_records.DefaultRecordBatchBuilder._maybe_compress


def checked_maybe_compress(self):
    compressed = _maybe_compress(self)
    if self._compression_type != self.CODEC_NONE and not compressed:
        UNCOMPRESSED.append(self._compression_type)
    return compressed


default_records.DefaultRecordBatchBuilder._maybe_compress = checked_maybe_compress


def main():
    bootstrap, topic = sys.argv[1], sys.argv[2]
    plan = json.load(sys.stdin)
    placed = []
    for batch in plan:
        codec = batch["codec"]
        set_corrupt(batch.get("corrupt", False))
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            # Records of one call share a batch (and so a compressed payload) per partition.
            linger_ms=200,
            acks="all",
            retries=0,
        )
        futures = []
        for rec in batch["records"]:
            value = rec.get("value")
            headers = [(k, v.encode()) for k, v in rec.get("headers", {}).items()]
            futures.append(
                producer.send(
                    topic,
                    value=None if value is None else value.encode(),
                    key=rec["key"].encode() if rec.get("key") is not None else None,
                    headers=headers or None,
                    partition=rec["partition"],
                )
            )
        producer.flush(timeout=60)
        for f in futures:
            md = f.get(timeout=60)
            placed.append({"partition": md.partition, "offset": md.offset})
        producer.close(timeout=10)
    if UNCOMPRESSED:
        print(f"batches sent uncompressed (compression did not pay): codec ids {UNCOMPRESSED}",
              file=sys.stderr)
        sys.exit(3)
    json.dump(placed, sys.stdout)


if __name__ == "__main__":
    main()
