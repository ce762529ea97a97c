//! Where the tensor forward pass's time goes, phase by phase: with profiling on (`profile` in
//! [`crate::ModelOptions`], or [`set_enabled`]; `quarry bench --profile`), every phase of a pass
//! (the norms, each projection, RoPE, the KV writes, attention, the residual adds, the logits)
//! ends with a synchronization of the device and adds its wall time to a process-wide total that
//! [`take`] hands out. A phase's time on a GPU is then its launches' host time plus their GPU
//! time, without overlap: the pass as a whole gets slower, but the split between phases is what
//! a profiler would show, in one `quarry bench` run and without one. The totals are kept per
//! [`PassKind`], so a decode step's split is not blurred by the prefill chunks of the same run.
//! Off (the default), a phase mark is one branch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use candle_core::Device;

use crate::batch::SeqInput;
use crate::error::Result;

/// What a pass computes, for the profile's split: a decode step's time and a prefill chunk's are
/// different questions (the first reads every weight for one token a sequence; the second
/// multiplies hundreds of tokens a sequence), and a run's totals over both answer neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PassKind {
    /// Every sequence of the pass adds one token.
    Decode,
    /// Some sequence adds several: a prefill chunk, a jump-forward extension, a verification of
    /// drafted tokens.
    MultiToken,
}

impl PassKind {
    /// The kind of a pass over `batch`.
    pub fn of(batch: &[SeqInput<'_>]) -> Self {
        if batch.iter().all(|s| s.tokens.len() == 1) {
            Self::Decode
        } else {
            Self::MultiToken
        }
    }

    /// How the profile's tables name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Decode => "decode",
            Self::MultiToken => "multi-token",
        }
    }
}

/// One phase's totals since the last [`take`], over the passes of one kind.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseTime {
    pub phase: &'static str,
    /// Marks of this phase (once per layer for a layer's phases).
    pub calls: u64,
    pub seconds: f64,
}

/// The profiled passes of one kind since the last [`take`], and their phases.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PassTotals {
    pub pass: PassKind,
    /// Passes of this kind.
    pub passes: u64,
    /// Their new tokens, summed (a decode pass's are its sequences).
    pub tokens: u64,
    /// In the order the phases first ran.
    pub phases: Vec<PhaseTime>,
}

static TOTALS: Mutex<Vec<PassTotals>> = Mutex::new(Vec::new());
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

/// Every pass kind's totals since the last call, in the order the kinds first ran; clears them.
pub fn take() -> Vec<PassTotals> {
    std::mem::take(&mut *totals())
}

fn totals() -> std::sync::MutexGuard<'static, Vec<PassTotals>> {
    TOTALS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A forward pass's clock: [`Phases::mark`] ends a phase.
pub(crate) struct Phases<'a> {
    dev: &'a Device,
    pass: PassKind,
    /// When the current phase began; `None` with profiling off.
    since: Option<Instant>,
}

impl<'a> Phases<'a> {
    /// Starts the clock of a pass over `batch` once the device has finished the work queued
    /// before it, and counts the pass.
    pub(crate) fn start(dev: &'a Device, batch: &[SeqInput<'_>]) -> Result<Self> {
        let pass = PassKind::of(batch);
        if !enabled() {
            return Ok(Self {
                dev,
                pass,
                since: None,
            });
        }
        dev.synchronize()?;
        let tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let mut totals = totals();
        let kind = match totals.iter().position(|k| k.pass == pass) {
            Some(i) => &mut totals[i],
            None => {
                totals.push(PassTotals {
                    pass,
                    passes: 0,
                    tokens: 0,
                    phases: Vec::new(),
                });
                totals.last_mut().expect("pushed above")
            }
        };
        kind.passes += 1;
        kind.tokens += tokens as u64;
        Ok(Self {
            dev,
            pass,
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
        let mut totals = totals();
        let phases = match totals.iter_mut().find(|k| k.pass == self.pass) {
            Some(kind) => &mut kind.phases,
            // Taken while this pass ran: its phases start a new entry without a pass counted.
            None => {
                totals.push(PassTotals {
                    pass: self.pass,
                    passes: 0,
                    tokens: 0,
                    phases: Vec::new(),
                });
                &mut totals.last_mut().expect("pushed above").phases
            }
        };
        match phases.iter_mut().find(|p| p.phase == phase) {
            Some(p) => {
                p.calls += 1;
                p.seconds += seconds;
            }
            None => phases.push(PhaseTime {
                phase,
                calls: 1,
                seconds,
            }),
        }
        self.since = Some(now);
        Ok(())
    }
}
