//! A device double: a [`Model`] whose forward call returns at once (a launch) and whose draw
//! waits until the pass's device time has passed since the launch, then picks each row's token
//! from the row's mask, as a device-side sampler does. `overlap-bench` and `pipeline-bench` run
//! the real engine (and the real job) against it, to see what a GPU would see of the host.
//!
//! Its token choice is not a model's: each row takes the smallest allowed id (in SmolLM2's
//! vocabulary the single bytes, which close strings and objects) one time in three and an
//! allowed id picked by a hash of the row otherwise, so records run to a few dozen tokens, some
//! to `max_tokens`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use quarry_engine::{Draws, Model};
use quarry_model::{parse_device, KvPool, LlamaConfig, Logits, SeqInput, NO_MASK};

/// A device that takes `pass + token · tokens` per pass, asynchronously.
pub struct Device {
    vocab: usize,
    pass: Duration,
    token: Duration,
    /// The last launch and when its pass ends.
    busy_until: Mutex<Option<Instant>>,
    /// Device time of every pass so far.
    device_s: Mutex<f64>,
    /// Host time of the double's own picks (a GPU's sampler's work, done here on the host).
    pick_s: Mutex<f64>,
    step: Mutex<u64>,
}

impl Device {
    /// A device with `vocab` logits a row, taking `pass` per pass and `token` per new token.
    pub fn new(vocab: usize, pass: Duration, token: Duration) -> Self {
        Self {
            vocab,
            pass,
            token,
            busy_until: Mutex::new(None),
            device_s: Mutex::new(0.0),
            pick_s: Mutex::new(0.0),
            step: Mutex::new(0),
        }
    }

    /// Starts the clocks and the picks over (a new run).
    pub fn reset(&self) {
        *self.device_s.lock().unwrap() = 0.0;
        *self.pick_s.lock().unwrap() = 0.0;
        *self.step.lock().unwrap() = 0;
    }

    /// Device time of every pass since the last [`Device::reset`], in seconds.
    pub fn device_s(&self) -> f64 {
        *self.device_s.lock().unwrap()
    }

    /// Host time of the double's own picks since the last reset, in seconds.
    pub fn pick_s(&self) -> f64 {
        *self.pick_s.lock().unwrap()
    }
}

impl Model for Device {
    fn forward(
        &self,
        batch: &[SeqInput],
        _pool: &mut KvPool,
        out: &mut Logits,
    ) -> quarry_model::Result<()> {
        let tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let d = self.pass + self.token * tokens as u32;
        *self.busy_until.lock().unwrap() = Some(Instant::now() + d);
        *self.device_s.lock().unwrap() += d.as_secs_f64();
        // The rows the draws read; the values stay on the "device".
        out.layout(1, batch);
        Ok(())
    }

    fn kv_pool(&self, page_size: usize, num_pages: usize) -> quarry_model::Result<KvPool> {
        let cfg = LlamaConfig::minimal("device-double", self.vocab, self.context_length());
        KvPool::new(&cfg, page_size, num_pages, &parse_device("cpu")?, None)
    }

    fn context_length(&self) -> usize {
        8192
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn sample(&self, _logits: &mut Logits, masks: &[u32], draws: &mut Draws) {
        if let Some(end) = self.busy_until.lock().unwrap().take() {
            // The draw waits for the pass, as a device's sampling does.
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        }
        let picked = Instant::now();
        let step = {
            let mut s = self.step.lock().unwrap();
            *s += 1;
            *s
        };
        draws.out.clear();
        for r in 0..draws.rows.rows() {
            let m = draws.rows.mask_index[r];
            let h = mix(step, r as u64);
            let id = if m == NO_MASK {
                // Unconstrained: plain tokens of the middle of the vocabulary, never an end.
                Some(1000 + (h % 300) as u32)
            } else {
                let mask = &masks[m as usize * draws.words..][..draws.words];
                pick_allowed(mask, h)
            };
            draws
                .out
                .push(id.ok_or_else(|| quarry_model::ModelError::Sampling {
                    message: "no token allowed".into(),
                }));
        }
        *self.pick_s.lock().unwrap() += picked.elapsed().as_secs_f64();
    }
}

/// A 64-bit mix of two words (the picks' hash; `overlap-bench` hashes outputs with it).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut h = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xD1B5_4A32_D192_ED03);
    h ^= h >> 31;
    h.wrapping_mul(0xFF51_AFD7_ED55_8CCD)
}

/// The smallest allowed id one time in three, else the allowed id a hash of the row picks.
fn pick_allowed(mask: &[u32], h: u64) -> Option<u32> {
    let allowed: u64 = mask.iter().map(|w| w.count_ones() as u64).sum();
    if allowed == 0 {
        return None;
    }
    let mut k = if h.is_multiple_of(3) {
        0
    } else {
        (h >> 8) % allowed
    };
    for (w, &word) in mask.iter().enumerate() {
        let n = word.count_ones() as u64;
        if k < n {
            let mut bits = word;
            for _ in 0..k {
                bits &= bits - 1;
            }
            return Some(w as u32 * 32 + bits.trailing_zeros());
        }
        k -= n;
    }
    None
}
