//! Object-store locations (`file://`, `s3://`, `gs://`, `az://`, `memory://`, or a plain local
//! path), create-if-absent publishing with retries, listing, and a fault-injecting wrapper for
//! tests.
//!
//! The pipeline's loops are synchronous (the engine steps on this thread); object-store calls run
//! on one small shared tokio runtime and are awaited with `block_on`.
//!
//! Credentials and endpoints come from the usual environment variables (`AWS_ENDPOINT`,
//! `AWS_ACCESS_KEY_ID`, `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`,
//! ...), read by object_store's builders. S3 publishing uses `If-None-Match: *` (object_store's
//! default `aws_conditional_put = etag`).

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{PipelineError, UrlProblem};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("quarry-io")
            .enable_all()
            .build()
            .expect("the I/O runtime starts")
    })
}

/// Runs an object-store future to completion on the I/O runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// Attempts per publish or read before the error is surfaced.
pub const ATTEMPTS: u32 = 5;

/// Objects [`Location::read_all`] reads at once.
pub const READS_AT_ONCE: usize = 16;

/// A prefix in an object store.
#[derive(Clone)]
pub struct Location {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: Path,
    /// The URL as given, for messages and lineage.
    pub url: String,
    /// Whether the store lists in key order (S3, GCS, Azure and the in-memory store do; a local
    /// folder does not): a listing up to a bound can then stop at the first name past it
    /// ([`Location::list_between`]) instead of reading the rest.
    pub sorted_lists: bool,
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({})", self.url)
    }
}

/// What a create-if-absent put found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    Created,
    /// The name was taken: an earlier run (or attempt) published it.
    AlreadyExists,
}

/// In-process stores by name, so that `memory://name/` means the same store for the whole
/// process (tests, dry runs).
fn memory_store(name: &str) -> Arc<dyn ObjectStore> {
    static STORES: OnceLock<std::sync::Mutex<std::collections::HashMap<String, Arc<InMemory>>>> =
        OnceLock::new();
    let mut map = STORES
        .get_or_init(Default::default)
        .lock()
        .expect("memory stores lock");
    map.entry(name.to_string())
        .or_insert_with(|| Arc::new(InMemory::new()))
        .clone()
}

/// The local path a URL names (`file://…` or a plain path), or `None` for an object-store URL.
pub fn local_path(url: &str) -> Option<&std::path::Path> {
    if url.starts_with("file://") || !url.contains("://") {
        Some(std::path::Path::new(
            url.strip_prefix("file://").unwrap_or(url),
        ))
    } else {
        None
    }
}

impl Location {
    /// Opens an input URL or local path; a local folder must exist.
    pub fn open_input(url: &str) -> Result<Self, PipelineError> {
        if local_path(url).is_some_and(|p| !p.is_dir()) {
            return Err(PipelineError::Url {
                url: url.to_string(),
                source: UrlProblem::NoInputFolder,
            });
        }
        Self::open(url)
    }

    /// Opens a URL or a local path (created if missing).
    pub fn open(url: &str) -> Result<Self, PipelineError> {
        let bad = |source: UrlProblem| PipelineError::Url {
            url: url.to_string(),
            source,
        };
        let (store, prefix): (Arc<dyn ObjectStore>, Path) =
            if let Some((scheme, rest)) = url.split_once("://") {
                match scheme {
                    "file" => return Self::local(std::path::Path::new(rest), url),
                    "memory" => {
                        let (name, path) = rest.split_once('/').unwrap_or((rest, ""));
                        (memory_store(name), Path::from(path))
                    }
                    "s3" | "s3a" => {
                        let parsed = url::Url::parse(url).map_err(|e| bad(e.into()))?;
                        let bucket = parsed.host_str().ok_or_else(|| bad(UrlProblem::NoBucket))?;
                        let s = object_store::aws::AmazonS3Builder::from_env()
                            .with_bucket_name(bucket)
                            .build()
                            .map_err(|e| bad(e.into()))?;
                        (Arc::new(s), Path::from(parsed.path()))
                    }
                    "gs" => {
                        let parsed = url::Url::parse(url).map_err(|e| bad(e.into()))?;
                        let s = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                            .with_url(url)
                            .build()
                            .map_err(|e| bad(e.into()))?;
                        (Arc::new(s), Path::from(parsed.path()))
                    }
                    "az" | "abfs" | "abfss" | "azure" => {
                        let parsed = url::Url::parse(url).map_err(|e| bad(e.into()))?;
                        let s = object_store::azure::MicrosoftAzureBuilder::from_env()
                            .with_url(url)
                            .build()
                            .map_err(|e| bad(e.into()))?;
                        (Arc::new(s), Path::from(parsed.path()))
                    }
                    other => return Err(bad(UrlProblem::UnknownScheme(other.to_string()))),
                }
            } else {
                return Self::local(std::path::Path::new(url), url);
            };
        Ok(Self {
            store,
            prefix,
            url: url.to_string(),
            sorted_lists: true,
        })
    }

