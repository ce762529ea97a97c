//! Sampling primitives on a row of logits: greedy, temperature, top-k, top-p, seeded.
//!
//! Masked tokens carry `-inf` logits and are never drawn. The random stream is ChaCha8 seeded from
//! the request's seed, which rand documents as reproducible across platforms and versions, so the
//! same seed and logits give the same tokens.
//!
//! **The draw, canonically** (what a GPU sampling kernel reproduces, given the same uniform):
//! 1. the candidates are the tokens whose logit is not `-inf`;
//! 2. top-k keeps the `k` first in the order (logit descending, token id ascending);
//! 3. each kept token weighs `exp((logit - max) / temperature)`;
//! 4. top-p keeps the shortest prefix, in the order (weight descending, token id ascending), whose
//!    weight reaches `top_p` times the kept total;
//! 5. one uniform `u` in `[0, 1)` per draw, from the sequence's stream ([`Sampler::uniform`]),
//!    picks the first kept token, **in token id order**, at which the running weight exceeds
//!    `u` times the kept weight ([`pick`]); rounding past the end picks the last kept token.
//!
//! Walking in id order, not probability order, makes the draw a prefix sum over the vocabulary,
//! which a GPU computes without sorting it, and makes the token a uniform selects independent of
//! how the kept set was found. The two devices add weights in different orders, so they agree
//! except when `u` falls within rounding of a boundary between two tokens.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};

/// How to pick a token. `temperature == 0` is greedy (the others are then ignored).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Checks the ranges: a finite temperature ≥ 0 and `0 < top_p ≤ 1`.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ModelError::Sampling {
                message: format!(
                    "temperature must be finite and >= 0, got {}",
                    self.temperature
                ),
            });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ModelError::Sampling {
                message: format!("top_p must be in (0, 1], got {}", self.top_p),
            });
        }
        Ok(())
    }
}

/// Sets the logits of tokens whose bit is clear in `mask` to `-inf` (bit `i % 32` of word `i / 32`
/// is token `i`). Tokens past the mask (a model vocabulary padded beyond the tokenizer's) are
/// masked too.
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    let covered = (mask.len() * 32).min(logits.len());
    for (w, &bits) in mask.iter().enumerate() {
        if bits == u32::MAX {
            continue;
        }
        let base = w * 32;
        let end = (base + 32).min(covered);
        if bits == 0 {
            logits[base..end].fill(f32::NEG_INFINITY);
            continue;
        }
        let mut clear = !bits;
        while clear != 0 {
            let i = base + clear.trailing_zeros() as usize;
            if i >= end {
                break;
            }
            logits[i] = f32::NEG_INFINITY;
            clear &= clear - 1;
        }
    }
    logits[covered..].fill(f32::NEG_INFINITY);
}

/// Index of the largest logit (the first on ties), or `None` when every logit is `-inf` or NaN.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x > f32::NEG_INFINITY && best.is_none_or(|(_, b)| x > b) {
            best = Some((i as u32, x));
        }
    }
    best.map(|(i, _)| i)
}

/// One sequence's sampler: its parameters, its random stream and reusable scratch space, so that
/// drawing a token allocates nothing once the scratch has grown.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    candidates: Vec<(f32, u32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            candidates: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Draws a token from `logits`. Fails only when no token is possible (all `-inf`) or a logit
    /// is NaN.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        let u = self.uniform().unwrap_or(0.0);
        pick(&self.params, logits, u, &mut self.candidates)
    }

    /// The uniform the next draw uses, taken from this sequence's stream; `None` for greedy
    /// decoding, which draws nothing. A device that samples on its own is handed this value, so
    /// its draws follow the same stream as [`Sampler::sample`]'s.
    pub fn uniform(&mut self) -> Option<f64> {
        (self.params.temperature > 0.0).then(|| self.rng.random::<f64>())
    }

    /// Where this sequence's stream stands: a caller that drew uniforms ahead (for rows whose
    /// draws may turn out unused, like the rows that verify jump-forward drafts) goes back to
    /// such a position with [`Sampler::rewind`], so the stream is as if they were never drawn.
    pub fn position(&self) -> u128 {
        self.rng.get_word_pos()
    }

    /// Sets the stream back (or forward) to a [`Sampler::position`].
    pub fn rewind(&mut self, position: u128) {
        self.rng.set_word_pos(position);
    }
}

