//! Publishing finished files beside a job's loop, in lanes.
//!
//! A file's publish is a few object-store requests (tens of milliseconds each, [`crate::flow`]).
//! On a job's loop each one stopped the engine, whose step on a GPU is a few milliseconds. Here
//! `output.publishers` threads publish finished files while the loop goes on stepping. Both
//! sources publish through them:
//! - a Kafka worker's lane is a partition ([`crate::kafka`]): one publish per partition at a time,
//!   in offset order, because reconciling resumes after the highest published range, so a later
//!   range landing first would skip the earlier one after a crash; the rebalance callback waits
//!   for a revoked partition's publish under way ([`UnderWay`]) before handing it back;
//! - a dataset job's lane is a shard ([`crate::dataset`]): one file a shard, so its publishes are
//!   all independent.
//!
//! A file waits in its lane while the one before it is published; different lanes publish at
//! once. An optional step after each publish (a worker's dead letters) runs on the same thread,
//! before the report. The loop learns of a publish by its report, and only then acts on it (a
//! worker commits the range's offset).
//!
//! More than twice `output.publishers` files held (waiting or under way) make the loop wait for a
//! report: a slow store holds memory to a bound. An error comes back as that file's report, and
//! the loop stops with it. On a stop (an error, a second signal) files still waiting are not
//! published; a publish under way completes (the protocol makes either outcome safe).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::Scope;
use std::time::{Duration, Instant};

use crate::error::PipelineError;
use crate::flow::{FileReport, OpenFile, Publisher};

/// The lanes with a publish under way, shared with whoever must wait for them (a worker's
/// rebalance callback).
#[derive(Default)]
pub(crate) struct UnderWay {
    lanes: Mutex<HashSet<String>>,
    changed: Condvar,
}

impl UnderWay {
    fn begin(&self, lane: &str) {
        self.lock().insert(lane.to_string());
    }

