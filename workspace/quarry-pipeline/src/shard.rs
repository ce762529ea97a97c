//! Shards: the units of work and of output of a dataset job, and which of them are one worker's.
//!
//! A dataset job scales out with no coordinator: each of N workers lists the same input prefix
//! and takes the shards whose [`shard_hash`] falls to its index ([`ShardSlice`]). Workers never
//! talk to each other; the output's create-if-absent protocol ([`crate::flow`]) keeps every shard
//! published once even when two workers are given the same index by mistake.

use object_store::path::Path;
use sha2::{Digest, Sha256};

use crate::config::{DatasetSource, InputFormat};
use crate::error::PipelineError;
use crate::store::Location;

/// A unit of work and of output: one output file name and the input objects it reads.
#[derive(Debug, Clone)]
pub struct Shard {
    pub name: String,
    pub files: Vec<Path>,
    /// Each file's size in bytes, as the listing gave it.
    pub sizes: Vec<u64>,
}

/// Lists the shards of a dataset, in name order.
pub fn shards(input: &Location, src: &DatasetSource) -> Result<Vec<Shard>, PipelineError> {
    let objects = input.list("")?;
    let visible = objects.into_iter().filter(|m| {
        let rel = input.relative(&m.location);
        !rel.split('/')
            .any(|part| part.starts_with('.') || part.starts_with('_'))
    });
    let with_ext = |p: &Path, exts: &[&str]| p.extension().is_some_and(|e| exts.contains(&e));
    let renamed = |p: &Path| {
        let rel = input.relative(p);
        match rel.rsplit_once('.') {
            Some((stem, _)) => format!("{stem}.parquet"),
            None => format!("{rel}.parquet"),
        }
    };
    Ok(match src.format {
        InputFormat::Jsonl => visible
            .filter(|m| with_ext(&m.location, &["jsonl", "ndjson", "json"]))
            .map(|m| Shard {
                name: renamed(&m.location),
                files: vec![m.location],
                sizes: vec![m.size],
            })
            .collect(),
        InputFormat::Parquet => visible
            .filter(|m| with_ext(&m.location, &["parquet"]))
            .map(|m| Shard {
                name: renamed(&m.location),
                files: vec![m.location],
                sizes: vec![m.size],
            })
            .collect(),
        InputFormat::Text => {
            let files: Vec<_> = visible.collect();
            files
                .chunks(src.text_shard_files)
                .enumerate()
                .map(|(k, chunk)| Shard {
                    name: format!("text-{k:06}.parquet"),
                    files: chunk.iter().map(|m| m.location.clone()).collect(),
                    sizes: chunk.iter().map(|m| m.size).collect(),
                })
                .collect()
        }
    })
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