/// The token that uniform `u` (in `[0, 1)`) selects from `logits` under `p`, as the module's
/// documentation defines it. `candidates` is scratch space, kept by the caller so that drawing
/// allocates nothing once it has grown.
pub fn pick(
    p: &SamplingParams,
    logits: &[f32],
    u: f64,
    candidates: &mut Vec<(f32, u32)>,
) -> Result<u32> {
    if let Some(i) = logits.iter().position(|x| x.is_nan()) {
        return Err(ModelError::Sampling {
            message: format!("logit of token {i} is NaN"),
        });
    }
    let none = || ModelError::Sampling {
        message: "every token is masked (all logits are -inf)".into(),
    };
    if p.temperature == 0.0 {
        return argmax(logits).ok_or_else(none);
    }
    let c = candidates;
    c.clear();
    // In token id order, which the final walk needs; top-k and top-p reorder and restore it.
    c.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, &x)| x > f32::NEG_INFINITY)
            .map(|(i, &x)| (x, i as u32)),
    );
    if c.is_empty() {
        return Err(none());
    }
    // Most likely first; ties broken by token id so the order does not depend on the sort.
    let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    let mut reordered = false;
    if p.top_k > 0 && p.top_k < c.len() {
        c.select_nth_unstable_by(p.top_k - 1, order);
        c.truncate(p.top_k);
        reordered = true;
    }
    let max = c.iter().map(|x| x.0).fold(f32::NEG_INFINITY, f32::max);
    let inv_t = 1.0 / p.temperature;
    // Unnormalized probabilities, in f64 so long tails do not lose mass.
    let total: f64 = c
        .iter_mut()
        .map(|x| {
            x.0 = ((x.0 - max) * inv_t).exp();
            x.0 as f64
        })
        .sum();
    let keep = if p.top_p < 1.0 {
        reordered = true;
        // Sort a growing head of the candidates until it holds top_p of the mass: usually a
        // few dozen tokens, never a sort of the whole vocabulary.
        let target = p.top_p as f64 * total;
        let mut head = 64.min(c.len());
        loop {
            if head < c.len() {
                c.select_nth_unstable_by(head - 1, order);
            }
            c[..head].sort_unstable_by(order);
            let mut acc = 0.0;
            let found = c[..head].iter().position(|x| {
                acc += x.0 as f64;
                acc >= target
            });
            match found {
                Some(i) => break i + 1,
                None if head == c.len() => break head,
                None => head = (head * 4).min(c.len()),
            }
        }
    } else {
        c.len()
    };
    let kept = &mut c[..keep];
    if reordered {
        kept.sort_unstable_by_key(|x| x.1);
    }
    let mass: f64 = kept.iter().map(|x| x.0 as f64).sum();
    let mut rest = u * mass;
    for &(w, id) in kept.iter() {
        rest -= w as f64;
        if rest < 0.0 {
            return Ok(id);
        }
    }
    Ok(kept[keep - 1].1)
}

/// A row without a mask in [`SampleRows::mask_index`].
pub const NO_MASK: u32 = u32::MAX;

/// One step's draws as a device samples them, one array per argument of the sampling
/// kernel (kernels/sampling.cu), in row order: each row's parameters, its uniform, the edits the
/// host decided (a mask, by index into the step's mask buffer, and banned ids) and nothing else,
/// so only these small arrays travel up and one token per row comes back.
/// [`SampleRows::pick_row`] is the same draw on the host: the reference the kernel is compared
/// with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleRows {
    /// The row of the step's logits each draw reads ([`crate::Logits::row_index`]).
    pub logit_row: Vec<u32>,
    pub temperature: Vec<f32>,
    /// 0 keeps every token (as [`SamplingParams::top_k`]), saturated to `u32`.
    pub top_k: Vec<u32>,
    pub top_p: Vec<f32>,
    /// The row's uniform from its sequence's stream; 0 for greedy rows, which use none.
    pub uniform: Vec<f64>,
    /// The row's mask in the step's mask buffer (in masks of `words_per_mask` words), or
    /// [`NO_MASK`].
    pub mask_index: Vec<u32>,
    /// Where each row's banned ids begin in `ban_ids`; one more entry than rows.
    pub ban_start: Vec<u32>,
    /// Every row's banned ids, concatenated.
    pub ban_ids: Vec<u32>,
}

