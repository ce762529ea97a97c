//! Which form a GPU holds the projections in, decided before the first tensor is read from the
//! memory each form needs and the memory the device has free: f16 copies (cuBLAS, the fast form
//! at every batch size measured), both forms (`dense_from_rows` above 1), or only the quantized
//! weights (candle's kernels) where the f16 copies would not leave room for keys and values. A
//! model that does not fit in either form is refused here, naming the sizes, instead of running
//! the device out of memory half-way through loading.

use candle_core::quantized::GgmlDType;
use candle_core::Device;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::options::ModelOptions;
use crate::weights::{is_quantized, stored_bytes, tensor_list, Weights};

impl Footprint {
    /// With the f16 copies (the default form), in bytes.
    pub fn with_f16(&self) -> u64 {
        self.fixed + self.f16
    }

    /// With the quantized weights alone, in bytes.
    pub fn quantized_only(&self) -> u64 {
        self.fixed + self.quantized
    }
}

/// What the weights take on a GPU in each form, in bytes (`quarry info` shows it for any model
/// file or folder: `Footprint::of_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Footprint {
    /// The quantized projections as stored.
    pub quantized: u64,
    /// The same projections dequantized to f16.
    pub f16: u64,
    /// Everything held in one form whatever is chosen: the f32 embedding table, norms and
    /// biases, and projections stored plain (f16 and bf16 as f16, f32 as f32).
    pub fixed: u64,
}

impl Footprint {
    /// The footprint of a model of `c` whose tensors are stored in the types `stored_type`
    /// names (`None`: no such tensor; an untied model has `output.weight`).
    pub(crate) fn of(c: &LlamaConfig, stored_type: impl Fn(&str) -> Option<GgmlDType>) -> Self {
        let tied = stored_type("output.weight").is_none();
        let mut f = Footprint {
            quantized: 0,
            f16: 0,
            fixed: 0,
        };
        for (name, dims) in tensor_list(c, tied) {
            let elements: usize = dims.iter().product();
            let ty = stored_type(&name).unwrap_or(GgmlDType::F32);
            if name == "token_embd.weight" {
                // Looked up in f32 (and, tied, multiplied as the output projection too).
                f.fixed += 4 * elements as u64;
                if !tied {
                    continue;
                }
            }
            if dims.len() < 2 {
                f.fixed += 4 * elements as u64;
            } else if is_quantized(ty) {
                f.quantized += stored_bytes(ty, elements);
                f.f16 += 2 * elements as u64;
            } else if ty == GgmlDType::F32 {
                f.fixed += 4 * elements as u64;
            } else {
                f.fixed += 2 * elements as u64;
            }
        }
        f
    }
}

/// How a GPU holds the projections: the rows from which they multiply f16 weights
/// (`dense_from`: 1 every step, 0 never), what that takes, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuWeights {
    /// The switch the projections load with: [`ModelOptions::dense_from_rows`], or 0 where
    /// the f16 copies do not fit.
    pub dense_from: usize,
    /// What each form takes.
    pub footprint: Footprint,
    /// Bytes the chosen form holds.
    pub bytes: u64,
    /// The device's free memory before loading, and its total.
    pub free: u64,
    pub total: u64,
    /// Set where the form asked for did not fit and the quantized weights were taken instead.
    pub fell_back: bool,
}

const GIB: f64 = (1u64 << 30) as f64;

impl GpuWeights {
    /// The plan for a model of `c` from `weights` on `device` (`None` on a CPU), from the
    /// device's free memory now.
    pub(crate) fn plan(
        c: &LlamaConfig,
        weights: &impl Weights,
        device: &Device,
        options: &ModelOptions,
    ) -> Result<Option<Self>> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = device {
            let (free, total) = crate::device::memory_info(d)?;
            let footprint = Footprint::of(c, |n| weights.stored_type(n));
            return Self::decide(
                footprint,
                free as u64,
                total as u64,
                options.dense_from_rows,
            )
            .map(Some);
        }
        let _ = (c, weights, device, options);
        Ok(None)
    }

    /// The decision, given the sizes: the form `dense_from` asks for where it leaves at least an
    /// eighth of the room (the free memory less the passes' headroom,
    /// [`crate::device::gpu_headroom`]) for keys and values; else the quantized weights alone
    /// where they fit in the room; else an error naming both sizes.
    pub fn decide(footprint: Footprint, free: u64, total: u64, dense_from: usize) -> Result<Self> {
        let room = free.saturating_sub(crate::device::gpu_headroom(free as usize) as u64);
        let need = |dense_from: usize| {
            footprint.fixed
                + match dense_from {
                    0 => footprint.quantized,
                    1 => footprint.f16,
                    _ => footprint.f16 + footprint.quantized,
                }
        };
        let plan = |dense_from, fell_back| GpuWeights {
            dense_from,
            footprint,
            bytes: need(dense_from),
            free,
            total,
            fell_back,
        };
        let fits = |dense_from: usize| match dense_from {
            0 => need(0) <= room,
            _ => need(dense_from) <= room - room / 8,
        };
        if fits(dense_from) {
            return Ok(plan(dense_from, false));
        }
        if dense_from != 0 && fits(0) {
            return Ok(plan(0, true));
        }
        Err(ModelError::DoesNotFit {
            message: format!(
                "the weights need {:.1} GiB quantized ({:.1} GiB as f16 copies); the device has \
                 {:.1} of {:.1} GiB free, of which {:.1} GiB stay for the passes",
                need(0) as f64 / GIB,
                need(1) as f64 / GIB,
                free as f64 / GIB,
                total as f64 / GIB,
                (free - room) as f64 / GIB,
            ),
        })
    }
}