    fn local(path: &std::path::Path, url: &str) -> Result<Self, PipelineError> {
        let bad = |source: UrlProblem| PipelineError::Url {
            url: url.to_string(),
            source,
        };
        std::fs::create_dir_all(path).map_err(|e| bad(UrlProblem::Folder(e)))?;
        let root = path
            .canonicalize()
            .map_err(|e| bad(UrlProblem::Folder(e)))?;
        let store = LocalFileSystem::new_with_prefix(&root).map_err(|e| bad(e.into()))?;
        Ok(Self {
            store: Arc::new(store),
            prefix: Path::default(),
            url: url.to_string(),
            sorted_lists: false,
        })
    }

    /// The same location over another store (fault injection in tests).
    pub fn with_store(mut self, store: Arc<dyn ObjectStore>) -> Self {
        self.store = store;
        self
    }

    /// The full path of `name` (a relative path under the prefix).
    pub fn path(&self, name: &str) -> Path {
        let mut p = self.prefix.clone();
        for part in name.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        p
    }

    /// The name of a full path relative to the prefix.
    pub fn relative(&self, p: &Path) -> String {
        match p.prefix_match(&self.prefix) {
            Some(parts) => parts
                .map(|p| p.as_ref().to_string())
                .collect::<Vec<_>>()
                .join("/"),
            None => p.to_string(),
        }
    }

