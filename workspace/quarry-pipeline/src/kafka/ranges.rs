//! Offset-range files and reconciling a partition from them: where it resumes, and the range to
//! replay when an accepted file or a claim has no rejects marker.
//!
//! ## Claims
//! Before it publishes a range, a worker claims the range's first offset: a small object
//! `topic=T/partition=P/_claim-<first>` beside the markers, created if absent, holding the range's
//! file name. Two workers that publish the same partition at once (one of them expelled from the
//! group but still running, a *zombie*) both start their next range right after the last one
//! published or claimed, so they claim the same offset, and only one claim lands. The other
//! worker publishes nothing of its range and reconciles the partition again ([`crate::flow`]).
//! A claim holding the same range is not a conflict: that is a replay, or a put whose response was
//! lost, and identical names are fenced by the files' own create-if-absent.
//!
//! Why no range can overlap another with a different first offset: every range begins right after
//! one that was claimed (or at the partition's first published offset), and claims are never
//! removed, so of two ranges that overlap, the later one's predecessor overlaps the earlier one
//! too, back to two claims on the same offset, of which only one was created. The names start with
//! `_`, which Parquet readers (pyarrow, Spark) skip in a dataset's folders.

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

/// The name of the claim on an offset range's first offset (in the rejects location).
pub fn claim_name(topic: &str, partition: i32, first: i64) -> String {
    format!(
        "{}/{CLAIM_PREFIX}{first:020}",
        partition_dir(topic, partition)
    )
}

const CLAIM_PREFIX: &str = "_claim-";

/// The first offset in a claim's name.
fn parse_claim(name: &str) -> Option<i64> {
    name.rsplit('/')
        .next()?
        .strip_prefix(CLAIM_PREFIX)?
        .parse()
        .ok()
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
    /// An accepted file or a claim without its rejects marker (a crash before the marker, or a
    /// publish under way on another worker). Its range is replayed exactly, under its name.
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
    let mut marked = Vec::new();
    let mut claims = Vec::new();
    for m in rejects.list(&dir)? {
        let name = rejects.relative(&m.location);
        if let Some((first, last)) = parse_range(&name) {
            marked.push(PublishedRange { name, first, last });
        } else if let Some(first) = parse_claim(&name) {
            claims.push((first, m.location));
        }
    }
    let highest = marked.iter().map(|r| r.last).max();
    let beyond = |first: i64| highest.is_none_or(|h| first > h);
    // Only the claims past the highest marker are read: a publish under way, or one that a crash
    // or a fenced worker left (one or two).
    let mut orphans = Vec::new();
    for (first, path) in claims.into_iter().filter(|(f, _)| beyond(*f)) {
        let held = rejects.read(&path)?;
        let name = String::from_utf8_lossy(&held).into_owned();
        match parse_range(&name) {
            Some((f, last)) if f == first && name.starts_with(&format!("{dir}/")) => {
                orphans.push(PublishedRange { name, first, last })
            }
            _ => {
                return Err(PipelineError::BadClaim {
                    claim: path.to_string(),
                    held: name,
                })
            }
        }
    }
    // A claim comes before its accepted file, so where both are there they name the same range;
    // the claim is taken first.
    for m in output.list(&dir)? {
        let name = output.relative(&m.location);
        if let Some((first, last)) = parse_range(&name).filter(|(f, _)| beyond(*f)) {
            orphans.push(PublishedRange { name, first, last });
        }
    }
    let orphan = orphans.into_iter().min_by_key(|r| r.first);
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

    #[test]
    fn a_claim_past_the_highest_marker_is_replayed_and_one_below_it_is_not_read() {
        let out = Location::open("memory://reconcile-claims/out").unwrap();
        let rej = Location::open("memory://reconcile-claims/rej").unwrap();
        let b = |s: &str| bytes::Bytes::from(s.to_string());
        rej.publish(&range_name("t", 0, 0, 9), b("x")).unwrap();
        // Below the marker: never read (it would be an error).
        rej.publish(&claim_name("t", 0, 3), b("not a range"))
            .unwrap();
        // A claim whose range has no file yet, and an accepted file after it.
        let claimed = range_name("t", 0, 10, 12);
        rej.publish(&claim_name("t", 0, 10), b(&claimed)).unwrap();
        out.publish(&range_name("t", 0, 13, 20), b("x")).unwrap();
        let r = reconcile(&out, &rej, "t", 0).unwrap();
        assert_eq!(r.resume, Some(10));
        assert_eq!(
            r.replay,
            Some(PublishedRange {
                name: claimed,
                first: 10,
                last: 12
            })
        );
        // A claim past the marker that names no range of its own offset stops the reconcile.
        rej.publish(&claim_name("t", 0, 30), b(&range_name("t", 0, 31, 40)))
            .unwrap();
        match reconcile(&out, &rej, "t", 0) {
            Err(PipelineError::BadClaim { claim, held }) => {
                assert!(claim.ends_with("_claim-00000000000000000030"), "{claim}");
                assert_eq!(held, range_name("t", 0, 31, 40));
            }
            other => panic!("expected a bad claim, got {other:?}"),
        }
    }
}
