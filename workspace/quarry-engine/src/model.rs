//! The seam between the engine and a model: what the scheduler needs and nothing else. [`Llama`]
//! (CPU and CUDA alike: its device is its own business) implements it; the scheduler's unit tests
//! drive the engine with a small fake that answers in microseconds.

use quarry_model::{KvPool, Llama, Logits, SeqInput};

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

    /// Positions at or past this are refused.
    fn context_length(&self) -> usize;

    /// Logits per position.
    fn vocab_size(&self) -> usize;
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
        KvPool::new(self.config(), page_size, num_pages, self.device(), None)
    }

    fn context_length(&self) -> usize {
        self.config().context_length
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }
}
