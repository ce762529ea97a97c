//! Shards: the units of work and of output of a dataset job, and which of them are one worker's.
//!
//! A dataset job scales out with no coordinator: each of N workers lists the same input prefix
//! and takes the shards whose [`shard_hash`] falls to its index ([`ShardSlice`]). Workers never
//! talk to each other; the output's create-if-absent protocol ([`crate::flow`]) keeps every shard
//! published once even when two workers are given the same index by mistake.
//!
//! A JSONL or Parquet file larger than `split_bytes` is cut into [`Part`]s of even byte ranges,
//! each a shard of its own (`a.part-00001-of-00004.parquet`), so one large file spreads over
//! workers and a worker holds a part's records, not a whole file's. A part takes the lines, or
//! the row groups, that start in its range, so the parts of a file hold each of its documents
//! exactly once, and no listing reads more than names and sizes.

use std::collections::HashMap;
use std::ops::Range;

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
    /// The part of its one file this shard reads; `None` for whole files.
    pub part: Option<Part>,
}

/// Part `index` of `count` of one large file: the JSONL lines, or the Parquet row groups, that
/// start in `bytes` (a line or row group that starts in it is read to its end, past it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub index: usize,
    pub count: usize,
    pub bytes: Range<u64>,
}

/// Parts a file is cut into at most: a `split_bytes` far below a file's size is an error naming
/// both, never millions of shards listed.
pub const MAX_PARTS: u64 = 100_000;

/// The byte ranges a file of `size` bytes is cut into: `⌈size / split⌉` ranges of even length
/// (to a byte), in order; one range, the whole file, at or below `split` or where `split` is 0.
pub fn split_ranges(size: u64, split: u64) -> Vec<Range<u64>> {
    if split == 0 || size <= split {
        return std::iter::once(0..size).collect();
    }
    let n = size.div_ceil(split);
    let at = |k: u64| (u128::from(k) * u128::from(size) / u128::from(n)) as u64;
    (0..n).map(|k| at(k)..at(k + 1)).collect()
}

/// The name of part `index` of `count` of the shard that would be named `whole`
/// (`a.parquet` → `a.part-00001-of-00004.parquet`).
fn part_name(whole: &str, index: usize, count: usize) -> String {
    let stem = whole.strip_suffix(".parquet").unwrap_or(whole);
    format!("{stem}.part-{index:05}-of-{count:05}.parquet")
}

/// The whole-file name and part count a shard name says (`a.part-00001-of-00004.parquet` →
/// (`a.parquet`, 4)); a name that is not a part's is its own whole name, of 1 part.
fn split_of(name: &str) -> (String, usize) {
    let parsed = name
        .strip_suffix(".parquet")
        .and_then(|n| n.rsplit_once(".part-"))
        .and_then(|(stem, tail)| {
            let (k, n) = tail.split_once("-of-")?;
            let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
            (all_digits(k) && all_digits(n))
                .then(|| n.parse().ok())
                .flatten()
                .map(|n| (format!("{stem}.parquet"), n))
        });
    parsed.unwrap_or_else(|| (name.to_string(), 1))
}

