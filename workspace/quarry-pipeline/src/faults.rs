//! Fault injection for the crash and store-failure tests: crash points and [`FaultyStore`].
//! Compiled only with the `test-support` feature, which `make test` turns on through the
//! dev-dependencies; a release build carries none of it (a crash point is then an empty inline
//! function).
//!
//! Crash points: with `QUARRY_CRASH_AT=<point>` (and optionally `QUARRY_CRASH_AFTER=<n>`, default
//! 0) in the environment of a `quarry` process ([`arm_from`]), it SIGKILLs itself the (n+1)-th
//! time it reaches that [`CrashPoint`]; with `QUARRY_CRASH_SIGNAL=stop` it SIGSTOPs itself there
//! instead, and goes on from there when the test sends SIGCONT (a worker that stalls past its
//! session and wakes up a zombie).

/// Where a test may kill the process, in the order a file goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Every document of a Kafka range has its outcome; its first offset is not claimed yet.
    BeforeClaim,
    /// Every document of a file has its outcome; nothing is published.
    BeforePublish,
    /// Half of a file's row groups are encoded.
    MidWrite,
    /// The accepted part is published, the rejects marker is not.
    BetweenFiles,
    /// Published, the Kafka offset not committed.
    BeforeCommit,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 5] = [
        CrashPoint::BeforeClaim,
        CrashPoint::BeforePublish,
        CrashPoint::MidWrite,
        CrashPoint::BetweenFiles,
        CrashPoint::BeforeCommit,
    ];

    /// The name `QUARRY_CRASH_AT` gives it.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::BeforeClaim => "before_claim",
            CrashPoint::BeforePublish => "before_publish",
            CrashPoint::MidWrite => "mid_write",
            CrashPoint::BetweenFiles => "between_files",
            CrashPoint::BeforeCommit => "before_commit",
        }
    }
}

/// Kills the process here if [`arm_from`] armed this point.
#[inline]
pub fn crash_point(point: CrashPoint) {
    #[cfg(feature = "test-support")]
    armed::reached(point);
    #[cfg(not(feature = "test-support"))]
    let _ = point;
}

/// Arms a crash point from `get`'s `QUARRY_CRASH_AT` (a [`CrashPoint::name`]) and
/// `QUARRY_CRASH_AFTER` (default 0): the binary passes its environment once at start-up, so the
/// crash tests can kill a real `quarry` process. Without the `test-support` feature nothing is
/// read or armed. The error names a bad value.
pub fn arm_from(get: impl Fn(&str) -> Option<String>) -> Result<(), BadFaultVariable> {
    #[cfg(feature = "test-support")]
    {
        let Some(name) = get("QUARRY_CRASH_AT") else {
            return Ok(());
        };
        let point = CrashPoint::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| BadFaultVariable {
                variable: "QUARRY_CRASH_AT",
                value: name.clone(),
                expected:
                    "one of before_claim, before_publish, mid_write, between_files, before_commit",
            })?;
        let stop = match get("QUARRY_CRASH_SIGNAL").as_deref() {
            None | Some("kill") => false,
            Some("stop") => true,
            Some(other) => {
                return Err(BadFaultVariable {
                    variable: "QUARRY_CRASH_SIGNAL",
                    value: other.to_string(),
                    expected: "kill or stop",
                })
            }
        };
        let after = match get("QUARRY_CRASH_AFTER") {
            None => 0,
            Some(n) => n.trim().parse().map_err(|_| BadFaultVariable {
                variable: "QUARRY_CRASH_AFTER",
                value: n.clone(),
                expected: "a count",
            })?,
        };
        let _ = armed::ARMED.set((point, after, stop));
    }
    #[cfg(not(feature = "test-support"))]
    let _ = get;
    Ok(())
}

/// A fault-injection variable [`arm_from`] cannot read: which, its value, what it accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable} is `{value}`: expected {expected}")]
pub struct BadFaultVariable {
    pub variable: &'static str,
    pub value: String,
    pub expected: &'static str,
}

#[cfg(feature = "test-support")]
mod armed {
    use super::CrashPoint;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// The point [`super::arm_from`] armed, how many times it is passed before it kills, and
    /// whether it stops the process instead.
    pub(super) static ARMED: OnceLock<(CrashPoint, usize, bool)> = OnceLock::new();

    pub(super) fn reached(point: CrashPoint) {
        static HITS: AtomicUsize = AtomicUsize::new(0);
        let Some(&(armed, after, stop)) = ARMED.get() else {
            return;
        };
        if armed != point {
            return;
        }
        if HITS.fetch_add(1, Ordering::SeqCst) == after {
            use signal_hook::consts::{SIGKILL, SIGSTOP};
            let (signal, name) = if stop {
                (SIGSTOP, "SIGSTOP")
            } else {
                (SIGKILL, "SIGKILL")
            };
            eprintln!("quarry: crash point {} reached; {name}", point.name());
            let _ = signal_hook::low_level::raise(signal);
        }
    }
}

#[cfg(feature = "test-support")]
pub use store::{check_publish_protocol, FaultyStore};

