//! The seam between the engine and a model: what the scheduler needs and nothing else. [`Llama`]
//! (CPU and CUDA alike: its device is its own business) implements it; the scheduler's unit tests
//! drive the engine with a small fake that answers in microseconds.

use quarry_model::{KvPool, Llama, Logits, SampleRows, SeqInput};

/// A model the engine can drive.
pub trait Model: Send + Sync {
    /// One ragged forward pass: the new tokens of every sequence of `batch` at their positions,
    /// their KV written to and read from `pool` through each sequence's block table, the logits
    /// each sequence asks for into `out` ([`Logits::layout`] gives the rows).
    fn forward(
        &self,
        batch: &[SeqInput],
        pool: &mut KvPool,
        out: &mut Logits,
    ) -> quarry_model::Result<()>;

    /// A KV pool shaped for this model, on its device: `num_pages` pages of `page_size` positions.
    fn kv_pool(&self, page_size: usize, num_pages: usize) -> quarry_model::Result<KvPool>;

    /// Takes back a pool of [`Model::kv_pool`]'s that its engine is done with (the engine's
    /// drop), to lend again; the default drops it. [`Llama`] keeps it: the CUDA graphs captured
    /// on a pool replay only on that pool ([`Llama::kv_pool`]).
    fn give_back_pool(&self, pool: KvPool) {
        drop(pool);
    }

    /// Positions at or past this are refused.
    fn context_length(&self) -> usize;

    /// Logits per position.
    fn vocab_size(&self) -> usize;

    /// The step's draws, into `draws.out`: row `r` of `draws.rows` from logits row
    /// `rows.logit_row[r]` of the last forward pass, under its bans and its mask in `masks`
    /// (`draws.words` words each). The default draws on the host ([`Draws::on_host`]); a model
    /// whose logits stay on its device draws there and returns only the tokens.
    fn sample(&self, logits: &mut Logits, masks: &[u32], draws: &mut Draws) {
        draws.on_host(logits, masks);
    }
}

/// A step's draws as [`Model::sample`] takes them: the rows, the width of a mask, the host draw's
/// scratch space and what came back. The engine keeps one across steps, so a step allocates
/// nothing once they have grown.
#[derive(Default)]
pub struct Draws {
    pub rows: SampleRows,
    pub words: usize,
    pub scratch: Vec<(f32, u32)>,
    pub out: Vec<quarry_model::Result<u32>>,
}

impl Draws {
    /// Every row drawn on the host ([`SampleRows::pick_row`]).
    pub fn on_host(&mut self, logits: &mut Logits, masks: &[u32]) {
        self.out.clear();
        for r in 0..self.rows.rows() {
            let row = logits.row_mut(self.rows.logit_row[r] as usize);
            let drawn = self
                .rows
                .pick_row(r, row, masks, self.words, &mut self.scratch);
            self.out.push(drawn);
        }
    }
}

impl Model for Llama {
    fn forward(
        &self,
        batch: &[SeqInput],
        pool: &mut KvPool,
        out: &mut Logits,
    ) -> quarry_model::Result<()> {
        Llama::forward(self, batch, pool, out)
    }

    fn kv_pool(&self, page_size: usize, num_pages: usize) -> quarry_model::Result<KvPool> {
        Llama::kv_pool(self, page_size, num_pages)
    }

    fn give_back_pool(&self, pool: KvPool) {
        Llama::give_back_pool(self, pool);
    }

    fn context_length(&self) -> usize {
        self.config().context_length
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn sample(&self, logits: &mut Logits, masks: &[u32], draws: &mut Draws) {
        match self.sample_on_device(logits, &draws.rows, masks, draws.words) {
            Some(Ok(tokens)) => draws.out = tokens,
            Some(Err(e)) => {
                // The device failed the step: every row reports it, no token is invented.
                let message = e.to_string();
                draws.out.clear();
                draws.out.extend((0..draws.rows.rows()).map(|_| {
                    Err(quarry_model::ModelError::Sampling {
                        message: format!("sampling on the device failed: {message}"),
                    })
                }));
            }
            None => draws.on_host(logits, masks),
        }
    }
}

/// An engine's KV pool, given back to its model ([`Model::give_back_pool`]) when the engine
/// drops; the engine uses it as the pool itself.
pub(crate) struct LentPool {
    pool: Option<KvPool>,
    model: std::sync::Arc<dyn Model>,
}

impl LentPool {
    pub(crate) fn new(model: std::sync::Arc<dyn Model>, pool: KvPool) -> Self {
        Self {
            pool: Some(pool),
            model,
        }
    }
}

impl std::ops::Deref for LentPool {
    type Target = KvPool;

    fn deref(&self) -> &KvPool {
        self.pool.as_ref().expect("held until the drop")
    }
}

impl std::ops::DerefMut for LentPool {
    fn deref_mut(&mut self) -> &mut KvPool {
        self.pool.as_mut().expect("held until the drop")
    }
}

impl Drop for LentPool {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            self.model.give_back_pool(pool);
        }
    }
}
