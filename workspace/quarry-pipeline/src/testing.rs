//! Test doubles shared by the job loops' tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quarry_engine::FinishReason;
use serde_json::json;

use crate::columns::RecordShape;
use crate::error::PipelineError;
use crate::extract::{Extractor, Generated};
use crate::faults::FaultyStore;
use crate::flow::Publisher;
use crate::record::{DocStats, Document, RejectCause};
use crate::store::Location;

/// Answers each document with `{"name": text}` after `steps` steps of a millisecond (one more for a
/// text containing "slow"), two at a time; counts its steps in `ticks`. A text starting with `cut`
/// comes back truncated (`{"name":"rest`, finish `Length`); with [`Fake::refusing`], one
/// containing "refuse" is refused at submit.
pub struct Fake {
    queued: Vec<(u64, String, usize)>,
    steps: usize,
    ticks: Arc<AtomicUsize>,
    refuse: bool,
    capacity: usize,
}

impl Fake {
    /// Refuses the documents whose text contains "refuse".
    pub fn refusing(mut self) -> Self {
        self.refuse = true;
        self
    }

    /// Takes `n` documents at a time.
    pub fn with_capacity(mut self, n: usize) -> Self {
        self.capacity = n;
        self
    }
}

impl Extractor for Fake {
    fn submit(&mut self, key: u64, doc: &Document) -> Result<(), RejectCause> {
        if self.refuse && doc.text.contains("refuse") {
            return Err(RejectCause::Template("refused".into()));
        }
        let steps = self.steps + usize::from(doc.text.contains("slow"));
        self.queued.push((key, doc.text.clone(), steps));
        Ok(())
    }
    fn step(&mut self) -> Result<Vec<(u64, Generated)>, PipelineError> {
        if self.queued.is_empty() {
            return Ok(Vec::new());
        }
        std::thread::sleep(Duration::from_millis(1));
        self.ticks.fetch_add(1, Ordering::SeqCst);
        let mut done = Vec::new();
        self.queued.retain_mut(|(k, text, left)| {
            *left -= 1;
            if *left > 0 {
                return true;
            }
            let (text, finish) = match text.strip_prefix("cut") {
                Some(rest) => (format!("{{\"name\":\"{rest}"), FinishReason::Length),
                None => (
                    json!({ "name": text }).to_string(),
                    FinishReason::ConstraintComplete,
                ),
            };
            done.push((
                *k,
                Generated {
                    text,
                    finish,
                    stats: DocStats::default(),
                },
            ));
            false
        });
        Ok(done)
    }
    fn in_flight(&self) -> usize {
        self.queued.len()
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A [`Fake`] taking `steps` steps a document, counting them in `ticks`.
pub fn fake(steps: usize, ticks: &Arc<AtomicUsize>) -> Fake {
    Fake {
        queued: Vec::new(),
        steps,
        ticks: ticks.clone(),
        refuse: false,
        capacity: 2,
    }
}

/// The schema [`Fake`]'s answers follow: an object with a string `name`.
pub fn schema() -> serde_json::Value {
    json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}})
}

/// A publisher to `memory://{root}/out` and `…/rej`, each store wrapped by `wrap`.
pub fn publisher(root: &str, wrap: impl Fn(&Location) -> Arc<FaultyStore>) -> Publisher {
    let loc = |sub: &str| {
        let l = Location::open(&format!("memory://{root}/{sub}")).unwrap();
        let store = wrap(&l);
        l.with_store(store)
    };
    Publisher {
        shape: RecordShape::derive(&schema()).unwrap(),
        output: loc("out"),
        rejects: loc("rej"),
        pipeline: "t".into(),
        model: "fake".into(),
        model_runtime: String::new(),
        schema_sha256: "0".into(),
        row_group_rows: 2,
        zstd_level: 3,
    }
}
