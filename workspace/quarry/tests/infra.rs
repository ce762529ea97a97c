//! The deployment files in `infra/` are checked like code: every Kubernetes manifest parses, the
//! files, ConfigMap keys, Secrets and ports it references exist, the job definitions it carries
//! load with quarry's own loader, and every file a Dockerfile copies is in the repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quarry_pipeline::config::SourceConfig;
use quarry_pipeline::PipelineConfig;
use yaml_rust2::{Yaml, YamlLoader};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn k8s() -> PathBuf {
    root().join("infra/k8s")
}

/// Every YAML document of every file in infra/k8s, by file name.
fn manifests() -> BTreeMap<String, Vec<Yaml>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(k8s()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let docs = YamlLoader::load_from_str(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!docs.is_empty(), "{name} is empty");
        out.insert(name, docs);
    }
    assert!(out.len() >= 6, "infra/k8s holds {} manifests", out.len());
    out
}

fn s<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {y:?}"))
}

fn objects(m: &BTreeMap<String, Vec<Yaml>>, kind: &str) -> Vec<Yaml> {
    m.values()
        .flatten()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .cloned()
        .collect()
}

/// ConfigMap name → its data (key → text).
fn config_maps(m: &BTreeMap<String, Vec<Yaml>>) -> BTreeMap<String, BTreeMap<String, String>> {
    objects(m, "ConfigMap")
        .iter()
        .map(|c| {
            let data = c["data"]
                .as_hash()
                .expect("a ConfigMap has data")
                .iter()
                .map(|(k, v)| (s(k, "key").to_string(), s(v, "value").to_string()))
                .collect();
            (s(&c["metadata"]["name"], "name").to_string(), data)
        })
        .collect()
}

#[test]
fn every_manifest_parses_and_the_kustomization_lists_them_all() {
    let m = manifests();
    for (file, docs) in &m {
        for d in docs {
            let kind = s(&d["kind"], &format!("{file}: kind"));
            s(&d["apiVersion"], &format!("{file}: apiVersion"));
            if kind != "Kustomization" {
                s(&d["metadata"]["name"], &format!("{file}: metadata.name"));
            }
        }
    }
    let kust = &m["kustomization.yaml"][0];
    let listed: BTreeSet<String> = kust["resources"]
        .as_vec()
        .expect("resources")
        .iter()
        .map(|r| s(r, "resource").to_string())
        .collect();
    for r in &listed {
        assert!(
            k8s().join(r).is_file(),
            "kustomization lists {r}, which does not exist"
        );
    }
    let present: BTreeSet<String> = m
        .keys()
        .filter(|k| k.as_str() != "kustomization.yaml")
        .cloned()
        .collect();
    assert_eq!(
        listed, present,
        "the kustomization must list every manifest"
    );
    for kind in [
        "Deployment",
        "ConfigMap",
        "Secret",
        "CronJob",
        "Service",
        "Namespace",
    ] {
        assert!(!objects(&m, kind).is_empty(), "no {kind} in infra/k8s");
    }
}

/// A container's `args`.
fn args_of(container: &Yaml) -> Vec<&str> {
    container["args"]
        .as_vec()
        .expect("args")
        .iter()
        .map(|a| s(a, "arg"))
        .collect()
}