impl SampleRows {
    /// Empties the rows for the next step (capacity is kept).
    pub fn clear(&mut self) {
        self.logit_row.clear();
        self.temperature.clear();
        self.top_k.clear();
        self.top_p.clear();
        self.uniform.clear();
        self.mask_index.clear();
        self.ban_start.clear();
        self.ban_ids.clear();
    }

    pub fn rows(&self) -> usize {
        self.temperature.len()
    }

    /// Adds a row for `sampler`'s next draw from logits row `logit_row`, taking its uniform from
    /// the sequence's stream.
    pub fn push(
        &mut self,
        sampler: &mut Sampler,
        logit_row: usize,
        mask: Option<u32>,
        bans: impl IntoIterator<Item = u32>,
    ) {
        let p = *sampler.params();
        if self.ban_start.is_empty() {
            self.ban_start.push(0);
        }
        self.logit_row
            .push(u32::try_from(logit_row).expect("a step's logit rows fit u32"));
        self.temperature.push(p.temperature);
        self.top_k.push(u32::try_from(p.top_k).unwrap_or(u32::MAX));
        self.top_p.push(p.top_p);
        self.uniform.push(sampler.uniform().unwrap_or(0.0));
        self.mask_index.push(mask.unwrap_or(NO_MASK));
        self.ban_ids.extend(bans);
        self.ban_start
            .push(u32::try_from(self.ban_ids.len()).expect("a step's banned ids fit u32"));
    }

