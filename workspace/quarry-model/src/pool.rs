//! The KV page pool: fixed-size pages of keys and values for every layer, owned by the engine.
//!
//! A sequence's KV lives in the pages of its *block table*: position `p` is row `p % page_size` of
//! page `table[p / page_size]`. The engine allocates pages here and decides which sequences share
//! them (a radix prefix cache hands the same leading pages to every sequence with that prefix). The
//! model only writes the rows of the new tokens it is given and reads the rows its block tables name;
//! it never copies or concatenates a cache.

use candle_core::{DType, Device, Tensor};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::options::KvDtype;

/// Index of a page in a [`KvPool`].
pub type PageId = u32;

/// How the pool stores pages, which also picks the attention implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// Plain host memory read in place by the paged attention kernel (CPU only; the default there).
    Host,
    /// One candle tensor per layer and K/V, written with `attention::StoreRows` and read by the
    /// paged attention kernel on a GPU (gathered per sequence for attention with tensor ops on
    /// the CPU). Runs on any device (the CUDA path); on CPU it is the cross-check.
    /// Its element type is [`kv_dtype`]'s.
    Tensor,
}

/// The element type of a tensor-layout pool on `device`: f32 on the CPU, `choice` on a GPU
/// ([`crate::ModelOptions::kv_dtype`], which says why f16 is the default).
pub fn kv_dtype(device: &Device, choice: KvDtype) -> DType {
    if device.is_cpu() {
        return DType::F32;
    }
    match choice {
        KvDtype::F16 => DType::F16,
        KvDtype::Bf16 => DType::BF16,
        KvDtype::F32 => DType::F32,
    }
}

/// Storage for `slots = num_pages * page_size` rows (one page more in the tensor layout) of `kv_dim` values per layer, for K and for V.
pub(crate) enum KvStorage {
    Host { k: Vec<Vec<f32>>, v: Vec<Vec<f32>> },
    Tensor { k: Vec<Tensor>, v: Vec<Tensor> },
}

/// How many KV pools a model made and lent again ([`crate::Llama::kv_pools`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolCounts {
    pub made: u64,
    pub lent_again: u64,
}

/// Fixed-size KV pages for every layer of one model, with a free list.
pub struct KvPool {
    page_size: usize,
    num_pages: usize,
    layers: usize,
    kv_dim: usize,
    device: Device,
    pub(crate) storage: KvStorage,
    free: Vec<PageId>,
    in_use: Vec<bool>,
}

impl KvPool {
    /// A pool of `num_pages` pages of `page_size` token positions each, shaped for `config`, on
    /// `device`. `layout` defaults to [`KvLayout::Host`] on CPU and [`KvLayout::Tensor`] elsewhere,
    /// whose element type on a GPU is then the default f16 ([`KvPool::with_dtype`] chooses).
    pub fn new(
        config: &LlamaConfig,
        page_size: usize,
        num_pages: usize,
        device: &Device,
        layout: Option<KvLayout>,
    ) -> Result<Self> {
        Self::with_dtype(
            config,
            page_size,
            num_pages,
            device,
            layout,
            kv_dtype(device, KvDtype::F16),
        )
    }

    /// [`KvPool::new`] with the tensor layout's element type given (the host layout is f32).
    pub fn with_dtype(
        config: &LlamaConfig,
        page_size: usize,
        num_pages: usize,
        device: &Device,
        layout: Option<KvLayout>,
        dtype: DType,
    ) -> Result<Self> {
        let pool_err = |message: String| ModelError::Pool { message };
        if page_size == 0 || num_pages == 0 {
            return Err(pool_err(format!(
                "page size ({page_size}) and page count ({num_pages}) must be positive"
            )));
        }
        if num_pages >= PageId::MAX as usize {
            return Err(pool_err(format!(
                "{num_pages} pages is more than {}",
                PageId::MAX
            )));
        }
        let layers = config.block_count;
        let kv_dim = config.kv_dim();
        let per_layer = num_pages
            .checked_mul(page_size)
            .and_then(|s| s.checked_mul(kv_dim))
            .ok_or_else(|| pool_err(format!("{num_pages} pages of {page_size} overflow")))?;
        let layout = layout.unwrap_or(if device.is_cpu() {
            KvLayout::Host
        } else {
            KvLayout::Tensor
        });
        if layout == KvLayout::Host && !device.is_cpu() {
            return Err(pool_err("the host layout needs the CPU device".into()));
        }
        let storage = match layout {
            KvLayout::Host => {
                let buffer = || -> Result<Vec<f32>> {
                    let mut b = Vec::new();
                    b.try_reserve_exact(per_layer).map_err(|_| {
                        pool_err(format!(
                            "cannot allocate {} MiB for one layer's keys",
                            (per_layer * 4) >> 20
                        ))
                    })?;
                    b.resize(per_layer, 0.0);
                    Ok(b)
                };
                KvStorage::Host {
                    k: (0..layers).map(|_| buffer()).collect::<Result<_>>()?,
                    v: (0..layers).map(|_| buffer()).collect::<Result<_>>()?,
                }
            }
            KvLayout::Tensor => {
                // One page more than the allocator hands out: the scratch page that a CUDA
                // graph's padding writes (`KvPool::scratch_page`).
                let slots = (num_pages + 1) * page_size;
                #[cfg(feature = "cuda")]
                if let Device::Cuda(d) = device {
                    fits_on_gpu(d, config, slots, dtype, page_size)?;
                }
                let zeros = || Tensor::zeros((slots, kv_dim), dtype, device);
                KvStorage::Tensor {
                    k: (0..layers)
                        .map(|_| zeros())
                        .collect::<candle_core::Result<_>>()?,
                    v: (0..layers)
                        .map(|_| zeros())
                        .collect::<candle_core::Result<_>>()?,
                }
            }
        };
        Ok(Self {
            page_size,
            num_pages,
            layers,
            kv_dim,
            device: device.clone(),
            storage,
            // Popped from the back, so pages are handed out in increasing order.
            free: (0..num_pages as PageId).rev().collect(),
            in_use: vec![false; num_pages],
        })
    }