impl std::fmt::Display for GpuWeights {
    /// One line for a command to print at load.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: u64| b as f64 / GIB;
        let form = match self.dense_from {
            0 => "quantized (candle's kernels)".to_owned(),
            1 => "f16 (cuBLAS)".to_owned(),
            n => format!("f16 from {n} rows, quantized below"),
        };
        write!(
            f,
            "weights on the GPU: {form}, {:.1} GiB of {:.1} GiB free",
            gib(self.bytes),
            gib(self.free)
        )?;
        if self.fell_back {
            write!(
                f,
                "; their f16 copies ({:.1} GiB) would leave too little for keys and values, so \
                 large batches run slower than they could (dense_from_rows=0 says this on purpose)",
                gib(self.footprint.fixed + self.footprint.f16)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    /// An 8B model in Q8_0 (8.5 GB quantized, 16 GB as f16, 2 GB of f32 embeddings).
    fn eight_b() -> Footprint {
        Footprint {
            quantized: 8 * G + G / 2,
            f16: 16 * G,
            fixed: 2 * G,
        }
    }

    #[test]
    fn f16_copies_where_they_leave_room_for_the_cache() {
        // An 80 GB GPU: f16 only, 18 GiB.
        let p = GpuWeights::decide(eight_b(), 79 * G, 80 * G, 1).unwrap();
        assert_eq!((p.dense_from, p.bytes, p.fell_back), (1, 18 * G, false));
        // Both forms when asked.
        let p = GpuWeights::decide(eight_b(), 79 * G, 80 * G, 32).unwrap();
        assert_eq!((p.dense_from, p.bytes), (32, 26 * G + G / 2));
        // The quantized weights alone when asked, and said so without a fallback.
        let p = GpuWeights::decide(eight_b(), 79 * G, 80 * G, 0).unwrap();
        assert_eq!((p.dense_from, p.fell_back), (0, false));
        assert!(p.to_string().contains("quantized"), "{p}");
    }

    #[test]
    fn quantized_weights_where_the_f16_copies_do_not_fit() {
        // A 24 GB GPU with 22 GiB free: room 19.8 GiB, the f16 form (18 GiB) would leave less
        // than an eighth of it.
        let p = GpuWeights::decide(eight_b(), 22 * G, 24 * G, 1).unwrap();
        assert_eq!((p.dense_from, p.fell_back), (0, true));
        assert_eq!(p.bytes, 10 * G + G / 2);
        let line = p.to_string();
        assert!(
            line.contains("18.0 GiB") && line.contains("slower"),
            "{line}"
        );
        // With 24 GiB free the f16 copies fit (room 21.6, an eighth left: 2.7 ≤ 3.6).
        let p = GpuWeights::decide(eight_b(), 24 * G, 24 * G, 1).unwrap();
        assert_eq!((p.dense_from, p.fell_back), (1, false));
    }

    #[test]
    fn a_model_that_fits_in_no_form_is_refused_with_its_sizes() {
        let err = GpuWeights::decide(eight_b(), 8 * G, 12 * G, 1).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("10.5 GiB quantized") && text.contains("18.0 GiB as f16"),
            "{text}"
        );
        assert!(text.contains("8.0 of 12.0 GiB free"), "{text}");
        // Asking for the quantized form alone does not make it fit either.
        assert!(GpuWeights::decide(eight_b(), 8 * G, 12 * G, 0).is_err());
    }
}
