//! Graceful shutdown. The first SIGTERM or SIGINT asks the job to stop taking work and to finish
//! and publish what it holds; a second one asks it to abandon in-flight work at once (nothing is
//! committed for it, so the next run redoes it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::PipelineError;

#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    signals: Arc<AtomicUsize>,
}

impl Shutdown {
    /// A handle no signal reaches (tests, embedding).
    pub fn manual() -> Self {
        Self::default()
    }

    /// Listens for SIGTERM and SIGINT.
    pub fn install() -> Result<Self, PipelineError> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let me = Self::default();
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
            .map_err(PipelineError::Signals)?;
        let count = me.signals.clone();
        std::thread::Builder::new()
            .name("quarry-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                    tracing::warn!(signal = sig, count = n, "shutdown requested");
                }
            })
            .map_err(PipelineError::Signals)?;
        Ok(me)
    }

    /// Asks for a graceful stop (as one signal does).
    pub fn request(&self) {
        self.signals.fetch_add(1, Ordering::SeqCst);
    }

    /// Stop taking new work; finish, publish and commit what is held.
    pub fn requested(&self) -> bool {
        self.signals.load(Ordering::SeqCst) >= 1
    }

    /// How many stop signals have arrived.
    pub fn signals(&self) -> usize {
        self.signals.load(Ordering::SeqCst)
    }

    /// Stop now; in-flight work is left uncommitted for the next run.
    pub fn abandon(&self) -> bool {
        self.signals.load(Ordering::SeqCst) >= 2
    }
}