    /// How many positions of keys and values a pool of `page_size` pages can hand out in a GPU's
    /// free memory now (after the weights and whatever is allocated), with the passes' headroom
    /// kept, in elements of `dtype`: the `num_pages × page_size` to ask [`KvPool::with_dtype`]
    /// for, and what a benchmark's largest batch is read from. `None` on a CPU, whose pool is
    /// host memory.
    pub fn gpu_capacity(
        config: &LlamaConfig,
        device: &Device,
        dtype: DType,
        page_size: usize,
    ) -> Result<Option<usize>> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = device {
            let (free, _) = crate::device::memory_info(d)?;
            let room = free.saturating_sub(crate::device::gpu_headroom(free));
            return Ok(Some(Self::positions_in(room, config, dtype, page_size)));
        }
        let _ = (config, device, dtype, page_size);
        Ok(None)
    }

    /// The positions a tensor-layout pool of `page_size` pages can hand out in `room` bytes: its
    /// whole pages, less the scratch page it also holds ([`KvPool::scratch_page`]).
    pub fn positions_in(
        room: usize,
        config: &LlamaConfig,
        dtype: DType,
        page_size: usize,
    ) -> usize {
        let page_size = page_size.max(1);
        let pages = room / Self::bytes_per_page(config, page_size, dtype).max(1);
        pages.saturating_sub(1) * page_size
    }

    /// Bytes one position takes across all layers (keys and values) with elements of `dtype`.
    pub fn bytes_per_token(config: &LlamaConfig, dtype: DType) -> usize {
        Self::bytes_per_page(config, 1, dtype)
    }

    /// Bytes one page takes across all layers (keys and values) with elements of `dtype`.
    pub fn bytes_per_page(config: &LlamaConfig, page_size: usize, dtype: DType) -> usize {
        2 * config.block_count * config.kv_dim() * page_size * dtype.size_in_bytes()
    }

    /// The element type of the pages: f32 for the host layout, [`kv_dtype`]'s for the tensor one.
    pub fn dtype(&self) -> DType {
        match &self.storage {
            KvStorage::Host { .. } => DType::F32,
            KvStorage::Tensor { k, .. } => k.first().map_or(DType::F32, Tensor::dtype),
        }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// The page after the last one the allocator hands out, which the tensor layout holds too:
    /// no sequence owns it, so a step padded to its CUDA graph's shape writes its padding's keys
    /// and values there (`step_graph::GraphKey::pad`). `None` for the host layout (no graphs).
    pub fn scratch_page(&self) -> Option<PageId> {
        match self.storage {
            KvStorage::Host { .. } => None,
            KvStorage::Tensor { .. } => Some(self.num_pages as PageId),
        }
    }

    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    pub fn layout(&self) -> KvLayout {
        match self.storage {
            KvStorage::Host { .. } => KvLayout::Host,
            KvStorage::Tensor { .. } => KvLayout::Tensor,
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Pages needed to hold `tokens` positions.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size)
    }

    /// Takes one free page, or `None` when the pool is full (the engine then evicts or waits).
    pub fn alloc(&mut self) -> Option<PageId> {
        let page = self.free.pop()?;
        self.in_use[page as usize] = true;
        Some(page)
    }

    /// Appends `n` pages to `table`, all or nothing: `false` (and `table` unchanged) when fewer are free.
    pub fn alloc_into(&mut self, n: usize, table: &mut Vec<PageId>) -> bool {
        if self.free.len() < n {
            return false;
        }
        for _ in 0..n {
            let page = self.free.pop().expect("checked above");
            self.in_use[page as usize] = true;
            table.push(page);
        }
        true
    }

    /// Returns a page to the free list. Freeing a page that is not allocated is an error, so a
    /// reference-count bug in the engine shows up instead of corrupting another sequence's KV.
    pub fn free(&mut self, page: PageId) -> Result<()> {
        match self.in_use.get_mut(page as usize) {
            Some(used) if *used => {
                *used = false;
                self.free.push(page);
                Ok(())
            }
            Some(_) => Err(ModelError::Pool {
                message: format!("page {page} freed twice"),
            }),
            None => Err(ModelError::Pool {
                message: format!("page {page} is outside the pool of {}", self.num_pages),
            }),
        }
    }

    pub fn is_allocated(&self, page: PageId) -> bool {
        self.in_use.get(page as usize).copied().unwrap_or(false)
    }

    /// Every page free again, handed out in the order a new pool's are. What the pages hold
    /// stays: a position is always written before it is read, as after an eviction.
    pub fn reset(&mut self) {
        self.free.clear();
        self.free.extend((0..self.num_pages as PageId).rev());
        self.in_use.fill(false);
    }

    /// Whether this is the pool [`KvPool::with_dtype`] makes for `config` on `device` with these
    /// pages, the default layout and `dtype`: one a model may lend again ([`crate::Llama::kv_pool`]).
    pub(crate) fn is_shaped(
        &self,
        config: &LlamaConfig,
        device: &Device,
        page_size: usize,
        num_pages: usize,
        dtype: DType,
    ) -> bool {
        let layout = if device.is_cpu() {
            KvLayout::Host
        } else {
            KvLayout::Tensor
        };
        self.check_shape(config, device).is_ok()
            && self.page_size == page_size
            && self.num_pages == num_pages
            && self.layout() == layout
            && self.dtype() == dtype
    }

    /// What tells this pool's memory apart from another's for whatever holds its addresses (a
    /// CUDA graph): its first layer's keys' tensor, whose id no other tensor ever gets. `None`
    /// for the host layout.
    pub fn storage_id(&self) -> Option<candle_core::TensorId> {
        match &self.storage {
            KvStorage::Host { .. } => None,
            KvStorage::Tensor { k, .. } => k.first().map(Tensor::id),
        }
    }

    /// Checks that the pool was made for a model of this shape.
    pub(crate) fn check_shape(&self, config: &LlamaConfig, device: &Device) -> Result<()> {
        if self.layers != config.block_count || self.kv_dim != config.kv_dim() {
            return Err(ModelError::PoolMismatch {
                message: format!(
                    "pool has {} layers of width {}, model has {} of width {}",
                    self.layers,
                    self.kv_dim,
                    config.block_count,
                    config.kv_dim()
                ),
            });
        }
        if !self.device.same_device(device) {
            return Err(ModelError::PoolMismatch {
                message: format!(
                    "pool is on {:?}, model on {:?}",
                    self.device.location(),
                    device.location()
                ),
            });
        }
        Ok(())
    }
}

