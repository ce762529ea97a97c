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
    /// The published range (with its rejects marker) that ends last: where the next reconcile of
    /// this partition can start ([`reconcile`]'s `from`).
    pub marked: Option<(i64, i64)>,
    /// The first offset the listings started at (`None`: the partition's whole folders).
    pub listed_from: Option<i64>,
    /// Objects the listings returned.
    pub listed: usize,
}

/// Where a partition's reconcile may start listing, from what the group committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFrom {
    /// The range `first..=last` the group's last commit names ([`commit_metadata`]): listed from
    /// `first` on when its rejects marker is there.
    Range(i64, i64),
    /// A committed offset whose commit names no range (a broker that drops commits' metadata, as
    /// tansu 0.6 does; offsets set by another tool): the markers are looked for `window` offsets
    /// before it (a file's most documents), then 4, 16, … times as far back, and listed from
    /// where the first is found.
    Before { offset: i64, window: i64 },
}

/// The first offsets [`ListFrom::Before`]'s look-backs start at: `window` before `offset`, then 4,
/// 16, … times as far, down to 0.
fn look_backs(offset: i64, window: i64) -> impl Iterator<Item = i64> {
    let mut back = Some(window.max(1));
    std::iter::from_fn(move || {
        let b = back?;
        let lo = offset.saturating_sub(b).max(0);
        back = (lo > 0).then(|| b.saturating_mul(4));
        Some(lo)
    })
}

/// Reads a partition's published files.
///
/// `from` says where the names may be listed from ([`ListFrom`]): from the first offset of a
/// range with a rejects marker, only the names from that offset on are listed. Ranges never
/// overlap, so every earlier range ends before that one and cannot change where the partition
/// resumes, and every later one is listed. The answer is the same as from the whole folders,
/// whose listing grows with the partition's history (three objects a range: the accepted file,
/// its marker and its claim). Where no marker is found that way (no commit yet, offsets reset by
/// hand, or a store that does not list in key order, where a bounded listing reads every name
/// anyway), the whole folders are listed.
pub fn reconcile(
    output: &Location,
    rejects: &Location,
    topic: &str,
    partition: i32,
    from: Option<ListFrom>,
) -> Result<Reconciled, PipelineError> {
    let dir = partition_dir(topic, partition);
    // Range names sort by their first offset and before the claims (`_` follows the digits), so
    // the markers from an offset on are the names from it up to the claims.
    let name_at = |first: i64| format!("{dir}/{first:020}");
    let claims_start = format!("{dir}/{CLAIM_PREFIX}");
    // Markers from the start found on, where a look-back already listed them.
    let mut probed = Vec::new();
    let start = match from {
        // A store error here lists the whole folders, whose listing retries: slower, never wrong.
        Some(ListFrom::Range(first, last)) => rejects
            .exists(&range_name(topic, partition, first, last))
            .unwrap_or(false)
            .then_some(first),
        Some(ListFrom::Before { offset, window }) if rejects.sorted_lists => {
            let mut found = None;
            for lo in look_backs(offset, window) {
                // The markers from `lo` on (the last look-back found none from its start on, so
                // this lists the ones before it, one request where there are few).
                probed = rejects.list_between(&dir, &name_at(lo), Some(&claims_start))?;
                if !probed.is_empty() {
                    found = Some(lo);
                    break;
                }
            }
            found
        }
        _ => None,
    };
    let (listed_rejects, listed_output) = match start {
        Some(first) => {
            let mut rejected = if probed.is_empty() {
                rejects.list_between(&dir, &name_at(first), Some(&claims_start))?
            } else {
                std::mem::take(&mut probed)
            };
            // The claims after `first`'s: a marker starts at or after `first`, so `first`'s claim
            // is at or below the highest marker, where claims are not read.
            rejected.extend(rejects.list_between(
                &dir,
                &claim_name(topic, partition, first),
                None,
            )?);
            (rejected, output.list_between(&dir, &name_at(first), None)?)
        }
        None => (rejects.list(&dir)?, output.list(&dir)?),
    };
    let listed = listed_rejects.len() + listed_output.len();
    let mut marked: Vec<PublishedRange> = Vec::new();
    let mut claims = Vec::new();
    for m in listed_rejects {
        let name = rejects.relative(&m.location);
        if let Some((first, last)) = parse_range(&name) {
            marked.push(PublishedRange { name, first, last });
        } else if let Some(first) = parse_claim(&name) {
            claims.push((first, m.location));
        }
    }
    let last_marked = marked
        .iter()
        .max_by_key(|r| r.last)
        .map(|r| (r.first, r.last));
    let highest = last_marked.map(|(_, last)| last);
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
    for m in listed_output {
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
        marked: last_marked,
        listed_from: start,
        listed,
    })
}