#[cfg(feature = "test-support")]
mod store {
    use std::fmt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use futures::stream::BoxStream;
    use object_store::path::Path;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
        PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };

    use crate::store::{Location, Published};
    use bytes::Bytes;

    /// Holds a store to the publishing protocol, under `loc`: a first put of a name lands and a
    /// second is refused with the first's bytes kept; a put whose response is lost but whose
    /// write landed reports `AlreadyExists` on its retry; transient failures are retried (two
    /// failures, then the third attempt lands). The local, in-memory and S3 tests all run it.
    pub fn check_publish_protocol(loc: &Location) {
        let publish = |loc: &Location, name: &str, bytes: &'static [u8]| {
            loc.publish(name, Bytes::from_static(bytes))
                .unwrap_or_else(|e| panic!("publishing {name} under {}: {e}", loc.url))
        };
        assert_eq!(publish(loc, "a/b.bin", b"1"), Published::Created);
        assert_eq!(publish(loc, "a/b.bin", b"2"), Published::AlreadyExists);
        let files = loc.list("a").unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(loc.relative(&files[0].location), "a/b.bin");
        assert_eq!(&loc.read(&files[0].location).unwrap()[..], b"1");

        let lossy = loc
            .clone()
            .with_store(Arc::new(FaultyStore::new(loc.store.clone(), 1, true)));
        assert_eq!(publish(&lossy, "lost", b"1"), Published::AlreadyExists);

        let faulty = Arc::new(FaultyStore::new(loc.store.clone(), 2, false));
        let failing = loc.clone().with_store(faulty.clone());
        assert_eq!(publish(&failing, "retried", b"1"), Published::Created);
        assert_eq!(faulty.puts_seen.load(Ordering::SeqCst), 3);

        // Listing between names: after one name (not it) and before another. A store said to
        // list in key order is asked for no name past the bound.
        for name in ["l/1", "l/2", "l/3", "l/_c"] {
            publish(loc, name, b"x");
        }
        let counted = Arc::new(FaultyStore::new(loc.store.clone(), 0, false));
        let counting = loc.clone().with_store(counted.clone());
        let between = |after: &str, before: Option<&str>| -> Vec<String> {
            let listed = counting.list_between("l", after, before).unwrap();
            listed.iter().map(|m| loc.relative(&m.location)).collect()
        };
        assert_eq!(between("l/1", Some("l/3")), ["l/2"]);
        let read = counted.objects_listed.load(Ordering::SeqCst);
        if loc.sorted_lists {
            // l/2, then l/3 (past the bound): the listing stopped there.
            assert_eq!(read, 2, "{} lists in key order", loc.url);
        } else {
            assert_eq!(read, 3, "{}", loc.url);
        }
        assert_eq!(between("l/1", None), ["l/2", "l/3", "l/_c"]);
        assert_eq!(between("l/0", Some("l/_")), ["l/1", "l/2", "l/3"]);
    }

    /// Wraps a store and fails the next `fail_puts` puts with a transient error (and, with
    /// `land_then_fail`, lets the write land before failing, as a lost response does). With
    /// [`FaultyStore::stale_heads`], existence checks answer "not there", as a look taken just before
    /// another worker's write does.
    #[derive(Debug)]
    pub struct FaultyStore {
        inner: Arc<dyn ObjectStore>,
        fail_puts: AtomicUsize,
        land_then_fail: bool,
        stale_heads: AtomicUsize,
        fail_lists: AtomicUsize,
        hold: Option<Hold>,
        rival: std::sync::Mutex<Option<(Path, bytes::Bytes)>>,
        pub puts_seen: AtomicUsize,
        /// Existence checks (HEAD requests) asked.
        pub heads_seen: AtomicUsize,
        /// Bytes the reads got (whole objects and ranges).
        pub bytes_read: std::sync::atomic::AtomicU64,
        /// Objects the listings handed out (as far as their readers read them).
        pub objects_listed: Arc<AtomicUsize>,
        /// The paths of the puts that landed, in the order they did.
        pub landed: std::sync::Mutex<Vec<String>>,
        /// Held calls that gave up waiting ([`FaultyStore::hold`]).
        pub holds_timed_out: AtomicUsize,
    }

    /// Calls on the paths `held` picks wait for `ticks` to move on by `n`.
    #[derive(Debug)]
    struct Hold {
        ticks: Arc<AtomicUsize>,
        n: usize,
        held: fn(&Path) -> bool,
    }

    /// How long a held call waits at most.
    const HOLD_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

    impl FaultyStore {
        pub fn new(inner: Arc<dyn ObjectStore>, fail_puts: usize, land_then_fail: bool) -> Self {
            Self {
                inner,
                fail_puts: AtomicUsize::new(fail_puts),
                land_then_fail,
                stale_heads: AtomicUsize::new(0),
                fail_lists: AtomicUsize::new(0),
                hold: None,
                rival: std::sync::Mutex::new(None),
                puts_seen: AtomicUsize::new(0),
                heads_seen: AtomicUsize::new(0),
                bytes_read: Default::default(),
                objects_listed: Default::default(),
                landed: std::sync::Mutex::new(Vec::new()),
                holds_timed_out: AtomicUsize::new(0),
            }
        }

        /// Puts and reads (not existence checks) of the paths `held` picks wait until `ticks` has moved on by `n` from
        /// where it stood when the call began (say, a job's engine steps: the call lands only if
        /// the job keeps stepping while it waits). After 5 s it goes ahead and counts in
        /// `holds_timed_out`.
        pub fn hold(mut self, ticks: Arc<AtomicUsize>, n: usize, held: fn(&Path) -> bool) -> Self {
            self.hold = Some(Hold { ticks, n, held });
            self
        }

        async fn wait_if_held(&self, location: &Path) {
            let Some(h) = self.hold.as_ref().filter(|h| (h.held)(location)) else {
                return;
            };
            let until = h.ticks.load(Ordering::SeqCst) + h.n;
            let started = std::time::Instant::now();
            while h.ticks.load(Ordering::SeqCst) < until {
                if started.elapsed() > HOLD_LIMIT {
                    self.holds_timed_out.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }

        /// The next `n` existence checks (HEAD requests) answer "not found".
        pub fn stale_heads(self, n: usize) -> Self {
            self.stale_heads.store(n, Ordering::SeqCst);
            self
        }

        /// The first put to `at` finds `bytes` there, put by another worker just before it.
        pub fn rival(self, at: Path, bytes: bytes::Bytes) -> Self {
            *self.rival.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, bytes));
            self
        }

        /// The next `n` listings fail with a transient error (an unreachable store).
        pub fn fail_lists(self, n: usize) -> Self {
            self.fail_lists.store(n, Ordering::SeqCst);
            self
        }

        /// The inner store's `listed`, counted in `objects_listed` as it is read, or the
        /// injected failure.
        fn listing(
            &self,
            listed: BoxStream<'static, object_store::Result<ObjectMeta>>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            let fail = self
                .fail_lists
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if fail {
                return Box::pin(futures::stream::once(async {
                    Err(object_store::Error::Generic {
                        store: "faulty",
                        source: "injected list failure (connection refused)".into(),
                    })
                }));
            }
            let seen = self.objects_listed.clone();
            Box::pin(futures::StreamExt::inspect(listed, move |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            }))
        }
    }

    impl fmt::Display for FaultyStore {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "FaultyStore({})", self.inner)
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for FaultyStore {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.puts_seen.fetch_add(1, Ordering::SeqCst);
            self.wait_if_held(location).await;
            let rival = {
                let mut r = self.rival.lock().unwrap_or_else(|e| e.into_inner());
                r.take_if(|(at, _)| at == location)
            };
            if let Some((at, bytes)) = rival {
                let put = PutOptions::default();
                self.inner.put_opts(&at, bytes.into(), put).await?;
            }
            let fail = self
                .fail_puts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !fail {
                let put = self.inner.put_opts(location, payload, opts).await;
                if put.is_ok() {
                    let mut landed = self.landed.lock().unwrap_or_else(|e| e.into_inner());
                    landed.push(location.to_string());
                }
                return put;
            }
            if self.land_then_fail {
                self.inner.put_opts(location, payload, opts).await?;
            }
            Err(object_store::Error::Generic {
                store: "faulty",
                source: "injected put failure (connection reset)".into(),
            })
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            if options.head {
                self.heads_seen.fetch_add(1, Ordering::SeqCst);
            } else {
                self.wait_if_held(location).await;
            }
            let stale = options.head
                && self
                    .stale_heads
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            if stale {
                return Err(object_store::Error::NotFound {
                    path: location.to_string(),
                    source: "injected stale existence check".into(),
                });
            }
            let head = options.head;
            let got = self.inner.get_opts(location, options).await?;
            if !head {
                let read = got.range.end - got.range.start;
                self.bytes_read.fetch_add(read, Ordering::SeqCst);
            }
            Ok(got)
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.listing(self.inner.list(prefix))
        }

        fn list_with_offset(
            &self,
            prefix: Option<&Path>,
            offset: &Path,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.listing(self.inner.list_with_offset(prefix, offset))
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }
}

#[cfg(all(test, feature = "test-support"))]
mod tests {
    use super::*;

    #[test]
    fn a_bad_variable_is_named_with_what_it_accepts() {
        let vars = |at: &'static str, after: Option<&'static str>| {
            move |k: &str| match k {
                "QUARRY_CRASH_AT" => Some(at.to_owned()),
                "QUARRY_CRASH_AFTER" => after.map(str::to_owned),
                _ => None,
            }
        };
        let e = arm_from(vars("halfway", None)).unwrap_err();
        assert_eq!(
            (e.variable, e.value.as_str()),
            ("QUARRY_CRASH_AT", "halfway")
        );
        for point in CrashPoint::ALL {
            assert!(e.expected.contains(point.name()), "{e}");
        }
        let e = arm_from(vars("mid_write", Some("twice"))).unwrap_err();
        assert_eq!(
            (e.variable, e.value.as_str()),
            ("QUARRY_CRASH_AFTER", "twice")
        );
        assert!(arm_from(|_| None).is_ok());
    }
}
