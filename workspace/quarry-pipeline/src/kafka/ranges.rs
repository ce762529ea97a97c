//! Offset-range files and reconciling a partition from them: where it resumes, and the range to
//! replay when an accepted file has no rejects marker.

use crate::error::PipelineError;
use crate::store::Location;

/// The file name of an offset range.
pub fn range_name(topic: &str, partition: i32, first: i64, last: i64) -> String {
    format!(
        "{}/{first:020}-{last:020}.parquet",
        partition_dir(topic, partition)
    )
}

pub fn partition_dir(topic: &str, partition: i32) -> String {
    format!("topic={topic}/partition={partition}")
}

/// The (first, last) offsets in a range file's name.
pub fn parse_range(name: &str) -> Option<(i64, i64)> {
    let file = name.rsplit('/').next()?;
    let stem = file.strip_suffix(".parquet")?;
    let (a, b) = stem.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// A published file's offset range, by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedRange {
    /// The file's name under the output and rejects prefixes.
    pub name: String,
    pub first: i64,
    pub last: i64,
}

/// Where a partition resumes, from what is published.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    /// The first offset not yet published; `None` when nothing is (use the committed offset).
    pub resume: Option<i64>,
    /// An accepted file without its rejects marker. Its range is replayed exactly, under its
    /// name.
    pub replay: Option<PublishedRange>,
}

/// Reads a partition's published files.
pub fn reconcile(
    output: &Location,
    rejects: &Location,
    topic: &str,
    partition: i32,
) -> Result<Reconciled, PipelineError> {
    let dir = partition_dir(topic, partition);
    let ranges = |loc: &Location| -> Result<Vec<PublishedRange>, PipelineError> {
        Ok(loc
            .list(&dir)?
            .iter()
            .filter_map(|m| {
                let name = loc.relative(&m.location);
                parse_range(&name).map(|(first, last)| PublishedRange { name, first, last })
            })
            .collect())
    };
    let marked = ranges(rejects)?;
    let highest = marked.iter().map(|r| r.last).max();
    let orphan = ranges(output)?
        .into_iter()
        .filter(|r| highest.is_none_or(|h| r.first > h))
        .min_by_key(|r| r.first);
    let resume = match (&orphan, highest) {
        (_, Some(h)) => Some(h + 1),
        (Some(r), None) => Some(r.first),
        (None, None) => None,
    };
    Ok(Reconciled {
        resume,
        replay: orphan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_names_round_trip_and_sort_by_offset() {
        let a = range_name("docs", 3, 0, 99);
        let b = range_name("docs", 3, 100, 1000);
        assert!(a < b);
        assert_eq!(parse_range(&b), Some((100, 1000)));
    }

    #[test]
    fn reconcile_resumes_after_the_marker_and_replays_an_orphan() {
        let out = Location::open("memory://reconcile/out").unwrap();
        let rej = Location::open("memory://reconcile/rej").unwrap();
        assert_eq!(
            reconcile(&out, &rej, "t", 0).unwrap(),
            Reconciled {
                resume: None,
                replay: None
            }
        );
        let b = || bytes::Bytes::from_static(b"x");
        out.publish(&range_name("t", 0, 0, 9), b()).unwrap();
        rej.publish(&range_name("t", 0, 0, 9), b()).unwrap();
        out.publish(&range_name("t", 0, 10, 14), b()).unwrap();
        let r = reconcile(&out, &rej, "t", 0).unwrap();
        assert_eq!(r.resume, Some(10));
        assert_eq!(
            r.replay,
            Some(PublishedRange {
                name: range_name("t", 0, 10, 14),
                first: 10,
                last: 14
            })
        );
        // Other partitions are independent.
        assert_eq!(reconcile(&out, &rej, "t", 1).unwrap().resume, None);
    }
}
