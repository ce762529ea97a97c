//! A dataset job's reads and publishes, beside its step loop.
//!
//! The step loop feeds the engine; a step on a GPU takes a few milliseconds, an object store's
//! request tens to hundreds. So the loop never waits for a store while it has work:
//! - one thread reads shards a chunk of documents at a time ([`super::read`]) while the engine
//!   works on the ones loaded (at most one chunk read ahead and one held: the loop takes a chunk
//!   when it needs documents, and the thread reads the next then), so a shard of any size costs
//!   a few chunks of memory;
//! - `output.publishers` threads encode and publish finished files, each by the whole protocol of
//!   [`crate::flow`], in [`crate::lanes`] (a shard's lane holds its one file, so their publishes
//!   all run at once). At most twice that many files wait for a publisher; past that the loop
//!   waits (backpressure, so a slow store holds memory to a bound).
//!
//! The loop waits only when it has nothing else to do: no documents and the next shard still
//! being read, or every shard done and the last files still publishing. `JobSummary::io_wait_s`
//! is that time; `io_s` is the time the threads spent.
//!
//! An error on either side stops the job with that error, as it did on the loop. On a stop (an
//! error, or a second signal) files still waiting for a publisher are dropped, uncommitted, as the
//! loop's in-flight work is; a publish under way completes (the protocol makes either outcome
//! safe). The threads end with the job's scope.

use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::Scope;
use std::time::{Duration, Instant};

use crate::config::DatasetSource;
use crate::error::PipelineError;
use crate::flow::{FileReport, OpenFile, Publisher};
use crate::lanes::{Lanes, UnderWay};
use crate::record::Input;
use crate::shard::Shard;
use crate::store::Location;

use super::read::{read_shard, Chunks, Reading, BLOCK_BYTES};

/// What the reader thread got to.
pub(super) enum Read {
    /// The next documents of shard `name`, in order (the first of a shard opens its file);
    /// `last`: the shard's last ones (possibly none, for an empty shard).
    Docs {
        name: String,
        inputs: Vec<Input>,
        last: bool,
    },
    /// Another worker published it after the listing.
    Meanwhile(String),
}

/// What the loop gets when it asks for the next shard.
pub(super) enum Next {
    /// Read, with the seconds the reading took.
    Read(Read, f64),
    /// Still being read (asked without waiting).
    NotYet,
    /// Every shard has been handed over.
    Done,
}

type Reply<T> = Result<(T, f64), PipelineError>;

/// Where the loop reads shards from and hands finished files to.
pub(super) struct Beside {
    reads: Option<Receiver<Reply<Read>>>,
    lanes: Lanes,
    /// Seconds the loop waited for a shard.
    read_wait_s: f64,
}

/// What the job's threads read from and publish to.
pub(super) struct Stores<'env> {
    pub input: &'env Location,
    pub src: &'env DatasetSource,
    pub max_doc_bytes: usize,
    /// Documents a chunk holds at most.
    pub chunk_docs: usize,
    pub publisher: &'env Publisher,
    pub publishers: usize,
}

impl Beside {
    /// Starts the reader over `todo` and the publishers, in `scope`.
    pub fn start<'scope, 'env>(
        scope: &'scope Scope<'scope, 'env>,
        todo: Vec<Shard>,
        stores: Stores<'env>,
    ) -> Self {
        // A rendezvous: the reader holds one chunk read until the loop takes it.
        let (read_tx, reads) = mpsc::sync_channel::<Reply<Read>>(0);
        let publishers = stores.publishers;
        let publisher = stores.publisher;
        scope.spawn(move || {
            for shard in todo {
                if !send_shard(&stores, shard, &read_tx) {
                    return;
                }
            }
        });
        // Nothing waits for a shard's publish but the loop.
        let under_way = Arc::new(UnderWay::default());
        Self {
            reads: Some(reads),
            lanes: Lanes::start(scope, publisher, None, publishers, under_way),
            read_wait_s: 0.0,
        }
    }

