//! Where the tensor forward pass's time goes, phase by phase: with profiling on (`profile` in
//! [`crate::ModelOptions`], or [`set_enabled`]; `quarry bench --profile`), every phase of a pass
//! (the norms, each projection, RoPE, the KV writes, attention, the residual adds, the logits)
//! ends with a synchronization of the device and adds its wall time to a process-wide total that
//! [`take`] hands out. A phase's time on a GPU is then its launches' host time plus their GPU
//! time, without overlap: the pass as a whole gets slower, but the split between phases is what
//! a profiler would show, in one `quarry bench` run and without one. Off (the default), a phase
//! mark is one branch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use candle_core::Device;

use crate::error::Result;

/// One phase's totals since the last [`take`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseTime {
    pub phase: &'static str,
    /// Marks of this phase (once per layer for a layer's phases).
    pub calls: u64,
    pub seconds: f64,
}

static TOTALS: Mutex<Vec<PhaseTime>> = Mutex::new(Vec::new());
/// Whether forward passes record their phases (off until [`set_enabled`]).
static ON: AtomicBool = AtomicBool::new(false);

/// Whether forward passes record their phases.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns recording on or off for the whole process (a model loaded with
/// [`crate::ModelOptions::profile`] turns it on).
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Every phase's totals since the last call, in the order the phases first ran; clears them.
pub fn take() -> Vec<PhaseTime> {
    std::mem::take(&mut *TOTALS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// A forward pass's clock: [`Phases::mark`] ends a phase.
pub(crate) struct Phases<'a> {
    dev: &'a Device,
    /// When the current phase began; `None` with profiling off.
    since: Option<Instant>,
}

impl<'a> Phases<'a> {
    /// Starts the clock once the device has finished the work queued before the pass.
    pub(crate) fn start(dev: &'a Device) -> Result<Self> {
        if !enabled() {
            return Ok(Self { dev, since: None });
        }
        dev.synchronize()?;
        Ok(Self {
            dev,
            since: Some(Instant::now()),
        })
    }

    /// Ends `phase` when the device has finished its work, and starts the next.
    pub(crate) fn mark(&mut self, phase: &'static str) -> Result<()> {
        let Some(since) = self.since else {
            return Ok(());
        };
        self.dev.synchronize()?;
        let now = Instant::now();
        let seconds = (now - since).as_secs_f64();
        let mut totals = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
        match totals.iter_mut().find(|p| p.phase == phase) {
            Some(p) => {
                p.calls += 1;
                p.seconds += seconds;
            }
            None => totals.push(PhaseTime {
                phase,
                calls: 1,
                seconds,
            }),
        }
        self.since = Some(now);
        Ok(())
    }
}
