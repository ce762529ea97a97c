//! A dataset job from S3 to S3 on a real S3 API (moto_server, started by `make test` as
//! QUARRY_S3_ENDPOINT) and the real model; create-if-absent and lost put responses on the same
//! server; the output read back from S3 by pyarrow.

mod common;

use std::process::Command;

use bytes::Bytes;
use common::*;
use quarry_pipeline::extract::EngineExtractor;
use quarry_pipeline::faults::check_publish_protocol;
use quarry_pipeline::job::Prepared;
use quarry_pipeline::store::Location;
use quarry_pipeline::PipelineConfig;
use serde_json::json;

fn endpoint() -> String {
    std::env::var("QUARRY_S3_ENDPOINT").expect(
        "QUARRY_S3_ENDPOINT is not set: run the tests with `make test`, which starts moto_server \
         (or infra/local-s3.sh start and export QUARRY_S3_ENDPOINT)",
    )
}

fn boto(script: &str) {
    let st = Command::new(python())
        .args(["-c", &format!("import boto3\ns3 = boto3.client('s3', endpoint_url='{}', aws_access_key_id='test', aws_secret_access_key='test', region_name='us-east-1')\n{script}", endpoint())])
        .status()
        .unwrap();
    assert!(st.success(), "boto3: {script}");
}

#[test]
fn s3_to_s3_dataset_job_with_create_if_absent_and_lost_responses() {
    // object_store reads these; the test binary has this one test, so setting them is safe.
    std::env::set_var("AWS_ENDPOINT", endpoint());
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_REGION", "us-east-1");
    let bucket = format!("quarry-test-{}", std::process::id());
    boto(&format!("s3.create_bucket(Bucket='{bucket}')"));

    // Create-if-absent on this server, a put whose response is lost but whose write landed, and
    // transient failures.
    check_publish_protocol(&Location::open(&format!("s3://{bucket}/probe")).unwrap());

    let docs = packages(3);
    let input = Location::open(&format!("s3://{bucket}/in")).unwrap();
    let shard = |ds: &[&String]| {
        let lines: Vec<String> = ds
            .iter()
            .enumerate()
            .map(|(i, d)| json!({"id": i, "text": d}).to_string())
            .collect();
        Bytes::from(lines.join("\n") + "\n")
    };
    let first = shard(&[&docs[0], &docs[1]]);
    // A line's offset is its first byte's: the second line starts after the first's '\n'.
    let second_line = first.iter().position(|b| *b == b'\n').unwrap() as i64 + 1;
    input.publish("part-0.jsonl", first).unwrap();
    input.publish("part-1.jsonl", shard(&[&docs[2]])).unwrap();

    let cfg =
        PipelineConfig::parse(&package_id_job("s3-test", &bucket), "s3-test.toml", root()).unwrap();
    let job = Prepared::new(cfg).unwrap();
    let publisher = job.publisher(None, None).unwrap();
    let run = || {
        let extractor = EngineExtractor::load(&job.cfg, &job.schema).unwrap();
        job.run_dataset_plain(extractor, &input, &publisher)
            .unwrap()
    };
    let s = run();
    assert_eq!((s.shards, s.shards_done, s.consumed), (2, 2, 3));
    let ep = endpoint();
    let acc = rows(&dump(
        &format!("s3://{bucket}/out"),
        &["--s3-endpoint", &ep],
    ));
    let rej = rows(&dump(
        &format!("s3://{bucket}/rejects"),
        &["--s3-endpoint", &ep],
    ));
    let mut all = keys(&acc);
    all.extend(keys(&rej));
    all.sort();
    let src = |f: &str| format!("s3://{bucket}/in/{f}");
    assert_eq!(
        all,
        vec![
            (src("part-0.jsonl"), 0),
            (src("part-0.jsonl"), second_line),
            (src("part-1.jsonl"), 0)
        ]
    );
    // Both shards have their marker; a rerun does nothing.
    let again = run();
    assert_eq!((again.shards_skipped, again.consumed), (2, 0));
}
