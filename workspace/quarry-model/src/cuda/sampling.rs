//! The step's draws on a GPU (`kernels/sampling.cu`): the masks through page-locked memory, one
//! launch for every row's bans, mask and draw, only the tokens back.

use candle_core::cuda::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, HostSlice, LaunchConfig, PinnedHostSlice, PushKernelArg,
    SyncOnDrop,
};
use candle_core::cuda::WrapErr;
use candle_core::{CudaDevice, Result};

use super::nonempty;
use crate::sampling::SampleRows;

const SAMPLING_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sampling.ptx"));
/// Threads per block of the sampling kernel (its `SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 512;

/// The step's masks on their way to the GPU: the host writes them into page-locked memory and one
/// asynchronous copy per step moves them to the device buffer the sampling kernel reads. Two host
/// buffers alternate, so the masks of step t + 1 are written while step t's copy may still be in
/// flight (cudarc records an event on each buffer at its copy, and handing a buffer out again
/// waits for that event only).
pub struct MaskUpload {
    host: [PinnedHostSlice<u32>; 2],
    device: CudaSlice<u32>,
    next: usize,
}

impl MaskUpload {
    /// Buffers for `words` mask words (grown on demand).
    pub fn new(dev: &CudaDevice, words: usize) -> Result<Self> {
        let words = words.max(1);
        Ok(Self {
            host: [pinned(dev, words)?, pinned(dev, words)?],
            device: dev.alloc_zeros::<u32>(words)?,
            next: 0,
        })
    }

    /// The host buffer for the next step's `words` words, to fill before [`MaskUpload::upload`].
    pub fn host_mut(&mut self, dev: &CudaDevice, words: usize) -> Result<&mut [u32]> {
        let words = words.max(1);
        if self.host[self.next].len() < words {
            self.host[self.next] = pinned(dev, words)?;
        }
        Ok(&mut self.host[self.next].as_mut_slice().w()?[..words])
    }

    /// Queues the copy of the buffer [`MaskUpload::host_mut`] handed out (its first `words`
    /// words) on candle's stream, and returns the device buffer: kernels queued after it on that
    /// stream read the step's masks.
    pub fn upload(&mut self, dev: &CudaDevice, words: usize) -> Result<&CudaSlice<u32>> {
        let words = words.max(1);
        if self.device.len() < words {
            self.device = dev.alloc_zeros::<u32>(words)?;
        }
        let host = &self.host[self.next];
        let mut dst = self.device.slice_mut(..words);
        dev.cuda_stream()
            .memcpy_htod(&HostPrefix(host, words), &mut dst)
            .w()?;
        self.next = 1 - self.next;
        Ok(&self.device)
    }
}

/// The first words of a page-locked buffer, as a copy's source: the copy records its event on
/// the whole buffer, as a copy of all of it would.
struct HostPrefix<'a>(&'a PinnedHostSlice<u32>, usize);

impl HostSlice<u32> for HostPrefix<'_> {
    fn len(&self) -> usize {
        self.1
    }

    unsafe fn stream_synced_slice<'b>(
        &'b self,
        stream: &'b CudaStream,
    ) -> (&'b [u32], SyncOnDrop<'b>) {
        // SAFETY: as the caller's: the slice is used with `stream` only.
        let (all, sync) = unsafe { self.0.stream_synced_slice(stream) };
        (&all[..self.1], sync)
    }

    unsafe fn stream_synced_mut_slice<'b>(
        &'b mut self,
        _: &'b CudaStream,
    ) -> (&'b mut [u32], SyncOnDrop<'b>) {
        unreachable!("a mask upload's source is only read")
    }
}

fn pinned(dev: &CudaDevice, words: usize) -> Result<PinnedHostSlice<u32>> {
    // SAFETY: the memory is uninitialized until written; it is only read after `host_mut` handed
    // it out and the caller filled the words it uploads. Flags 0: plain page-locked memory (not
    // write-combined, which host reads would make slow).
    unsafe {
        dev.cuda_stream()
            .context()
            .alloc_pinned_with_flags::<u32>(words, 0)
    }
    .w()
}

