#!/usr/bin/env bash
# Runs reconcile-bench (BIN, then its ARGS) on moto_server, a real S3 API on 127.0.0.1, in a
# bucket of its own: `make bench-reconcile` calls it after building the benchmark.
set -euo pipefail
BIN="$1"; shift
export QUARRY_CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
# Its own run folder and port, so a test run's moto_server is left alone.
export QUARRY_RUN; QUARRY_RUN="$(mktemp -d)"
VENV="${QUARRY_TESTVENV:-$QUARRY_CACHE/testvenv}"
endpoint="$(bash "$(dirname "${BASH_SOURCE[0]}")/local-s3.sh" start 15002)"
trap 'bash "$(dirname "${BASH_SOURCE[0]}")/local-s3.sh" stop; rm -rf "$QUARRY_RUN"' EXIT
export AWS_ENDPOINT="$endpoint" AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test \
    AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
"$VENV/bin/python" -c "import boto3; boto3.client('s3', endpoint_url='$endpoint', region_name='us-east-1', aws_access_key_id='test', aws_secret_access_key='test').create_bucket(Bucket='reconcile')"
"$BIN" --url s3://reconcile/bench "$@"
