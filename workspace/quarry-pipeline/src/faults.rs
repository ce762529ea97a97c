//! Crash points for the fault tests: with `QUARRY_CRASH_AT=<point>` (and optionally
//! `QUARRY_CRASH_AFTER=<n>`, default 0) the process SIGKILLs itself the (n+1)-th time it reaches
//! that point. Points: `before_publish`, `mid_write` (half of a file's row groups encoded),
//! `between_files` (accepted published, rejects marker not yet), `before_commit` (published, offset
//! not committed). Unset, a crash point costs one relaxed atomic load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

fn armed() -> Option<&'static (String, usize)> {
    static ARMED: OnceLock<Option<(String, usize)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let point = std::env::var("QUARRY_CRASH_AT").ok()?;
            let after = std::env::var("QUARRY_CRASH_AFTER")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            Some((point, after))
        })
        .as_ref()
}

/// Kills the process here if the environment armed this point.
pub fn crash_point(point: &str) {
    static HITS: AtomicUsize = AtomicUsize::new(0);
    let Some((armed_point, after)) = armed() else {
        return;
    };
    if armed_point != point {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) == *after {
        eprintln!("quarry: crash point {point} reached; SIGKILL");
        let _ = signal_hook::low_level::raise(signal_hook::consts::SIGKILL);
    }
}