    fn end(&self, lane: &str) {
        self.lock().remove(lane);
        self.changed.notify_all();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until none of `lanes` has a publish under way, at most `limit`; false if one still
    /// has.
    pub fn wait_for(&self, lanes: &[String], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut set = self.lock();
        while lanes.iter().any(|l| set.contains(l)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            set = self
                .changed
                .wait_timeout(set, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// A publisher thread's answer: the lane, and the report with the seconds it took.
type Reply = (String, Result<(FileReport, f64), PipelineError>);

/// A step after each publish, on the publisher's thread (a worker's dead letters).
pub(crate) type AfterPublish<'env> =
    &'env (dyn Fn(&FileReport) -> Result<(), PipelineError> + Sync);

/// The loop's side of the publisher threads.
pub(crate) struct Lanes {
    files: Sender<OpenFile>,
    reports: Receiver<Reply>,
    /// Files behind their lane's publish under way, oldest first.
    waiting: HashMap<String, VecDeque<OpenFile>>,
    /// Lanes whose publish is under way (the loop's copy: it dispatches).
    busy: HashSet<String>,
    /// Lanes whose last report was fenced: they dispatch nothing until the loop forgets them.
    fenced: HashSet<String>,
    under_way: Arc<UnderWay>,
    held: usize,
    max_held: usize,
    stop: Arc<AtomicBool>,
    /// Seconds the publishes took (on their threads).
    pub publish_s: f64,
    /// Seconds the loop waited for a report.
    pub wait_s: f64,
}

impl Lanes {
    /// Starts `publishers` threads in `scope`; `under_way` is shared with whoever waits for a
    /// lane's publish.
    pub fn start<'scope, 'env>(
        scope: &'scope Scope<'scope, 'env>,
        publisher: &'env Publisher,
        after: Option<AfterPublish<'env>>,
        publishers: usize,
        under_way: Arc<UnderWay>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (files, file_rx) = mpsc::channel::<OpenFile>();
        let file_rx = Arc::new(Mutex::new(file_rx));
        let (report_tx, reports) = mpsc::channel::<Reply>();
        for _ in 0..publishers.max(1) {
            let (file_rx, report_tx) = (file_rx.clone(), report_tx.clone());
            let (stop, under_way) = (stop.clone(), under_way.clone());
            scope.spawn(move || loop {
                let next = file_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(file) = next else { return };
                let lane = file.group.clone();
                if stop.load(Ordering::SeqCst) {
                    // Stopping: the files left are not published. The thread ends when the loop's
                    // side drops the channel, so every lane it took is ended.
                    under_way.end(&lane);
                    continue;
                }
                let t = Instant::now();
                let published = publisher.publish(file).and_then(|r| {
                    if let Some(after) = after {
                        after(&r)?;
                    }
                    Ok(r)
                });
                under_way.end(&lane);
                let reply = published.map(|r| (r, t.elapsed().as_secs_f64()));
                // After an error the loop stops and drops its side; until then, go on.
                let _ = report_tx.send((lane, reply));
            });
        }
        Self {
            files,
            reports,
            waiting: HashMap::new(),
            busy: HashSet::new(),
            fenced: HashSet::new(),
            under_way,
            held: 0,
            max_held: 2 * publishers.max(1),
            stop,
            publish_s: 0.0,
            wait_s: 0.0,
        }
    }

    /// Files held: waiting in a lane or being published.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Queues `file` behind its lane's earlier files. With too many held, first waits for
    /// reports, which go to `done`.
    pub fn publish(
        &mut self,
        file: OpenFile,
        done: &mut Vec<(FileReport, f64)>,
    ) -> Result<(), PipelineError> {
        // Only a publish under way can free room: files held in a fenced lane wait for the loop.
        while self.held >= self.max_held && !self.busy.is_empty() {
            self.collect(Some(Duration::MAX), done)?;
        }
        self.held += 1;
        if self.busy.contains(&file.group) || self.fenced.contains(&file.group) {
            self.waiting
                .entry(file.group.clone())
                .or_default()
                .push_back(file);
            Ok(())
        } else {
            self.dispatch(file)
        }
    }

    fn dispatch(&mut self, file: OpenFile) -> Result<(), PipelineError> {
        self.busy.insert(file.group.clone());
        self.under_way.begin(&file.group);
        let lane = file.group.clone();
        if let Err(mpsc::SendError(_)) = self.files.send(file) {
            // Every thread has stopped, which only a panic does (they serve until the channel
            // closes).
            self.under_way.end(&lane);
            return Err(gone());
        }
        Ok(())
    }

    /// Every report that has come back, with the seconds its publish took, into `done`, and each
    /// lane's next file dispatched. With `wait`, waits up to that long for one when a publish is
    /// under way.
    pub fn collect(
        &mut self,
        wait: Option<Duration>,
        done: &mut Vec<(FileReport, f64)>,
    ) -> Result<(), PipelineError> {
        let mut wait = wait.filter(|_| !self.busy.is_empty());
        loop {
            let (lane, got) = match wait.take() {
                None => match self.reports.try_recv() {
                    Ok(r) => r,
                    Err(TryRecvError::Empty) => return Ok(()),
                    Err(TryRecvError::Disconnected) => return Err(gone()),
                },
                Some(limit) => {
                    let t = Instant::now();
                    let r = if limit == Duration::MAX {
                        self.reports
                            .recv()
                            .map_err(|_| RecvTimeoutError::Disconnected)
                    } else {
                        self.reports.recv_timeout(limit)
                    };
                    self.wait_s += t.elapsed().as_secs_f64();
                    match r {
                        Ok(r) => r,
                        Err(RecvTimeoutError::Timeout) => return Ok(()),
                        Err(RecvTimeoutError::Disconnected) => return Err(gone()),
                    }
                }
            };
            self.held -= 1;
            self.busy.remove(&lane);
            let (report, secs) = got?;
            self.publish_s += secs;
            // A fenced range's lane dispatches nothing more, neither the files behind it nor any
            // queued before the loop reads the report: their ranges follow one that was not
            // published. The loop forgets them ([`crate::kafka`]).
            let fenced = report.fenced.is_some();
            done.push((report, secs));
            if fenced {
                self.fenced.insert(lane);
                continue;
            }
            if let Some(next) = self.waiting.get_mut(&lane).and_then(VecDeque::pop_front) {
                self.dispatch(next)?;
            }
        }
    }

    /// Drops the files waiting in `lane` (a worker's partition was revoked, or it abandons its
    /// work); returns their documents. A publish under way is not stopped.
    pub fn forget(&mut self, lane: &str) -> usize {
        self.fenced.remove(lane);
        let dropped = self.waiting.remove(lane).unwrap_or_default();
        self.held -= dropped.len();
        dropped.iter().map(OpenFile::len).sum()
    }

    /// Drops every waiting file; returns their documents.
    pub fn forget_all(&mut self) -> usize {
        let lanes: Vec<String> = self.waiting.keys().cloned().collect();
        lanes.iter().map(|l| self.forget(l)).sum()
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        // Files already handed to a thread but not begun are not published (an error or a second
        // signal); the channels drop next, which ends the threads once they have taken them.
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn gone() -> PipelineError {
    PipelineError::IoThread { what: "publishing" }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partition 0's first range is fenced (another worker claimed its first offset): the files
    /// behind it in its lane, and one queued after its report came, are not published until the
    /// loop forgets the lane; another lane goes on.
    #[test]
    fn a_fenced_range_stops_its_lane_until_the_loop_forgets_it() {
        let publisher = crate::testing::publisher("lanes-fenced", |l| {
            Arc::new(crate::faults::FaultyStore::new(l.store.clone(), 0, false))
        });
        let rejects = publisher.rejects.clone();
        rejects
            .publish("p/_claim-0", "p/0-0.parquet".into())
            .unwrap();
        let schema = crate::testing::schema();
        let validator = crate::extract::Validator::new(&schema, "s").unwrap();
        let mut flow = crate::flow::Flow::new(crate::testing::fake(1, &Arc::default()), validator);
        let mut file = |lane: &str, first: i64| {
            let id = flow.open(String::new(), lane.into(), Vec::new());
            for off in [first, first + 1] {
                let lineage = crate::record::Lineage::new("t", Some(0), off);
                flow.push_skipped(id, crate::record::tombstone(lineage));
            }
            let name = format!("{lane}/{first}-{}.parquet", first + 1);
            flow.seal_as(id, name, Some(format!("{lane}/_claim-{first}")));
            flow.take_ready().pop().unwrap()
        };
        let (a, b, c, other) = (file("p", 0), file("p", 2), file("p", 4), file("q", 0));
        std::thread::scope(|scope| {
            let mut lanes = Lanes::start(scope, &publisher, None, 1, Arc::default());
            let mut done = Vec::new();
            lanes.publish(a, &mut done).unwrap();
            lanes.publish(b, &mut done).unwrap();
            while done.is_empty() {
                lanes
                    .collect(Some(Duration::from_secs(10)), &mut done)
                    .unwrap();
            }
            assert_eq!(done[0].0.fenced.as_deref(), Some("p/0-0.parquet"));
            lanes.publish(c, &mut done).unwrap();
            lanes.publish(other, &mut done).unwrap();
            while done.len() < 2 {
                lanes
                    .collect(Some(Duration::from_secs(10)), &mut done)
                    .unwrap();
            }
            lanes
                .collect(Some(Duration::from_millis(300)), &mut done)
                .unwrap();
            let names: Vec<&str> = done.iter().map(|(r, _)| r.name.as_str()).collect();
            assert_eq!(names, ["p/0-1.parquet", "q/0-1.parquet"]);
            assert_eq!((lanes.held(), lanes.forget("p"), lanes.held()), (2, 4, 0));
        });
        for name in ["p/2-3.parquet", "p/_claim-2", "p/4-5.parquet", "p/_claim-4"] {
            assert!(!rejects.exists(name).unwrap(), "{name} was published");
        }
        assert!(rejects.exists("q/0-1.parquet").unwrap());
    }

    #[test]
    fn a_revocation_waits_for_its_partitions_publish_and_no_other() {
        let under_way = Arc::new(UnderWay::default());
        under_way.begin("topic=t/partition=0");
        under_way.begin("topic=t/partition=1");
        let ending = under_way.clone();
        let t = Instant::now();
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            ending.end("topic=t/partition=0");
        });
        let p0 = ["topic=t/partition=0".to_string()];
        assert!(under_way.wait_for(&p0, Duration::from_secs(30)));
        assert!(t.elapsed() >= Duration::from_millis(200), "waited for it");
        ender.join().unwrap();
        // Partition 1's publish never ends: the wait gives up at its limit.
        let p1 = ["topic=t/partition=1".to_string()];
        assert!(!under_way.wait_for(&p1, Duration::from_millis(50)));
        // A partition with nothing under way does not wait.
        let p2 = ["topic=t/partition=2".to_string()];
        assert!(under_way.wait_for(&p2, Duration::ZERO));
    }
}