    /// Publishes `bytes` as `name` only if nothing is there yet, retrying transient failures.
    /// `AlreadyExists` after a failed attempt means that attempt's write landed.
    pub fn publish(&self, name: &str, bytes: Bytes) -> Result<Published, PipelineError> {
        let path = self.path(name);
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(backoff(attempt));
            }
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            match block_on(
                self.store
                    .put_opts(&path, PutPayload::from_bytes(bytes.clone()), opts),
            ) {
                Ok(_) => return Ok(Published::Created),
                Err(object_store::Error::AlreadyExists { .. }) => {
                    return Ok(Published::AlreadyExists)
                }
                // The store cannot create-if-absent: no retry helps.
                Err(e @ object_store::Error::NotImplemented { .. }) => {
                    return Err(self.err("create-if-absent put", &path, attempt + 1, e))
                }
                Err(e) => {
                    tracing::warn!(location = %path, attempt, error = %e, "put failed; retrying");
                    last = Some(e);
                }
            }
        }
        Err(self.err(
            "create-if-absent put",
            &path,
            ATTEMPTS,
            last.expect("ATTEMPTS > 0"),
        ))
    }

    /// Every object under `sub` (relative to the prefix), sorted by path.
    pub fn list(&self, sub: &str) -> Result<Vec<ObjectMeta>, PipelineError> {
        let path = self.path(sub);
        let prefix = if sub.is_empty() { &self.prefix } else { &path };
        let mut out: Vec<ObjectMeta> = self.retry("list", prefix, || async {
            self.store.list(Some(prefix)).try_collect::<Vec<_>>().await
        })?;
        out.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(out)
    }

    /// The objects under `sub` whose names (relative to the prefix) come after `after` and
    /// before `before`, sorted by path. On a store that lists in key order this asks only for
    /// them: the listing starts after `after` (S3's `start-after`) and stops at the first name
    /// not before `before`, so a folder's older names cost nothing however many there are.
    pub fn list_between(
        &self,
        sub: &str,
        after: &str,
        before: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, PipelineError> {
        let prefix = self.path(sub);
        let offset = self.path(after);
        let before = before.map(|b| self.path(b));
        let sorted = self.sorted_lists;
        let mut out: Vec<ObjectMeta> = self.retry("list", &prefix, || {
            let listed = self.store.list_with_offset(Some(&prefix), &offset);
            let before = before.clone();
            async move {
                let in_range = |m: &ObjectMeta| before.as_ref().is_none_or(|b| m.location < *b);
                if sorted {
                    listed
                        .try_take_while(|m| futures::future::ready(Ok(in_range(m))))
                        .try_collect::<Vec<_>>()
                        .await
                } else {
                    listed
                        .try_filter(|m| futures::future::ready(in_range(m)))
                        .try_collect::<Vec<_>>()
                        .await
                }
            }
        })?;
        out.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(out)
    }

    /// Deletes `name` (nothing there is not an error), retrying transient failures.
    pub fn delete(&self, name: &str) -> Result<(), PipelineError> {
        let path = self.path(name);
        self.retry("delete", &path, || async {
            match self.store.delete(&path).await {
                Err(object_store::Error::NotFound { .. }) => Ok(()),
                other => other,
            }
        })
    }

    /// Whether `name` exists.
    pub fn exists(&self, name: &str) -> Result<bool, PipelineError> {
        let path = self.path(name);
        match block_on(self.store.head(&path)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err("head", &path, 1, e)),
        }
    }

    /// Reads a whole object.
    pub fn read(&self, path: &Path) -> Result<Bytes, PipelineError> {
        block_on(self.read_async(path))
    }

    /// An object's size in bytes, retrying transient failures.
    pub fn size(&self, path: &Path) -> Result<u64, PipelineError> {
        self.retry("head", path, || async {
            Ok(self.store.head(path).await?.size)
        })
    }

    /// Reads bytes `range` of an object, retrying transient failures.
    pub fn read_range(
        &self,
        path: &Path,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, PipelineError> {
        self.retry("get", path, || self.store.get_range(path, range.clone()))
    }

    /// Reads whole objects, up to [`READS_AT_ONCE`] at a time (a text shard's files: one at a
    /// time, each a round trip to the store, they would take seconds a shard); in `paths`' order.
    pub fn read_all(&self, paths: &[Path]) -> Result<Vec<Bytes>, PipelineError> {
        use futures::StreamExt;
        block_on(
            futures::stream::iter(paths)
                .map(|p| self.read_async(p))
                .buffered(READS_AT_ONCE)
                .try_collect(),
        )
    }

    async fn read_async(&self, path: &Path) -> Result<Bytes, PipelineError> {
        self.retry_async("get", path, || async {
            self.store.get(path).await?.bytes().await
        })
        .await
    }

    fn retry<T, F, Fut>(&self, op: &'static str, path: &Path, f: F) -> Result<T, PipelineError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        block_on(self.retry_async(op, path, f))
    }

    async fn retry_async<T, F, Fut>(
        &self,
        op: &'static str,
        path: &Path,
        f: F,
    ) -> Result<T, PipelineError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt)).await;
            }
            match f().await {
                Ok(v) => return Ok(v),
                Err(e @ object_store::Error::NotFound { .. }) => {
                    return Err(self.err(op, path, attempt + 1, e))
                }
                Err(e) => last = Some(e),
            }
        }
        Err(self.err(op, path, ATTEMPTS, last.expect("ATTEMPTS > 0")))
    }

    fn err(
        &self,
        op: &'static str,
        path: &Path,
        attempts: u32,
        source: object_store::Error,
    ) -> PipelineError {
        PipelineError::Store {
            op,
            location: format!("{} ({path})", self.url),
            attempts,
            source,
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50u64 << attempt.min(6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{check_publish_protocol, FaultyStore};

    #[test]
    fn reads_at_once_keep_their_order_and_name_a_missing_object() {
        let loc = Location::open("memory://read-all/x").unwrap();
        let n = 3 * READS_AT_ONCE;
        for i in 0..n {
            loc.publish(&format!("f{i:03}"), Bytes::from(i.to_string()))
                .unwrap();
        }
        let paths: Vec<Path> = (0..n)
            .rev()
            .map(|i| loc.path(&format!("f{i:03}")))
            .collect();
        let got: Vec<String> = loc
            .read_all(&paths)
            .unwrap()
            .iter()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect();
        let want: Vec<String> = (0..n).rev().map(|i| i.to_string()).collect();
        assert_eq!(got, want);
        let mut missing = paths;
        missing.insert(READS_AT_ONCE + 1, loc.path("nope"));
        let e = loc.read_all(&missing).unwrap_err();
        assert!(
            matches!(e, PipelineError::Store { op: "get", .. }) && e.to_string().contains("nope"),
            "{e}"
        );
    }

    #[test]
    fn a_local_folder_and_memory_keep_the_publishing_protocol() {
        let dir = std::env::temp_dir().join(format!("quarry-store-{}", std::process::id()));
        check_publish_protocol(&Location::open(dir.to_str().unwrap()).unwrap());
        std::fs::remove_dir_all(dir).unwrap();
        check_publish_protocol(&Location::open("memory://faults/x").unwrap());
    }

    #[test]
    fn persistent_failures_surface_with_the_location() {
        let base = Location::open("memory://faults2/y").unwrap();
        let loc =
            base.clone()
                .with_store(Arc::new(FaultyStore::new(base.store.clone(), 99, false)));
        let err = loc.publish("h", Bytes::from_static(b"1")).unwrap_err();
        assert!(
            matches!(
                err,
                PipelineError::Store {
                    op: "create-if-absent put",
                    attempts: ATTEMPTS,
                    source: object_store::Error::Generic { .. },
                    ..
                }
            ),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(
            err.contains("injected put failure")
                && err.contains("memory://faults2/y")
                && err.contains(&format!("after {ATTEMPTS} attempts")),
            "{err}"
        );
        assert!(!base.exists("h").unwrap(), "nothing half-written");
    }

    #[test]
    fn unknown_schemes_are_named() {
        let err = Location::open("ftp://x/y").unwrap_err().to_string();
        assert!(err.contains("ftp"), "{err}");
    }
}