/// Checks one pod template: the pipeline it runs, the ConfigMap and Secrets it mounts, one GPU, the
/// image. Returns the loaded job definition and the container.
fn check_pod(
    what: &str,
    pod: &Yaml,
    maps: &BTreeMap<String, BTreeMap<String, String>>,
    secrets: &BTreeSet<String>,
) -> (PipelineConfig, Yaml) {
    let containers = pod["containers"].as_vec().expect("containers");
    assert_eq!(containers.len(), 1, "{what}: one container");
    let c = containers[0].clone();
    let args = args_of(&c);
    let pipeline = args
        .iter()
        .position(|a| *a == "--pipeline")
        .map(|i| args[i + 1])
        .unwrap_or_else(|| panic!("{what}: no --pipeline in {args:?}"));
    let (dir, file) = pipeline.rsplit_once('/').unwrap();
    // The folder is a mounted ConfigMap that holds the file.
    let mount = c["volumeMounts"]
        .as_vec()
        .expect("volumeMounts")
        .iter()
        .find(|v| v["mountPath"].as_str() == Some(dir))
        .unwrap_or_else(|| panic!("{what}: nothing mounted at {dir}"));
    let volume = pod["volumes"]
        .as_vec()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{what}: no volume {:?}", mount["name"]));
    let map_name = s(&volume["configMap"]["name"], "configMap.name");
    let data = maps
        .get(map_name)
        .unwrap_or_else(|| panic!("{what}: ConfigMap {map_name} is not defined"));
    let toml = data
        .get(file)
        .unwrap_or_else(|| panic!("{what}: ConfigMap {map_name} has no key {file}"));
    // quarry's own loader (deny_unknown_fields), as the pod will run it.
    let cfg = PipelineConfig::parse(toml, pipeline, PathBuf::from(dir))
        .unwrap_or_else(|e| panic!("{what}: {pipeline} does not load: {e}"));
    let schema = cfg.schema_path();
    let (sdir, skey) = schema.to_str().unwrap().rsplit_once('/').unwrap();
    assert_eq!(
        sdir, dir,
        "{what}: the schema must be in the same ConfigMap"
    );
    let embedded = data
        .get(skey)
        .unwrap_or_else(|| panic!("{what}: ConfigMap {map_name} has no schema key {skey}"));
    let repo = std::fs::read_to_string(root().join("schemas").join(skey))
        .unwrap_or_else(|e| panic!("{what}: schemas/{skey}: {e}"));
    assert_eq!(
        embedded.trim(),
        repo.trim(),
        "{what}: the ConfigMap's {skey} differs from schemas/{skey}"
    );
    assert!(
        cfg.model.device.starts_with("cuda"),
        "{what}: a GPU pod's pipeline should run on cuda, not {}",
        cfg.model.device
    );
    for e in c["envFrom"].as_vec().into_iter().flatten() {
        let name = s(&e["secretRef"]["name"], "secretRef.name");
        assert!(
            secrets.contains(name),
            "{what}: Secret {name} is not defined"
        );
    }
    assert_eq!(
        c["resources"]["limits"]["nvidia.com/gpu"].as_i64(),
        Some(1),
        "{what}: one GPU per pod"
    );
    let image = s(&c["image"], "image");
    let flavour = image.rsplit_once(':').map_or("latest", |(_, t)| t);
    assert!(
        root()
            .join(format!("infra/docker/Dockerfile.{flavour}"))
            .is_file(),
        "{what}: image {image} has no infra/docker/Dockerfile.{flavour}"
    );
    (cfg, c)
}