/// Refuses a pool of `slots` positions (its scratch page included) that the device's free memory
/// (after the weights and whatever is allocated already) cannot hold with
/// [`crate::device::gpu_headroom`] to spare, naming how many positions a pool of `page_size` pages
/// could hand out there ([`KvPool::gpu_capacity`]'s number): a clear error where the allocation
/// would fail mid-way.
#[cfg(feature = "cuda")]
fn fits_on_gpu(
    dev: &candle_core::CudaDevice,
    config: &LlamaConfig,
    slots: usize,
    dtype: DType,
    page_size: usize,
) -> Result<()> {
    let (free, total) = crate::device::memory_info(dev)?;
    let per_token = KvPool::bytes_per_token(config, dtype);
    let need = slots.saturating_mul(per_token);
    let room = free.saturating_sub(crate::device::gpu_headroom(free));
    if need <= room {
        return Ok(());
    }
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    Err(ModelError::Pool {
        message: format!(
            "{slots} positions of keys and values (the pages asked for and a scratch page) need \
             {:.1} GiB ({per_token} bytes each); the device has {:.1} of {:.1} GiB free after the \
             weights, of which {:.1} GiB stay for the passes: a pool of at most {} positions fits \
             (a batch of that many tokens of context in all)",
            gib(need),
            gib(free),
            gib(total),
            gib(free - room),
            KvPool::positions_in(room, config, dtype, page_size)
        ),
    })
}
