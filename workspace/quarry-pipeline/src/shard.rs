//! Shards: the units of work and of output of a dataset job, and which of them are one worker's.
//!
//! A dataset job scales out with no coordinator: each of N workers lists the same input prefix
//! and takes the shards whose [`shard_hash`] falls to its index ([`ShardSlice`]). Workers never
//! talk to each other; the output's create-if-absent protocol ([`crate::flow`]) keeps every shard
//! published once even when two workers are given the same index by mistake.

use object_store::path::Path;
use sha2::{Digest, Sha256};

use crate::config::{DatasetSource, InputFormat};
use crate::error::{InputProblem, PipelineError};
use crate::store::Location;

/// A unit of work and of output: one output file name and the input objects it reads.
#[derive(Debug, Clone)]
pub struct Shard {
    pub name: String,
    pub files: Vec<Path>,
    /// Each file's size in bytes, as the listing gave it.
    pub sizes: Vec<u64>,
}

/// How a JSONL input file is compressed, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Plain,
    /// `.gz` (one gzip member or several, as `cat a.gz b.gz` makes).
    Gzip,
    /// `.zst` or `.zstd` (one frame or several).
    Zstd,
}

impl Codec {
    /// The codec of a JSONL input named `name` (`a.jsonl`, `a.ndjson.gz`, `a.json.zst`, …) and
    /// the name without the codec's extension; `None` for a name that is not a JSONL input.
    pub fn of_jsonl(name: &str) -> Option<(Codec, &str)> {
        let (codec, plain) = if let Some(p) = name.strip_suffix(".gz") {
            (Codec::Gzip, p)
        } else if let Some(p) = name
            .strip_suffix(".zst")
            .or_else(|| name.strip_suffix(".zstd"))
        {
            (Codec::Zstd, p)
        } else {
            (Codec::Plain, name)
        };
        let file = plain.rsplit('/').next().unwrap_or(plain);
        let ext = file.rsplit_once('.')?.1;
        ["jsonl", "ndjson", "json"]
            .contains(&ext)
            .then_some((codec, plain))
    }
}

/// Lists the shards of a dataset, in name order. Two inputs whose shards would have one name
/// (`a.jsonl` and `a.jsonl.gz`) are an error naming both: the second would otherwise be taken
/// for the first, already published.
pub fn shards(input: &Location, src: &DatasetSource) -> Result<Vec<Shard>, PipelineError> {
    let objects = input.list("")?;
    let visible: Vec<_> = objects
        .into_iter()
        .filter(|m| {
            let rel = input.relative(&m.location);
            !rel.split('/')
                .any(|part| part.starts_with('.') || part.starts_with('_'))
        })
        .collect();
    let seen = visible.len();
    // The output name of an input at `rel` (without a codec's extension): its stem + .parquet.
    let renamed = |rel: &str| match rel.rsplit_once('.') {
        Some((stem, _)) => format!("{stem}.parquet"),
        None => format!("{rel}.parquet"),
    };
    let one_file = |name: String, m: object_store::ObjectMeta| Shard {
        name,
        files: vec![m.location],
        sizes: vec![m.size],
    };
    let shards: Vec<Shard> = match src.format {
        InputFormat::Jsonl => visible
            .into_iter()
            .filter_map(|m| {
                let rel = input.relative(&m.location);
                let (_, plain) = Codec::of_jsonl(&rel)?;
                Some(one_file(renamed(plain), m))
            })
            .collect(),
        InputFormat::Parquet => visible
            .into_iter()
            .filter(|m| m.location.extension() == Some("parquet"))
            .map(|m| one_file(renamed(&input.relative(&m.location)), m))
            .collect(),
        InputFormat::Text => visible
            .chunks(src.text_shard_files)
            .enumerate()
            .map(|(k, chunk)| Shard {
                name: format!("text-{k:06}.parquet"),
                files: chunk.iter().map(|m| m.location.clone()).collect(),
                sizes: chunk.iter().map(|m| m.size).collect(),
            })
            .collect(),
    };
    let inputs: usize = shards.iter().map(|s| s.files.len()).sum();
    if inputs < seen {
        tracing::warn!(
            input = %input.url,
            format = ?src.format,
            skipped = seen - inputs,
            "files under the input that are not inputs of this format are left out"
        );
    }
    let mut names = std::collections::HashMap::new();
    for s in &shards {
        if let Some(first) = names.insert(s.name.as_str(), &s.files[0]) {
            return Err(PipelineError::Input {
                location: input.url.clone(),
                source: InputProblem::SameShardName {
                    name: s.name.clone(),
                    first: input.relative(first),
                    second: input.relative(&s.files[0]),
                },
            });
        }
    }
    Ok(shards)
}