#[test]
fn the_worker_deployment_and_the_indexed_reprocessing_job_reference_what_exists() {
    let m = manifests();
    let maps = config_maps(&m);
    let secrets: BTreeSet<String> = objects(&m, "Secret")
        .iter()
        .map(|x| s(&x["metadata"]["name"], "name").to_string())
        .collect();

    let deployment = &objects(&m, "Deployment")[0];
    let ann = &deployment["metadata"]["annotations"];
    let partitions: i64 = s(&ann["quarry.dev/topic-partitions"], "topic-partitions")
        .parse()
        .unwrap();
    assert_eq!(
        deployment["spec"]["replicas"].as_i64(),
        Some(partitions),
        "replicas must equal the topic's partition count"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let (cfg, c) = check_pod("worker Deployment", pod, &maps, &secrets);
    let SourceConfig::Kafka(src) = &cfg.source else {
        panic!("the worker's pipeline must have a kafka source")
    };
    assert_eq!(src.topic, s(&ann["quarry.dev/topic"], "topic"));
    assert_eq!(s(&c["args"][0], "subcommand"), "worker");
    // Probes hit the port the pipeline's metrics endpoint listens on.
    let port = c["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some("metrics"))
        .expect("a port named metrics");
    let listen = cfg.metrics.listen.clone().expect("metrics.listen");
    assert_eq!(
        listen.rsplit_once(':').unwrap().1.parse::<i64>().unwrap(),
        port["containerPort"].as_i64().unwrap(),
        "metrics.listen and the container port differ"
    );
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/metrics"),
        ("startupProbe", "/healthz"),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"].as_str(), Some(path), "{probe}");
        assert_eq!(
            c[probe]["httpGet"]["port"].as_str(),
            Some("metrics"),
            "{probe}"
        );
    }
    let service = &objects(&m, "Service")[0];
    assert_eq!(
        service["spec"]["selector"], deployment["spec"]["selector"]["matchLabels"],
        "the metrics Service selects the workers"
    );

    let cron = &objects(&m, "CronJob")[0];
    assert_eq!(
        s(&cron["spec"]["schedule"], "schedule")
            .split_whitespace()
            .count(),
        5,
        "a five-field cron schedule"
    );
    assert_eq!(cron["spec"]["concurrencyPolicy"].as_str(), Some("Forbid"));
    let job = &cron["spec"]["jobTemplate"]["spec"];
    let pod = &job["template"]["spec"];
    let (cfg, c) = check_pod("reprocess CronJob", pod, &maps, &secrets);
    let SourceConfig::Dataset(src) = &cfg.source else {
        panic!("the reprocessing pipeline must have a dataset source")
    };
    assert_eq!(s(&c["args"][0], "subcommand"), "extract");
    // An Indexed Job of N workers, each taking shards by its index: N pods, N completions, and
    // quarry told N, or some shards would belong to no pod (or two pods would share an index).
    assert_eq!(job["completionMode"].as_str(), Some("Indexed"));
    let workers = job["completions"].as_i64().expect("completions");
    assert!(workers > 1, "a sharded job has several workers");
    assert_eq!(
        job["parallelism"].as_i64(),
        Some(workers),
        "parallelism = completions"
    );
    let args = args_of(&c);
    let count = args
        .iter()
        .position(|a| *a == "--shard-count")
        .map(|i| args[i + 1].parse::<i64>().unwrap())
        .or(src.shard_count.map(|n| n as i64))
        .expect("the shard count is given, as --shard-count or source.shard_count");
    assert_eq!(count, workers, "--shard-count = completions");
    assert!(
        !args.contains(&"--shard-index") && src.shard_index.is_none(),
        "the index comes from JOB_COMPLETION_INDEX, not a fixed value every pod shares"
    );
    // A failed index is retried alone, and never runs twice at once.
    assert!(job["backoffLimitPerIndex"].as_i64().is_some_and(|n| n >= 1));
    assert_eq!(
        pod["restartPolicy"].as_str(),
        Some("Never"),
        "backoffLimitPerIndex needs it"
    );
    assert_eq!(job["podReplacementPolicy"].as_str(), Some("Failed"));
}

/// `COPY` sources of a Dockerfile (stages' `--from` copies excluded), relative to the context.
fn copy_sources(dockerfile: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dockerfile).unwrap();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("COPY ") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.iter().any(|w| w.starts_with("--from")) {
            continue;
        }
        let words: Vec<&str> = words.into_iter().filter(|w| !w.starts_with("--")).collect();
        out.extend(words[..words.len() - 1].iter().map(|w| w.to_string()));
    }
    out
}

#[test]
fn the_dockerfiles_copy_files_that_exist_and_are_not_ignored() {
    let ignored: Vec<String> = std::fs::read_to_string(root().join(".dockerignore"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/').to_string())
        .collect();
    for flavour in ["cpu", "cuda"] {
        let file = root().join(format!("infra/docker/Dockerfile.{flavour}"));
        let sources = copy_sources(&file);
        assert!(
            sources.iter().any(|s| s == "workspace"),
            "{flavour}: the sources are copied"
        );
        for src in sources {
            assert!(
                root().join(&src).exists(),
                "Dockerfile.{flavour} copies {src}, which does not exist"
            );
            assert!(
                !ignored
                    .iter()
                    .any(|i| src == *i || src.starts_with(&format!("{i}/"))),
                "Dockerfile.{flavour} copies {src}, which .dockerignore leaves out"
            );
        }
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("ENTRYPOINT [\"quarry\"]"),
            "{flavour}: entrypoint"
        );
        assert!(text.contains("EXPOSE 9464"), "{flavour}: metrics port");
    }
    assert!(
        std::fs::read_to_string(root().join("infra/docker/Dockerfile.cuda"))
            .unwrap()
            .contains("--features cuda")
    );
}