    /// Seconds the loop waited for a shard or a report.
    pub fn wait_s(&self) -> f64 {
        self.read_wait_s + self.lanes.wait_s
    }

    /// The next shard; with `wait`, blocks until it is read.
    pub fn next_shard(&mut self, wait: bool) -> Result<Next, PipelineError> {
        let Some(reads) = &self.reads else {
            return Ok(Next::Done);
        };
        let got = if wait {
            let t = Instant::now();
            let got = reads.recv().map_err(|_| TryRecvError::Disconnected);
            self.read_wait_s += t.elapsed().as_secs_f64();
            got
        } else {
            reads.try_recv()
        };
        match got {
            Ok(Ok((read, secs))) => Ok(Next::Read(read, secs)),
            Ok(Err(e)) => {
                self.reads = None;
                Err(e)
            }
            Err(TryRecvError::Empty) => Ok(Next::NotYet),
            Err(TryRecvError::Disconnected) => {
                self.reads = None;
                Ok(Next::Done)
            }
        }
    }

    /// Reads no further shard (a signal asked the job to finish what it holds).
    pub fn stop_reading(&mut self) {
        self.reads = None;
    }

    /// Files handed over whose reports have not come back.
    pub fn outstanding(&self) -> usize {
        self.lanes.held()
    }

    /// Hands `file` to the publishers. With too many files waiting, first waits for reports,
    /// which go to `done`.
    pub fn publish(
        &mut self,
        file: OpenFile,
        done: &mut Vec<(FileReport, f64)>,
    ) -> Result<(), PipelineError> {
        self.lanes.publish(file, done)
    }

    /// Every report that has come back, into `done`; with `wait`, at least one when any is
    /// outstanding.
    pub fn collect(
        &mut self,
        wait: bool,
        done: &mut Vec<(FileReport, f64)>,
    ) -> Result<(), PipelineError> {
        self.lanes.collect(wait.then_some(Duration::MAX), done)
    }
}

/// Reads one shard into `tx`, unless another worker has published it since the listing: its
/// chunks, each sent once the next is read, so the last goes out marked `last`. Each reply
/// carries the seconds read since the last one. False once the loop stopped reading or an error
/// was sent.
fn send_shard(stores: &Stores<'_>, shard: Shard, tx: &SyncSender<Reply<Read>>) -> bool {
    let mut since = Instant::now();
    match stores.publisher.rejects.exists(&shard.name) {
        Err(e) => {
            let _ = tx.send(Err(e));
            return false;
        }
        // A closed channel: the loop stopped reading.
        Ok(true) => {
            let secs = since.elapsed().as_secs_f64();
            return tx.send(Ok((Read::Meanwhile(shard.name), secs))).is_ok();
        }
        Ok(false) => {}
    }
    let docs = |inputs: Vec<Input>, last: bool| Read::Docs {
        name: shard.name.clone(),
        inputs,
        last,
    };
    let mut held: Option<Vec<Input>> = None;
    let read = {
        let mut emit = |inputs: Vec<Input>| match held.replace(inputs) {
            Some(before) => {
                let secs = since.elapsed().as_secs_f64();
                let sent = tx.send(Ok((docs(before, false), secs))).is_ok();
                since = Instant::now();
                sent
            }
            None => true,
        };
        let mut chunks = Chunks::new(stores.chunk_docs, &mut emit);
        let reading = Reading {
            input: stores.input,
            src: stores.src,
            max_doc_bytes: stores.max_doc_bytes,
            block: BLOCK_BYTES,
        };
        read_shard(reading, &shard, &mut chunks)
    };
    match read {
        Ok(true) => {
            let secs = since.elapsed().as_secs_f64();
            let last = docs(held.unwrap_or_default(), true);
            tx.send(Ok((last, secs))).is_ok()
        }
        Ok(false) => false,
        Err(e) => {
            let _ = tx.send(Err(e));
            false
        }
    }
}