/// Checks that the shards published already (`published`, names relative to the rejects
/// prefix) cut each file as `shards` do: a file cut into other parts before (`split_bytes`
/// changed, or the file) would have its documents published twice, or some never.
pub fn check_splits<'a>(
    input: &Location,
    shards: &[Shard],
    published: impl IntoIterator<Item = &'a str>,
) -> Result<(), PipelineError> {
    let names: std::collections::HashSet<&str> = shards.iter().map(|s| s.name.as_str()).collect();
    let mut now: HashMap<String, (usize, &Path)> = HashMap::new();
    for s in shards {
        let (whole, count) = split_of(&s.name);
        now.insert(whole, (count, &s.files[0]));
    }
    for name in published {
        if names.contains(name) {
            continue;
        }
        let (whole, was) = split_of(name);
        if let Some(&(count, file)) = now.get(&whole).filter(|(c, _)| *c != was) {
            return Err(PipelineError::Input {
                location: input.url.clone(),
                source: InputProblem::SplitChanged {
                    file: input.relative(file),
                    published: name.to_string(),
                    was,
                    now: count,
                },
            });
        }
    }
    Ok(())
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
    // A file's shards: itself, or its parts where it is larger than `split_bytes` and can be cut.
    let one_file = |name: String, m: object_store::ObjectMeta, split: u64| {
        if split > 0 && m.size.div_ceil(split) > MAX_PARTS {
            return Err(PipelineError::Input {
                location: input.url.clone(),
                source: InputProblem::TooManyParts {
                    file: input.relative(&m.location),
                    size: m.size,
                    split,
                    most: MAX_PARTS,
                },
            });
        }
        let ranges = split_ranges(m.size, split);
        let count = ranges.len();
        let whole = count == 1;
        let shards = ranges
            .into_iter()
            .enumerate()
            .map(|(index, bytes)| Shard {
                name: if whole {
                    name.clone()
                } else {
                    part_name(&name, index, count)
                },
                files: vec![m.location.clone()],
                sizes: vec![m.size],
                part: (!whole).then_some(Part {
                    index,
                    count,
                    bytes,
                }),
            })
            .collect::<Vec<_>>();
        Ok(shards)
    };
    let shards: Vec<Shard> = match src.format {
        InputFormat::Jsonl => visible
            .into_iter()
            .filter_map(|m| {
                let rel = input.relative(&m.location);
                let (codec, plain) = Codec::of_jsonl(&rel)?;
                // A compressed stream has no place to start reading but its first byte.
                let split = if codec == Codec::Plain {
                    src.split_bytes
                } else {
                    0
                };
                Some(one_file(renamed(plain), m, split))
            })
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect(),
        InputFormat::Parquet => visible
            .into_iter()
            .filter(|m| m.location.extension() == Some("parquet"))
            .map(|m| one_file(renamed(&input.relative(&m.location)), m, src.split_bytes))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect(),
        InputFormat::Text => visible
            .chunks(src.text_shard_files)
            .enumerate()
            .map(|(k, chunk)| Shard {
                name: format!("text-{k:06}.parquet"),
                files: chunk.iter().map(|m| m.location.clone()).collect(),
                sizes: chunk.iter().map(|m| m.size).collect(),
                part: None,
            })
            .collect(),
    };
    let inputs: usize = shards
        .iter()
        .filter(|s| s.part.as_ref().is_none_or(|p| p.index == 0))
        .map(|s| s.files.len())
        .sum();
    if inputs < seen {
        tracing::warn!(
            input = %input.url,
            format = ?src.format,
            skipped = seen - inputs,
            "files under the input that are not inputs of this format are left out"
        );
    }
    // By whole-file name, so that the parts of `a.jsonl` and a whole `a.jsonl.gz` are caught too.
    let mut names = HashMap::new();
    for s in &shards {
        let (whole, _) = split_of(&s.name);
        match names.insert(whole.clone(), &s.files[0]) {
            Some(first) if first != &s.files[0] => {
                return Err(PipelineError::Input {
                    location: input.url.clone(),
                    source: InputProblem::SameShardName {
                        name: whole,
                        first: input.relative(first),
                        second: input.relative(&s.files[0]),
                    },
                });
            }
            _ => {}
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
            split_bytes: crate::config::DEFAULT_SPLIT_BYTES,
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
    fn split_ranges_cover_the_file_once_in_even_ranges() {
        let whole = |size: u64| vec![(0, size)];
        let pairs = |r: Vec<Range<u64>>| -> Vec<(u64, u64)> {
            r.into_iter().map(|r| (r.start, r.end)).collect()
        };
        assert_eq!(pairs(split_ranges(10, 0)), whole(10));
        assert_eq!(pairs(split_ranges(10, 10)), whole(10));
        assert_eq!(pairs(split_ranges(0, 4)), whole(0));
        for (size, split) in [
            (11u64, 10u64),
            (100, 7),
            (1 << 40, 3 << 28),
            (u64::MAX, 1 << 60),
        ] {
            let r = split_ranges(size, split);
            assert_eq!(r.len() as u64, size.div_ceil(split), "{size} by {split}");
            assert_eq!((r[0].start, r[r.len() - 1].end), (0, size));
            assert!(r.windows(2).all(|w| w[0].end == w[1].start));
            let lens: Vec<u64> = r.iter().map(|r| r.end - r.start).collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(
                hi - lo <= 1 && *hi <= split,
                "{size} by {split}: {lo}..{hi}"
            );
        }
    }

    #[test]
    fn files_over_split_bytes_are_cut_into_named_parts_but_compressed_ones_are_not() {
        let input = Location::open("memory://shard-parts/in").unwrap();
        for (name, size) in [
            ("big.jsonl", 25),
            ("small.jsonl", 10),
            ("big.jsonl.gz", 25),
            ("dir/big.parquet", 21),
        ] {
            input.publish(name, vec![b'x'; size].into()).unwrap();
        }
        let mut jsonl = src(None, None);
        jsonl.split_bytes = 10;
        let mut parquet = jsonl.clone();
        parquet.format = InputFormat::Parquet;
        let listed = |src: &DatasetSource| -> Vec<(String, Option<Part>)> {
            let got = shards(&input, src).unwrap();
            got.into_iter().map(|s| (s.name, s.part)).collect()
        };
        let part = |index, count, bytes| {
            Some(Part {
                index,
                count,
                bytes,
            })
        };
        assert_eq!(
            listed(&parquet),
            [
                (
                    "dir/big.part-00000-of-00003.parquet".into(),
                    part(0, 3, 0..7)
                ),
                (
                    "dir/big.part-00001-of-00003.parquet".into(),
                    part(1, 3, 7..14)
                ),
                (
                    "dir/big.part-00002-of-00003.parquet".into(),
                    part(2, 3, 14..21)
                ),
            ]
        );
        // big.jsonl's parts and big.jsonl.gz would share a name: an error, cut or not.
        for split in [10, 0] {
            jsonl.split_bytes = split;
            let e = shards(&input, &jsonl).unwrap_err().to_string();
            assert!(e.contains("big.jsonl and big.jsonl.gz would both"), "{e}");
        }
        jsonl.split_bytes = 10;
        let input = Location::open("memory://shard-parts2/in").unwrap();
        for (name, size) in [("big.jsonl", 25), ("small.jsonl", 10), ("z.jsonl.gz", 25)] {
            input.publish(name, vec![b'x'; size].into()).unwrap();
        }
        let got: Vec<(String, Option<Part>)> = shards(&input, &jsonl)
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.part))
            .collect();
        assert_eq!(
            got,
            [
                ("big.part-00000-of-00003.parquet".into(), part(0, 3, 0..8)),
                ("big.part-00001-of-00003.parquet".into(), part(1, 3, 8..16)),
                ("big.part-00002-of-00003.parquet".into(), part(2, 3, 16..25)),
                ("small.parquet".into(), None),
                ("z.parquet".into(), None),
            ]
        );
        jsonl.split_bytes = 0;
        let whole = shards(&input, &jsonl).unwrap();
        assert_eq!(whole.len(), 3);
        assert!(whole.iter().all(|s| s.part.is_none()));
        // A split far below a file's size is an error, not millions of shards.
        let huge = Location::open("memory://shard-parts3/in").unwrap();
        huge.publish("big.jsonl", vec![b'x'; 200_001].into())
            .unwrap();
        jsonl.split_bytes = 2;
        let e = shards(&huge, &jsonl).unwrap_err().to_string();
        assert!(
            e.contains("big.jsonl (200001 bytes) would be cut into more than 100000 parts at split_bytes = 2"),
            "{e}"
        );
        jsonl.split_bytes = 3;
        assert_eq!(shards(&huge, &jsonl).unwrap().len(), 66_667);
    }

    #[test]
    fn a_file_published_in_other_parts_before_is_an_error_naming_it() {
        let input = Location::open("memory://shard-resplit/in").unwrap();
        input.publish("big.jsonl", vec![b'x'; 25].into()).unwrap();
        input
            .publish("text-000001.jsonl", vec![b'x'; 5].into())
            .unwrap();
        // An input whose own name reads like a part's is its own whole shard.
        input
            .publish("odd.part-00001-of-00009.jsonl", vec![b'x'; 5].into())
            .unwrap();
        let mut s = src(None, None);
        let listed = |split: u64, s: &mut DatasetSource| {
            s.split_bytes = split;
            shards(&input, s).unwrap()
        };
        let three = listed(10, &mut s);
        let names =
            |shards: &[Shard]| -> Vec<String> { shards.iter().map(|s| s.name.clone()).collect() };
        let published = names(&three);
        let check = |now: &[Shard], published: &[String]| {
            check_splits(&input, now, published.iter().map(String::as_str))
        };
        // The same cut, part of it published, or nothing published: fine.
        check(&three, &published).unwrap();
        check(&three, &published[..1]).unwrap();
        check(&three, &[]).unwrap();
        for (split, was, now) in [(5, 3, 5), (0, 3, 1)] {
            let e = check(&listed(split, &mut s), &published[..1])
                .unwrap_err()
                .to_string();
            let want = format!(
                "big.jsonl was cut into {was} part(s) by an earlier run \
                 (big.part-00000-of-00003.parquet is published) and into {now} now"
            );
            assert!(e.contains(&want), "{e}");
        }
        // Published whole, cut now.
        let whole = listed(0, &mut s);
        let e = check(&three, &names(&whole)).unwrap_err().to_string();
        assert!(
            e.contains(
                "cut into 1 part(s) by an earlier run (big.parquet is published) and into 3 now"
            ),
            "{e}"
        );
        assert_eq!(
            split_of("a.part-00002-of-00010.parquet"),
            ("a.parquet".into(), 10)
        );
        assert_eq!(
            split_of("a.part-x-of-00010.parquet"),
            ("a.part-x-of-00010.parquet".into(), 1)
        );
        assert_eq!(
            split_of("text-000001.parquet"),
            ("text-000001.parquet".into(), 1)
        );
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
