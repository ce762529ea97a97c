//! The engine's counters ([`EngineStats`]): what every step did and where its time went, read by
//! `quarry bench`, the benchmarks and the pipeline's `/metrics`.

use crate::radix::CacheStats;

/// Engine-wide counters.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct EngineStats {
    pub steps: u64,
    pub forward_passes: u64,
    /// Tokens computed by forward passes (prefill, extends and decodes).
    pub forward_tokens: u64,
    pub sampled_tokens: u64,
    /// Output tokens appended without sampling (jump-forward, forced thinking end).
    pub forced_tokens: u64,
    /// Positions computed again after jump-forward re-tokenized a boundary.
    pub retokenized_tokens: u64,
    /// Drafts the model confirmed (counted in `forced_tokens` too) and refused.
    pub drafts_confirmed: u64,
    pub drafts_refused: u64,
    /// Time spent filling constraint masks (overlapped with the forward pass), and the steps that
    /// filled any.
    pub mask_s: f64,
    /// Time steps waited for their masks after the forward pass returned: the mask time not
    /// hidden behind the pass (on a GPU, behind the launches; the device computes meanwhile, so
    /// the draw's wait for it shrinks by as much).
    pub mask_wait_s: f64,
    pub mask_steps: u64,
    pub masks_filled: u64,
    /// Time in forward passes. On a GPU this includes the pass's device time: the pass uploads
    /// its logit rows after queueing its layers, which waits for them.
    pub forward_s: f64,
    /// Time in the step's draws ([`Model::sample`]): on a GPU the sampling kernel and the wait
    /// for its tokens, on the CPU the host draws.
    pub sample_s: f64,
    /// Time in the rest of a step (scheduling, radix cache, the draws that `sample_s` counts).
    pub schedule_s: f64,
    /// Time tokenizing prompts on the step's path: [`crate::Engine::run_batch`]'s before its
    /// first step, and a step's where it needs them before its pass (nothing running, or free
    /// slots the queue cannot fill), on every core.
    pub prompt_s: f64,
    /// Time tokenizing the prompts of requests submitted since the last step, beside the
    /// forward pass (on a GPU, while the device runs it), and how many.
    pub prompt_beside_s: f64,
    pub prompts_beside: u64,
    /// Draws the token budget refused (no completion would have fitted after the token) and
    /// drew again from the tokens that fit (`docs/budget.md`).
    pub budget_redraws: u64,
    /// Time in the budget's checks of drawn tokens and its draws again: the host's cost of
    /// records that always close (what the step waits for; the masks of the tokens that fit
    /// filled beside the pass are in `mask_s`).
    pub budget_s: f64,
    /// Masks of the tokens that fit filled beside the forward pass, for sequences whose tokens
    /// left are no more than their state's shortest completion (where almost every draw again
    /// happens), and how many draws again took theirs instead of walking after the draw.
    pub budget_fits_beside: u64,
    pub budget_redraws_beside: u64,
    /// Draws again whose token did not fit either (a logit processor's ban or a `uniqueItems`
    /// tracker kept no token that fits, `docs/budget.md`): the completion's first token was
    /// taken in its place. 0 where the masks of the tokens that fit are right.
    pub budget_replaced: u64,
    /// Sequences sent back to the queue because the pool ran out of pages.
    pub retracted: u64,
    pub completed: u64,
    /// Constraints compiled (a constraint in the cache is compiled once, and again only after
    /// its grammar hit a limit).
    pub grammars_compiled: u64,
    pub cache: CacheStats,
}

impl EngineStats {
    /// The radix cache's time as a share of all step time.
    pub fn cache_overhead(&self) -> f64 {
        ratio(
            self.cache.busy_ns as f64 * 1e-9,
            self.forward_s + self.schedule_s,
        )
    }

    /// Forced share of output tokens.
    pub fn forced_share(&self) -> f64 {
        ratio(
            self.forced_tokens as f64,
            (self.sampled_tokens + self.forced_tokens) as f64,
        )
    }

    /// Mean time a step that filled masks waited for them after its forward pass returned, in
    /// microseconds ([`EngineStats::mask_wait_s`]).
    pub fn mask_wait_us_per_step(&self) -> f64 {
        ratio(self.mask_wait_s * 1e6, self.mask_steps as f64)
    }

    /// Mean mask-filling time per step that filled masks, in microseconds.
    pub fn mask_us_per_step(&self) -> f64 {
        ratio(self.mask_s * 1e6, self.mask_steps as f64)
    }
}

/// `part / whole`, 0 where nothing was counted.
fn ratio(part: f64, whole: f64) -> f64 {
    if whole == 0.0 {
        0.0
    } else {
        part / whole
    }
}
