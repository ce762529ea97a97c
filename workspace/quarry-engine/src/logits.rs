//! Edits of one row of logits before sampling: the constraint's token mask and the built-in logit
//! processors. Everything works in place on the row the model returned; nothing is allocated.

use crate::request::Processor;

pub use quarry_model::apply_mask;

/// Bans the listed ids.
pub fn disallow(logits: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(x) = logits.get_mut(id as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// Bans every token that would complete an `n`-gram already present in the last `window` tokens
/// of `history`, except the `whitelist`ed ones. Costs `O(window · n)`.
pub fn no_repeat_ngram(
    logits: &mut [f32],
    history: &[u32],
    n: usize,
    window: usize,
    whitelist: &[u32],
) {
    ngram_bans(history, n, window, whitelist, |banned| {
        if let Some(x) = logits.get_mut(banned as usize) {
            *x = f32::NEG_INFINITY;
        }
    });
}

/// Calls `ban` with every token [`no_repeat_ngram`] bans (a token may come more than once).
fn ngram_bans(
    history: &[u32],
    n: usize,
    window: usize,
    whitelist: &[u32],
    mut ban: impl FnMut(u32),
) {
    if n == 0 || history.len() < n {
        return;
    }
    let recent = &history[history.len().saturating_sub(window)..];
    // The n-1 tokens the next token would extend.
    let tail = &history[history.len() - (n - 1)..];
    if recent.len() < n {
        return;
    }
    for start in 0..=recent.len() - n {
        if &recent[start..start + n - 1] == tail {
            let banned = recent[start + n - 1];
            if !whitelist.contains(&banned) {
                ban(banned);
            }
        }
    }
}

/// Applies the processors that act on logits (the thinking budget acts on the sequence instead).
pub fn apply_processors(logits: &mut [f32], processors: &[Processor], output: &[u32]) {
    for p in processors {
        match p {
            Processor::DisallowTokens { ids } => disallow(logits, ids),
            Processor::NoRepeatNgram {
                n,
                window,
                whitelist,
            } => no_repeat_ngram(logits, output, *n, *window, whitelist),
            Processor::ThinkingBudget { .. } => {}
        }
    }
}

/// The ids the processors ban after `output`, appended to `bans`: what [`apply_processors`]
/// sets to `-inf`, as a list a device applies to its own logits.
pub fn processor_bans(processors: &[Processor], output: &[u32], bans: &mut Vec<u32>) {
    for p in processors {
        match p {
            Processor::DisallowTokens { ids } => bans.extend_from_slice(ids),
            Processor::NoRepeatNgram {
                n,
                window,
                whitelist,
            } => ngram_bans(output, *n, *window, whitelist, |id| bans.push(id)),
            Processor::ThinkingBudget { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ban list and the in-place edit agree: the same tokens end up at `-inf`.
    #[test]
    fn processor_bans_are_what_apply_processors_sets_to_minus_infinity() {
        let processors = [
            Processor::DisallowTokens {
                ids: vec![7, 2, 40],
            },
            Processor::NoRepeatNgram {
                n: 2,
                window: 6,
                whitelist: vec![5],
            },
        ];
        let history = [1, 4, 1, 5, 9, 1, 3, 3, 1];
        let mut logits = vec![0.0f32; 12];
        apply_processors(&mut logits, &processors, &history);
        let mut bans = Vec::new();
        processor_bans(&processors, &history, &mut bans);
        let mut edited = vec![0.0f32; 12];
        for &id in &bans {
            if let Some(x) = edited.get_mut(id as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        assert_eq!(edited, logits);
        // In the last 6 tokens (5 9 1 3 3 1), 1 was followed by 3; 1 4 is older than the window.
        let banned: Vec<usize> = (0..12).filter(|&i| logits[i].is_infinite()).collect();
        assert_eq!(banned, vec![2, 3, 7]);
    }

    #[test]
    fn ngram_bans_only_repeats() {
        let mut logits = vec![0.0f32; 10];
        // history: 1 2 3 1 2 -> "1 2" was followed by 3, so 3 is banned; 2-grams only.
        no_repeat_ngram(&mut logits, &[1, 2, 3, 1, 2], 3, 100, &[]);
        let banned: Vec<usize> = (0..10).filter(|&i| logits[i].is_infinite()).collect();
        assert_eq!(banned, vec![3]);
        let mut logits = vec![0.0f32; 10];
        no_repeat_ngram(&mut logits, &[1, 2, 3, 1, 2], 3, 100, &[3]);
        assert!(logits.iter().all(|x| x.is_finite()));
        // Outside the window the earlier n-gram no longer counts.
        let mut logits = vec![0.0f32; 10];
        no_repeat_ngram(&mut logits, &[1, 2, 3, 9, 9, 9, 1, 2], 3, 4, &[]);
        assert!(logits.iter().all(|x| x.is_finite()));
    }
}