/// The stable hash that assigns a shard to a worker: the first 8 bytes of the SHA-256 of the
/// shard's name (its output file name, e.g. `part-00003.parquet`), big-endian. The same on every
/// machine and in every version, so a rerun of any subset of workers picks the same shards;
/// `printf %s NAME | sha256sum` reproduces it.
pub fn shard_hash(name: &str) -> u64 {
    let digest = Sha256::digest(name.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Worker `index` of `count`: the shards whose [`shard_hash`] modulo `count` is `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardSlice {
    pub index: usize,
    pub count: usize,
}

impl Default for ShardSlice {
    fn default() -> Self {
        ShardSlice::ALL
    }
}

impl std::fmt::Display for ShardSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Where a worker's index came from, for error messages.
const INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

impl ShardSlice {
    /// One worker, every shard.
    pub const ALL: ShardSlice = ShardSlice { index: 0, count: 1 };

    /// Whether shard `name` is this worker's.
    pub fn owns(&self, name: &str) -> bool {
        self.count <= 1 || shard_hash(name) % self.count as u64 == self.index as u64
    }

    /// Part `part` of `parts` of this slice: worker `index` of `count` running one process per
    /// device gives device `part` the slice `index + count·part` of `count·parts`, whose shards
    /// (hash ≡ index + count·part mod count·parts, so hash ≡ index mod count) are this slice's,
    /// and whose union over the parts is exactly this slice.
    pub fn part(&self, part: usize, parts: usize) -> ShardSlice {
        ShardSlice {
            index: self.index + self.count * part,
            count: self.count * parts,
        }
    }

    /// The slice a worker runs: the index from `--shard-index`, else the environment's
    /// `JOB_COMPLETION_INDEX` (a Kubernetes Indexed Job sets it), else `source.shard_index`;
    /// the count from `--shard-count`, else `source.shard_count`, else 1. `pipeline` names the
    /// job file in errors.
    pub fn resolve(
        flag_index: Option<usize>,
        flag_count: Option<usize>,
        env_index: Option<&str>,
        src: &DatasetSource,
        pipeline: &str,
    ) -> Result<ShardSlice, PipelineError> {
        let bad = |message: String| PipelineError::Config {
            path: pipeline.to_string(),
            message,
        };
        let (index, from) = match (flag_index, env_index, src.shard_index) {
            (Some(i), _, _) => (i, "--shard-index".to_string()),
            (None, Some(text), _) => {
                let i = text.trim().parse::<usize>().map_err(|_| {
                    bad(format!(
                        "{INDEX_ENV}={text:?} is not a worker index (a whole number >= 0)"
                    ))
                })?;
                (i, format!("{INDEX_ENV}={i}"))
            }
            (None, None, Some(i)) => (i, "source.shard_index".to_string()),
            (None, None, None) => (0, String::new()),
        };
        let count = flag_count.or(src.shard_count).unwrap_or(1);
        if count == 0 {
            return Err(bad(
                "a shard count of 0 leaves every shard undone; it must be at least 1".into(),
            ));
        }
        if index >= count {
            return Err(bad(format!(
                "worker index {index} ({from}) is not below the shard count {count}: set \
                 --shard-count or source.shard_count to the number of workers"
            )));
        }
        Ok(ShardSlice { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DocFields;

    fn src(index: Option<usize>, count: Option<usize>) -> DatasetSource {
        DatasetSource {
            input: "in/".into(),
            format: InputFormat::Jsonl,
            fields: DocFields::default(),
            text_shard_files: 1,
            shard_index: index,
            shard_count: count,
        }
    }

    fn names() -> Vec<String> {
        (0..500).map(|i| format!("part-{i:05}.parquet")).collect()
    }

    #[test]
    fn jsonl_inputs_by_name_and_codec_and_their_shard_names() {
        let input = Location::open("memory://shard-names/in").unwrap();
        for name in [
            "a.jsonl",
            "b.ndjson.gz",
            "c.json.zst",
            "dir/d.jsonl.zstd",
            "e.csv",
            "f.gz",
            "_SUCCESS",
        ] {
            input.publish(name, b"x"[..].into()).unwrap();
        }
        let got: Vec<(String, String)> = shards(&input, &src(None, None))
            .unwrap()
            .into_iter()
            .map(|s| (s.name, input.relative(&s.files[0])))
            .collect();
        let want = [
            ("a.parquet", "a.jsonl"),
            ("b.parquet", "b.ndjson.gz"),
            ("c.parquet", "c.json.zst"),
            ("dir/d.parquet", "dir/d.jsonl.zstd"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            Codec::of_jsonl("x.jsonl.gz"),
            Some((Codec::Gzip, "x.jsonl"))
        );
        assert_eq!(Codec::of_jsonl("x.gz"), None);
        assert_eq!(Codec::of_jsonl("v1.2/x"), None);
    }

    #[test]
    fn two_inputs_of_one_shard_name_are_an_error_naming_both() {
        let input = Location::open("memory://shard-same/in").unwrap();
        input.publish("a.jsonl", b"x"[..].into()).unwrap();
        input.publish("a.jsonl.gz", b"x"[..].into()).unwrap();
        let e = shards(&input, &src(None, None)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("a.jsonl and a.jsonl.gz would both be published as a.parquet"),
            "{msg}"
        );
    }

    #[test]
    fn each_shard_belongs_to_exactly_one_worker_and_the_split_is_even() {
        for count in [1, 2, 3, 7] {
            let mut per = vec![0usize; count];
            for n in names() {
                let owners: Vec<usize> = (0..count)
                    .filter(|&index| ShardSlice { index, count }.owns(&n))
                    .collect();
                assert_eq!(owners.len(), 1, "{n} of {count}: {owners:?}");
                per[owners[0]] += 1;
            }
            // 500 names over `count` workers: within 40% of an even share each.
            let even = 500 / count;
            assert!(
                per.iter()
                    .all(|&k| k * 10 >= even * 6 && k * 10 <= even * 14),
                "{count}: {per:?}"
            );
        }
    }

    #[test]
    fn the_parts_of_a_slice_split_exactly_that_slice() {
        let slice = ShardSlice { index: 1, count: 3 };
        for parts in [1, 2, 4] {
            for n in names() {
                let owners = (0..parts)
                    .filter(|&g| slice.part(g, parts).owns(&n))
                    .count();
                assert_eq!(owners, slice.owns(&n) as usize, "{n}, {parts} parts");
            }
        }
        assert_eq!(slice.part(1, 2), ShardSlice { index: 4, count: 6 });
    }

    #[test]
    fn the_index_comes_from_the_flag_then_the_environment_then_the_file() {
        let r = |flag, count, env: Option<&str>, file: DatasetSource| {
            ShardSlice::resolve(flag, count, env, &file, "job.toml")
        };
        let s = |index, count| ShardSlice { index, count };
        assert_eq!(
            r(None, None, None, src(None, None)).unwrap(),
            ShardSlice::ALL
        );
        assert_eq!(
            r(Some(1), Some(4), Some("2"), src(Some(3), Some(4))).unwrap(),
            s(1, 4)
        );
        assert_eq!(
            r(None, None, Some("2"), src(Some(3), Some(4))).unwrap(),
            s(2, 4)
        );
        assert_eq!(r(None, None, None, src(Some(3), Some(4))).unwrap(), s(3, 4));
        assert_eq!(
            r(None, Some(8), None, src(Some(3), Some(4))).unwrap(),
            s(3, 8)
        );
        // An Indexed Job whose count was not passed on: named, with the fix.
        let e = r(None, None, Some("2"), src(None, None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("job.toml")
                && e.contains("JOB_COMPLETION_INDEX=2")
                && e.contains("--shard-count"),
            "{e}"
        );
        let e = r(None, Some(2), Some("x1"), src(None, None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("JOB_COMPLETION_INDEX=\"x1\""), "{e}");
        let e = r(Some(0), Some(0), None, src(None, None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1"), "{e}");
        let e = r(Some(5), Some(5), None, src(None, None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--shard-index") && e.contains("5"), "{e}");
    }
}