    /// Row `r`'s draw on the host, from its row of logits (`logits`, the row
    /// [`SampleRows::logit_row`] names; edited in place, as the kernel edits its row) and the
    /// step's `masks`.
    pub fn pick_row(
        &self,
        r: usize,
        logits: &mut [f32],
        masks: &[u32],
        words_per_mask: usize,
        scratch: &mut Vec<(f32, u32)>,
    ) -> Result<u32> {
        let bans = &self.ban_ids[self.ban_start[r] as usize..self.ban_start[r + 1] as usize];
        for &id in bans {
            if let Some(x) = logits.get_mut(id as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        if self.mask_index[r] != NO_MASK {
            let m = self.mask_index[r] as usize * words_per_mask;
            apply_mask(logits, &masks[m..m + words_per_mask]);
        }
        let p = SamplingParams {
            temperature: self.temperature[r],
            top_k: self.top_k[r] as usize,
            top_p: self.top_p[r],
            seed: 0,
        };
        pick(&p, logits, self.uniform[r], scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        }
    }

    fn draws(p: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p).unwrap();
        (0..n).map(|_| s.sample(logits).unwrap()).collect()
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_skips_masked() {
        let l = [1.0, 3.0, f32::NEG_INFINITY, 3.0];
        assert_eq!(draws(SamplingParams::greedy(), &l, 3), vec![1, 1, 1]);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 4]), None);
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert!(s.sample(&[f32::NEG_INFINITY; 3]).is_err());
        assert!(s.sample(&[0.0, f32::NAN]).is_err());
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 997) as f32 / 100.0)
            .collect();
        let a = draws(params(1.0, 0, 1.0, 42), &logits, 200);
        assert_eq!(a, draws(params(1.0, 0, 1.0, 42), &logits, 200));
        assert_ne!(a, draws(params(1.0, 0, 1.0, 43), &logits, 200));
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        // Probabilities proportional to 8, 4, 2, 1, 1 (at temperature 1).
        let logits: Vec<f32> = [8f32, 4., 2., 1., 1.].iter().map(|x| x.ln()).collect();
        let k2 = draws(params(1.0, 2, 1.0, 1), &logits, 500);
        assert!(k2.iter().all(|&t| t < 2), "{k2:?}");
        assert!(k2.contains(&0) && k2.contains(&1));
        // 8/16 = 0.5 is not enough for 0.6; 12/16 = 0.75 is: tokens 0 and 1 only.
        let p = draws(params(1.0, 0, 0.6, 2), &logits, 500);
        assert!(p.iter().all(|&t| t < 2) && p.contains(&1), "{p:?}");
        // 0.5 exactly is reached by the first token alone.
        let p = draws(params(1.0, 0, 0.5, 3), &logits, 100);
        assert!(p.iter().all(|&t| t == 0));
    }

    #[test]
    fn frequencies_follow_the_temperature_scaled_softmax() {
        // p ∝ exp(l / T): logits 0 and ln 3 at T = 1 give 1:3; at T = 0.5 they give 1:9.
        let logits = [0.0, 3f32.ln()];
        let n = 20_000;
        let share = |t: f32| {
            draws(params(t, 0, 1.0, 7), &logits, n)
                .iter()
                .filter(|&&x| x == 1)
                .count() as f64
                / n as f64
        };
        assert!((share(1.0) - 0.75).abs() < 0.015, "{}", share(1.0));
        assert!((share(0.5) - 0.9).abs() < 0.015, "{}", share(0.5));
    }

    #[test]
    fn top_p_over_a_large_vocabulary_grows_its_head() {
        // A flat distribution over 10,000 tokens: top_p 0.5 must keep about 5,000, which needs the
        // head to grow past its first 64 candidates.
        let logits = vec![0.0f32; 10_000];
        let d = draws(params(1.0, 0, 0.5, 9), &logits, 2000);
        assert!(d.iter().all(|&t| t < 5000), "ties keep the lowest ids");
        assert!(d.iter().any(|&t| t > 4000));
    }

    #[test]
    fn a_uniform_walks_the_kept_tokens_in_id_order() {
        let ln = |w: &[f32]| w.iter().map(|x| x.ln()).collect::<Vec<f32>>();
        let mut scratch = Vec::new();
        let mut at =
            |p: SamplingParams, logits: &[f32], u: f64| pick(&p, logits, u, &mut scratch).unwrap();
        // Weights 0.1, 0.6, 0.3: cumulative in id order 0.1, 0.7, 1.0.
        let l = ln(&[0.1, 0.6, 0.3]);
        let all = params(1.0, 0, 1.0, 0);
        assert_eq!(at(all, &l, 0.05), 0);
        assert_eq!(at(all, &l, 0.65), 1, "probability order would give token 2");
        assert_eq!(at(all, &l, 0.75), 2);
        // Top-k 2 of 0.1, 0.3, 0.6 keeps tokens 1 and 2 (mass 0.9); 0.2 * 0.9 = 0.18 < 0.3.
        let l = ln(&[0.1, 0.3, 0.6]);
        assert_eq!(at(params(1.0, 2, 1.0, 0), &l, 0.2), 1);
        assert_eq!(at(params(1.0, 2, 1.0, 0), &l, 0.4), 2);
        // Top-p 0.6 of 1, 1, 2, 4, 8 keeps tokens 4 and 3 (mass 12), walked as 3 then 4.
        let l = ln(&[1., 1., 2., 4., 8.]);
        assert_eq!(at(params(1.0, 0, 0.6, 0), &l, 0.25), 3);
        assert_eq!(at(params(1.0, 0, 0.6, 0), &l, 0.5), 4);
        // Rounding past the end picks the last kept token in id order.
        assert_eq!(at(params(1.0, 0, 0.6, 0), &l, 1.0), 4);
        assert_eq!(at(params(1.0, 2, 1.0, 0), &ln(&[0.6, 0.3, 0.1]), 1.0), 1);
    }

    #[test]
    fn sample_is_pick_with_the_streams_uniform() {
        let logits: Vec<f32> = (0..500).map(|i| ((i * 31) % 97) as f32 / 10.0).collect();
        for p in [
            params(0.7, 0, 1.0, 3),
            params(1.3, 20, 0.9, 4),
            SamplingParams::greedy(),
        ] {
            let mut drawn = Sampler::new(p).unwrap();
            let mut twin = Sampler::new(p).unwrap();
            let mut scratch = Vec::new();
            for _ in 0..50 {
                let u = twin.uniform();
                assert_eq!(u.is_none(), p.temperature == 0.0);
                let expected = pick(&p, &logits, u.unwrap_or(0.0), &mut scratch).unwrap();
                assert_eq!(drawn.sample(&logits).unwrap(), expected);
            }
        }
    }

    /// Uniforms drawn ahead and then rewound are drawn again, the same: the stream continues as
    /// if they had never been taken.
    #[test]
    fn rewinding_the_stream_redraws_the_same_uniforms() {
        let mut s = Sampler::new(params(0.8, 0, 1.0, 7)).unwrap();
        let start = s.position();
        let ahead: Vec<f64> = (0..5).map(|_| s.uniform().unwrap()).collect();
        assert!(ahead.windows(2).all(|w| w[0] != w[1]), "{ahead:?}");
        s.rewind(start);
        let mut twin = Sampler::new(params(0.8, 0, 1.0, 7)).unwrap();
        for u in &ahead[..2] {
            assert_eq!(s.uniform(), Some(*u));
            assert_eq!(twin.uniform(), Some(*u));
        }
        // Two of the five kept: the stream goes on from the third, like the twin's.
        let after_two = s.position();
        s.uniform();
        s.rewind(after_two);
        assert_eq!(s.uniform(), twin.uniform());
        assert_eq!(s.uniform(), Some(ahead[3]));
    }

    #[test]
    fn mask_keeps_exactly_the_set_bits() {
        let mut logits = vec![1.0f32; 70];
        let mut mask = vec![0u32; 2];
        for id in [0usize, 5, 31, 32, 63] {
            mask[id / 32] |= 1 << (id % 32);
        }
        apply_mask(&mut logits, &mask);
        let kept: Vec<usize> = (0..70).filter(|&i| logits[i] == 1.0).collect();
        assert_eq!(kept, vec![0, 5, 31, 32, 63]);
    }

    #[test]
    fn sample_rows_carry_each_rows_draw_and_edits() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 53) as f32 / 7.0).collect();
        let words = 3; // covers 96 of the 100 tokens: 96..100 are masked with the mask
        let mut masks = vec![0u32; 2 * words];
        for id in [3usize, 40, 41, 77, 95] {
            masks[words + id / 32] |= 1 << (id % 32);
        }
        let kinds = [
            (params(0.0, 0, 1.0, 0), None, vec![]),
            (params(0.0, 0, 1.0, 0), Some(1), vec![77]),
            (params(0.9, 5, 1.0, 1), None, vec![5, 500]),
            (params(1.1, 0, 0.8, 2), Some(1), vec![]),
            (params(0.8, 2, 0.9, 3), Some(0), vec![]),
        ];
        let mut samplers: Vec<Sampler> = kinds.iter().map(|k| Sampler::new(k.0).unwrap()).collect();
        let mut twins: Vec<Sampler> = kinds.iter().map(|k| Sampler::new(k.0).unwrap()).collect();
        let mut rows = SampleRows::default();
        let mut scratch = Vec::new();
        for step in 0..20 {
            rows.clear();
            for (s, k) in samplers.iter_mut().zip(&kinds) {
                rows.push(s, 0, k.1, k.2.iter().copied());
            }
            assert_eq!(rows.rows(), kinds.len());
            assert_eq!(rows.ban_start, vec![0, 0, 1, 3, 3, 3]);
            for (r, (twin, k)) in twins.iter_mut().zip(&kinds).enumerate() {
                // What the engine does on the host: bans, the mask, then the sampler.
                let mut edited = logits.clone();
                for &id in &k.2 {
                    if let Some(x) = edited.get_mut(id as usize) {
                        *x = f32::NEG_INFINITY;
                    }
                }
                if let Some(m) = k.1 {
                    apply_mask(&mut edited, &masks[m as usize * words..][..words]);
                }
                let expected = twin.sample(&edited);
                let mut row = logits.clone();
                let got = rows.pick_row(r, &mut row, &masks, words, &mut scratch);
                match (expected, got) {
                    (Ok(e), Ok(g)) => assert_eq!(e, g, "step {step} row {r}"),
                    (e, g) => assert!(e.is_err() && g.is_err(), "step {step} row {r}: {e:?} {g:?}"),
                }
                assert_eq!(row, edited, "the row is edited as the host edits it");
            }
        }
        // The all-zero mask leaves nothing: an error, not a token.
        assert_eq!(rows.mask_index[4], 0);
        assert!(rows
            .pick_row(4, &mut logits.clone(), &masks, words, &mut scratch)
            .is_err());
        assert_ne!(rows.uniform[2], 0.0, "a sampled row carries its uniform");
        assert_eq!(rows.uniform[0], 0.0, "a greedy row draws none");
    }

    #[test]
    fn invalid_parameters_are_typed_errors() {
        assert!(Sampler::new(params(-1.0, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(params(f32::NAN, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 0.0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 1.5, 0)).is_err());
    }
}