/// One step's draws: row `rows.logit_row[r]` of `logits` (`[logit rows, vocab]`, edited in place
/// by bans, as the host edits its rows: the caller's own copy, no other tensor may read it) gives
/// row `r`'s token. `masks` holds the step's masks of
/// `words_per_mask` words each. Returns one `Result` per row: the token, or the host sampler's
/// error for that row (every token masked, a NaN logit).
pub fn sample_rows(
    dev: &CudaDevice,
    logits: &CudaView<'_, f32>,
    vocab: usize,
    masks: &CudaSlice<u32>,
    words_per_mask: usize,
    rows: &SampleRows,
) -> Result<Vec<crate::Result<u32>>> {
    let n = rows.rows();
    if n == 0 {
        return Ok(Vec::new());
    }
    let func = dev.get_or_load_custom_func("sample_rows", "quarry_sampling", SAMPLING_PTX)?;
    // The rows' parameters in one upload: the uniforms (f64, first, so they stay 8-byte
    // aligned), then every u32 and f32 array as words.
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let parts: [&[u32]; 7] = [
        &rows.logit_row,
        &bits(&rows.temperature),
        &rows.top_k,
        &bits(&rows.top_p),
        &rows.mask_index,
        &rows.ban_start,
        &nonempty(&rows.ban_ids),
    ];
    let mut words: Vec<u32> = rows
        .uniform
        .iter()
        .flat_map(|u| {
            let b = u.to_bits();
            [b as u32, (b >> 32) as u32]
        })
        .collect();
    let mut at = [2 * n; 8];
    for (i, p) in parts.iter().enumerate() {
        words.extend_from_slice(p);
        at[i + 1] = at[i] + p.len();
    }
    let params = dev.clone_htod(&words)?;
    let word = |i: usize| params.slice(at[i]..at[i + 1]);
    // SAFETY: each view reinterprets words that hold values of its type (f32 bits; the uniforms'
    // little-endian halves, at the buffer's 8-byte-aligned start).
    let (uniform, temperature, top_p) = unsafe {
        (
            params.slice(..2 * n).transmute::<f64>(n),
            word(1).transmute::<f32>(n),
            word(3).transmute::<f32>(n),
        )
    };
    let (Some(uniform), Some(temperature), Some(top_p)) = (uniform, temperature, top_p) else {
        candle_core::bail!("sampling: the parameters' upload is short");
    };
    let [logit_row, top_k, mask_index, ban_start, ban_ids] = [0, 2, 4, 5, 6].map(word);
    // Every row's token, then every row's status: one buffer, one copy back.
    let mut out = dev.alloc_zeros::<u32>(2 * n)?;
    let (vocab32, words32) = (vocab as u32, words_per_mask as u32);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (SAMPLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    {
        let (mut token, mut status) = out.split_at_mut(n);
        let mut b = func.builder();
        b.arg(logits)
            .arg(&logit_row)
            .arg(&vocab32)
            .arg(masks)
            .arg(&words32)
            .arg(&mask_index)
            .arg(&ban_start)
            .arg(&ban_ids)
            .arg(&temperature)
            .arg(&top_k)
            .arg(&top_p)
            .arg(&uniform)
            .arg(&mut token)
            .arg(&mut status);
        // SAFETY: the arguments match `sample_rows` in kernels/sampling.cu; every per-row array has
        // `n` entries (`ban_start` n + 1), and the caller's logits and masks have the sizes given.
        unsafe { b.launch(cfg) }.w()?;
    }
    let out = dev.clone_dtoh(&out)?;
    let (token, status) = out.split_at(n);
    Ok(token
        .iter()
        .zip(status)
        .map(|(&t, &s)| match s {
            0 => Ok(t),
            1 => Err(crate::ModelError::Sampling {
                message: "every token is masked (all logits are -inf)".into(),
            }),
            _ => Err(crate::ModelError::Sampling {
                message: format!("logit of token {t} is NaN"),
            }),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::gpu;

    /// Rows of every kind over a vocabulary that is not a multiple of 32 (a padded vocabulary
    /// past the mask's cover), with tied logits at the top-k and top-p boundaries: the GPU's
    /// token equals the host's, except where the uniform sits within rounding of a boundary
    /// (then it equals the host's token for a uniform moved by 1e-9).
    #[test]
    fn sampling_matches_the_host_draw_row_for_row() {
        let dev = gpu();
        let case = crate::reference::SamplingCase::new();
        let (vocab, words, masks) = (case.vocab, case.words_per_mask, &case.masks);
        let dl = dev.clone_htod(&case.reversed).unwrap();
        // The masks travel as the engine's will: through the page-locked upload.
        let mut upload = MaskUpload::new(&dev, 1).unwrap();
        upload
            .host_mut(&dev, masks.len())
            .unwrap()
            .copy_from_slice(masks);
        let dm = upload.upload(&dev, masks.len()).unwrap();
        let got = sample_rows(&dev, &dl.slice(..), vocab, dm, words, &case.rows).unwrap();
        let got: Vec<std::result::Result<u32, String>> = got
            .into_iter()
            .map(|g| g.map_err(|e| e.to_string()))
            .collect();
        let (exact, boundary) = case.check(&got);
        eprintln!(
            "sampling: {exact} rows equal the host's draw, {boundary} at a rounding boundary"
        );
    }

    /// Uploads alternate between the two page-locked buffers, grow them, copy only the words
    /// asked for, and each lands whole in the device buffer.
    #[test]
    fn mask_uploads_alternate_grow_and_arrive_whole() {
        let dev = gpu();
        let mut upload = MaskUpload::new(&dev, 16).unwrap();
        let mut last = Vec::new();
        for (step, words) in [10usize, 16, 5000, 3, 70_000].into_iter().enumerate() {
            let want: Vec<u32> = (0..words as u32)
                .map(|i| i.wrapping_mul(2_654_435_761) ^ step as u32)
                .collect();
            upload.host_mut(&dev, words).unwrap().copy_from_slice(&want);
            let d = upload.upload(&dev, words).unwrap();
            let got = dev.clone_dtoh(d).unwrap();
            assert_eq!(&got[..words], &want[..], "step {step}");
            if last.len() > words {
                // Past the words copied the device buffer keeps what an earlier step put there.
                assert_eq!(&got[words..last.len()], &last[words..], "step {step}");
            }
            last = got;
        }
    }
}