/// What a commit carries beside the offset after the range `first..=last`: the range's first
/// offset, so that whoever reconciles the partition next starts its listing there
/// ([`reconcile`]'s `from`). Kafka keeps it with the offset (`offset.metadata.max.bytes`, 4 KiB
/// by default).
pub fn commit_metadata(first: i64) -> String {
    format!("{COMMIT_METADATA_PREFIX}{first}")
}

const COMMIT_METADATA_PREFIX: &str = "quarry range from ";

/// The range a committed offset and its metadata name, if a quarry worker made the commit:
/// `None` for metadata from another tool, or an offset that does not follow the range's first.
pub fn committed_range(offset: i64, metadata: &str) -> Option<(i64, i64)> {
    let first: i64 = metadata
        .strip_prefix(COMMIT_METADATA_PREFIX)?
        .parse()
        .ok()?;
    (first >= 0 && first < offset).then_some((first, offset - 1))
}

/// Where a partition's reconcile lists from, given the group's committed offset and the commit's
/// metadata: the range the metadata names, else the markers before the offset, looked for from
/// `window` offsets before it on (the job's most documents a file). Nothing committed, or offset
/// 0: the whole folders.
pub fn list_from(offset: i64, metadata: &str, window: i64) -> Option<ListFrom> {
    match committed_range(offset, metadata) {
        Some((first, last)) => Some(ListFrom::Range(first, last)),
        None => (offset > 0).then_some(ListFrom::Before { offset, window }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

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
        let empty = reconcile(&out, &rej, "t", 0, None).unwrap();
        assert_eq!(
            (empty.resume, empty.replay, empty.marked),
            (None, None, None)
        );
        let b = || bytes::Bytes::from_static(b"x");
        out.publish(&range_name("t", 0, 0, 9), b()).unwrap();
        rej.publish(&range_name("t", 0, 0, 9), b()).unwrap();
        out.publish(&range_name("t", 0, 10, 14), b()).unwrap();
        let r = reconcile(&out, &rej, "t", 0, None).unwrap();
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
        assert_eq!(reconcile(&out, &rej, "t", 1, None).unwrap().resume, None);
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
        let r = reconcile(&out, &rej, "t", 0, None).unwrap();
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
        match reconcile(&out, &rej, "t", 0, None) {
            Err(PipelineError::BadClaim { claim, held }) => {
                assert!(claim.ends_with("_claim-00000000000000000030"), "{claim}");
                assert_eq!(held, range_name("t", 0, 31, 40));
            }
            other => panic!("expected a bad claim, got {other:?}"),
        }
    }

    /// A partition's history of `ranges` ranges of 3 offsets each, all published (accepted file,
    /// marker, claim), then one claimed range without a file and one accepted file without its
    /// marker: what a crash and a zombie leave.
    fn history(out: &Location, rej: &Location, ranges: i64) {
        let b = |s: &str| bytes::Bytes::from(s.to_string());
        for i in 0..ranges {
            let name = range_name("t", 0, 3 * i, 3 * i + 2);
            rej.publish(&claim_name("t", 0, 3 * i), b(&name)).unwrap();
            out.publish(&name, b("x")).unwrap();
            rej.publish(&name, b("x")).unwrap();
        }
        let n = 3 * ranges;
        let claimed = range_name("t", 0, n, n + 4);
        rej.publish(&claim_name("t", 0, n), b(&claimed)).unwrap();
        out.publish(&range_name("t", 0, n + 5, n + 9), b("x"))
            .unwrap();
    }

    /// An output and a rejects location in memory (listed in key order) and in a fresh local
    /// folder (not), and that folder, to remove at the end.
    fn two_stores(tag: &str) -> (std::path::PathBuf, [(Location, Location); 2]) {
        let dir = std::env::temp_dir().join(format!("quarry-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let open = |url: String| Location::open(&url).unwrap();
        let local = |sub: &str| open(dir.join(sub).to_str().unwrap().to_string());
        let stores = [
            (
                open(format!("memory://{tag}/out")),
                open(format!("memory://{tag}/rej")),
            ),
            (local("out"), local("rej")),
        ];
        (dir, stores)
    }

    /// Started at any published range, a reconcile answers what the whole folders answer and
    /// lists only the names from that range on; on a store that lists in key order (in memory)
    /// and on one that does not (a local folder). A range that is not published (no marker)
    /// lists the whole folders.
    #[test]
    fn a_reconcile_from_a_published_range_answers_as_the_whole_folder_and_lists_less() {
        let (dir, stores) = two_stores("reconcile-from");
        let ranges = 40;
        for (out, rej) in &stores {
            history(out, rej, ranges);
            let counted = |l: &Location| {
                let s = Arc::new(crate::faults::FaultyStore::new(l.store.clone(), 0, false));
                (l.clone().with_store(s.clone()), s)
            };
            let (out, out_seen) = counted(out);
            let (rej, rej_seen) = counted(rej);
            let whole = reconcile(&out, &rej, "t", 0, None).unwrap();
            let n = 3 * ranges;
            assert_eq!(whole.resume, Some(n));
            assert_eq!(
                whole.replay.as_ref().map(|r| (r.first, r.last)),
                Some((n, n + 4))
            );
            assert_eq!(whole.marked, Some((n - 3, n - 1)));
            assert_eq!(
                (whole.listed_from, whole.listed),
                (None, 3 * ranges as usize + 2)
            );
            for i in [0, 1, 17, ranges - 1] {
                let first = 3 * i;
                let listed_before = out_seen.objects_listed.load(Ordering::SeqCst)
                    + rej_seen.objects_listed.load(Ordering::SeqCst);
                let from =
                    reconcile(&out, &rej, "t", 0, Some(ListFrom::Range(first, first + 2))).unwrap();
                assert_eq!(
                    (&from.resume, &from.replay, &from.marked),
                    (&whole.resume, &whole.replay, &whole.marked),
                    "from range {i}"
                );
                assert_eq!(from.listed_from, Some(first));
                // From range i on: ranges - i accepted files and markers, the claims after i's,
                // the claimed range and the accepted file without a marker.
                let expected = 3 * (ranges - i) as usize - 1 + 2;
                assert_eq!(from.listed, expected, "from range {i}");
                let listed = out_seen.objects_listed.load(Ordering::SeqCst)
                    + rej_seen.objects_listed.load(Ordering::SeqCst)
                    - listed_before;
                if rej.sorted_lists {
                    // The store handed out those names only, and the first claim, past the
                    // markers' bound, which ended that listing.
                    assert_eq!(listed, expected + 1, "from range {i}");
                } else {
                    assert!(listed >= expected, "from range {i}: {listed}");
                }
            }
            // A range that was never published: the whole folders again.
            let stale = reconcile(&out, &rej, "t", 0, Some(ListFrom::Range(1, 2))).unwrap();
            assert_eq!((stale.listed_from, stale.listed), (None, whole.listed));
            assert_eq!((stale.resume, stale.replay), (whole.resume, whole.replay));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// From a committed offset alone (a broker that keeps no metadata), the markers are looked
    /// for before it, further back each time none is found: the answer is the whole folders',
    /// and on a store that lists in key order only the names from the first look-back that finds
    /// one are listed.
    #[test]
    fn a_reconcile_from_a_committed_offset_looks_back_for_a_marker() {
        let (dir, stores) = two_stores("look-back");
        let ranges = 40;
        let n = 3 * ranges;
        for (out, rej) in &stores {
            history(out, rej, ranges);
            let whole = reconcile(out, rej, "t", 0, None).unwrap();
            // (committed offset, window) → where the listing starts on a sorted store.
            for (offset, window, start) in [
                // The last range's end committed, the window a range: its first offset.
                (n, 3, Some(n - 3)),
                // A window of one offset: looked back 1, then 4 (offsets n-1, then n-4).
                (n, 1, Some(n - 4)),
                // A committed offset far past the history (reset by hand): 1,000 then 4,000
                // back, 0 in the end.
                (n + 4000, 1000, Some(0)),
                // A commit from the first range on: the whole history after it.
                (3, 3, Some(0)),
                // An offset inside the claimed range: nothing marked from 2 back on (the claimed
                // range has no marker), then 8 back: the last two ranges.
                (n + 2, 2, Some(n - 6)),
            ] {
                let from =
                    reconcile(out, rej, "t", 0, Some(ListFrom::Before { offset, window })).unwrap();
                assert_eq!(
                    (&from.resume, &from.replay, &from.marked),
                    (&whole.resume, &whole.replay, &whole.marked),
                    "offset {offset}, window {window}"
                );
                if rej.sorted_lists {
                    assert_eq!(from.listed_from, start, "offset {offset}, window {window}");
                    // The markers from the start on, the claims after its, the accepted files
                    // from it on.
                    let lo = start.unwrap();
                    let marked = (ranges - (lo + 2) / 3) as usize; // first ≥ lo
                    let claims = (ranges - lo / 3) as usize; // after lo's, and the claimed range's
                    assert_eq!(
                        from.listed,
                        marked + claims + marked + 1,
                        "offset {offset}, window {window}"
                    );
                } else {
                    assert_eq!((from.listed_from, from.listed), (None, whole.listed));
                }
            }
        }
        // Nothing published: every look-back finds nothing, and the whole (empty) folders answer.
        let (out, rej) = &stores[0];
        let none = reconcile(
            out,
            rej,
            "t",
            7,
            Some(ListFrom::Before {
                offset: 100_000,
                window: 10,
            }),
        )
        .unwrap();
        assert_eq!(
            (none.resume, none.listed_from, none.listed),
            (None, None, 0)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn look_backs_go_four_times_as_far_each_time_down_to_zero() {
        assert_eq!(look_backs(100, 3).collect::<Vec<_>>(), [97, 88, 52, 0]);
        assert_eq!(look_backs(5, 10).collect::<Vec<_>>(), [0]);
        assert_eq!(look_backs(0, 10).collect::<Vec<_>>(), [0]);
        assert_eq!(look_backs(9, 0).collect::<Vec<_>>(), [8, 5, 0]);
        assert_eq!(look_backs(i64::MAX, i64::MAX / 2).count(), 2);
    }

    #[test]
    fn a_commit_without_its_range_lists_from_before_its_offset() {
        assert_eq!(
            list_from(10, &commit_metadata(4), 100),
            Some(ListFrom::Range(4, 9))
        );
        assert_eq!(
            list_from(10, "", 100),
            Some(ListFrom::Before {
                offset: 10,
                window: 100
            })
        );
        // A range that does not end before the offset: the offset is what is known.
        assert_eq!(
            list_from(4, &commit_metadata(4), 2),
            Some(ListFrom::Before {
                offset: 4,
                window: 2
            })
        );
        assert_eq!(list_from(0, "", 100), None);
    }

    #[test]
    fn a_commits_metadata_names_its_range_and_anything_else_names_none() {
        assert_eq!(committed_range(10, &commit_metadata(4)), Some((4, 9)));
        assert_eq!(committed_range(5, &commit_metadata(4)), Some((4, 4)));
        // The offset does not follow the range's first (reset by hand): no range.
        assert_eq!(committed_range(4, &commit_metadata(4)), None);
        assert_eq!(committed_range(3, &commit_metadata(4)), None);
        for other in [
            "",
            "4",
            "quarry range from x",
            "quarry range from -1",
            "{\"a\":1}",
        ] {
            assert_eq!(committed_range(10, other), None, "{other:?}");
        }
    }
}
