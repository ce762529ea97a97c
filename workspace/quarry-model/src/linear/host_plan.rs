//! Which form a CPU holds a model's plain projections in (a checkpoint's bf16, f16 and f32; a
//! GGUF's F32/F16/BF16 matrices), decided before the first tensor is read from the memory each
//! form needs and the memory the machine has available: f32, what a CPU multiplies such weights
//! in (llama.cpp too), or Q8_0 blocks quantized at load (a quarter of the bytes, quarry's Q8_0
//! kernel) where f32 would not leave room, or where [`CpuWeights::Q8_0`] asks. A model that fits
//! in neither is refused here, naming the sizes, instead of being killed for memory half-way
//! through loading. Quantized projections stay as stored in every form.

use candle_core::quantized::GgmlDType;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::options::CpuWeights;
use crate::weights::{is_quantized, q8_0_at_load, stored_bytes, tensor_list};

/// What the weights take in a CPU's memory, in bytes, in each form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HostFootprint {
    /// The plain projections in f32, beside everything else.
    pub f32: u64,
    /// The plain projections quantized to Q8_0 at load instead (those whose rows are whole
    /// 32-value blocks), beside everything else.
    pub q8_0: u64,
}

impl HostFootprint {
    /// The footprint of a model of `c` whose tensors are stored in the types `stored_type`
    /// names (`None`: no such tensor; an untied model has `output.weight`).
    pub(crate) fn of(c: &LlamaConfig, stored_type: impl Fn(&str) -> Option<GgmlDType>) -> Self {
        let tied = stored_type("output.weight").is_none();
        let mut f = HostFootprint { f32: 0, q8_0: 0 };
        for (name, dims) in tensor_list(c, tied) {
            let elements: usize = dims.iter().product();
            let ty = stored_type(&name).unwrap_or(GgmlDType::F32);
            let both = if name == "token_embd.weight" {
                // Looked up in f32; tied, the output projection's weights too: as stored where
                // quantized, else in the form's type.
                let lookup = 4 * elements as u64;
                match (tied, is_quantized(ty)) {
                    (false, _) => lookup,
                    (true, true) => lookup + stored_bytes(ty, elements),
                    (true, false) => {
                        f.f32 += 2 * lookup;
                        f.q8_0 += lookup + q8_0_bytes(&name, &dims, tied);
                        continue;
                    }
                }
            } else if dims.len() < 2 {
                4 * elements as u64
            } else if is_quantized(ty) {
                stored_bytes(ty, elements)
            } else {
                f.f32 += 4 * elements as u64;
                f.q8_0 += q8_0_bytes(&name, &dims, tied);
                continue;
            };
            f.f32 += both;
            f.q8_0 += both;
        }
        f
    }
}

/// Bytes plain tensor `name` of `dims` takes in the Q8_0 form.
fn q8_0_bytes(name: &str, dims: &[usize], tied: bool) -> u64 {
    let elements: usize = dims.iter().product();
    match q8_0_at_load(name, dims, tied) {
        true => stored_bytes(GgmlDType::Q8_0, elements),
        false => 4 * elements as u64,
    }
}

/// How a CPU holds the plain projections, what that takes, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostWeights {
    /// The plain projections are quantized to Q8_0 at load.
    pub q8_0: bool,
    pub footprint: HostFootprint,
    /// Bytes the chosen form holds.
    pub bytes: u64,
    /// The memory available to the process before loading (`MemAvailable`), where the system
    /// says.
    pub available: Option<u64>,
    /// Set where f32 was asked for (`auto`) and did not fit, so Q8_0 was taken instead.
    pub fell_back: bool,
}

const GIB: f64 = (1u64 << 30) as f64;

impl HostWeights {
    /// The plan for a model of `c` whose tensors have the types `stored_type` names, with
    /// `available` bytes of memory (`None`: unknown, nothing is refused).
    pub(crate) fn plan(
        c: &LlamaConfig,
        stored_type: impl Fn(&str) -> Option<GgmlDType>,
        available: Option<u64>,
        asked: CpuWeights,
    ) -> Result<Self> {
        Self::decide(HostFootprint::of(c, stored_type), available, asked)
    }

    /// The decision, given the sizes: the form asked for where it leaves at least an eighth of
    /// the available memory (for the keys and values and the passes); under `auto`, f32 where it
    /// does, else Q8_0 where that does; else an error naming both sizes.
    pub fn decide(
        footprint: HostFootprint,
        available: Option<u64>,
        asked: CpuWeights,
    ) -> Result<Self> {
        let need = |q8_0: bool| match q8_0 {
            true => footprint.q8_0,
            false => footprint.f32,
        };
        let fits = |q8_0: bool| available.is_none_or(|a| need(q8_0) <= a - a / 8);
        let plan = |q8_0: bool, fell_back: bool| HostWeights {
            q8_0,
            footprint,
            bytes: need(q8_0),
            available,
            fell_back,
        };
        let first = asked == CpuWeights::Q8_0;
        if fits(first) {
            return Ok(plan(first, false));
        }
        // Only plain projections differ between the forms: where there are none, so do the sizes.
        if asked == CpuWeights::Auto && footprint.q8_0 < footprint.f32 && fits(true) {
            return Ok(plan(true, true));
        }
        let a = available.unwrap_or(0);
        Err(ModelError::DoesNotFit {
            message: format!(
                "the weights need {:.1} GiB in memory with their plain projections in f32 ({:.1} \
                 GiB with them quantized to Q8_0 at load, cpu_weights=q8_0); {:.1} GiB is \
                 available, of which an eighth stays for keys, values and the passes",
                footprint.f32 as f64 / GIB,
                footprint.q8_0 as f64 / GIB,
                a as f64 / GIB,
            ),
        })
    }
}

impl std::fmt::Display for HostWeights {
    /// One line for a command to print at load, where the projections are quantized.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: u64| b as f64 / GIB;
        let form = if self.q8_0 {
            "Q8_0 (quantized at load)"
        } else {
            "f32"
        };
        write!(
            f,
            "plain weights on the CPU: {form}, {:.1} GiB",
            gib(self.bytes)
        )?;
        if let Some(a) = self.available {
            write!(f, " of {:.1} GiB available", gib(a))?;
        }
        if self.fell_back {
            write!(
                f,
                "; in f32 ({:.1} GiB) they would leave too little memory, so Q8_0 blocks are \
                 multiplied instead (cpu_weights=q8_0 says this on purpose; outputs differ \
                 slightly from f32's)",
                gib(self.footprint.f32)
            )?;
        }
        Ok(())
    }
}

/// The memory available to new allocations, in bytes: Linux's `MemAvailable`; `None` where the
/// system does not say.
pub(crate) fn host_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    /// A 7B checkpoint in bf16 on a CPU: 28 GiB in f32, 7.5 GiB as Q8_0, 2 GiB of embeddings.
    fn seven_b() -> HostFootprint {
        HostFootprint {
            f32: 30 * G,
            q8_0: 9 * G + G / 2,
        }
    }

    #[test]
    fn f32_where_it_fits_q8_0_where_only_that_does_and_a_refusal_naming_both() {
        let p = HostWeights::decide(seven_b(), Some(64 * G), CpuWeights::Auto).unwrap();
        assert_eq!((p.q8_0, p.bytes, p.fell_back), (false, 30 * G, false));
        // 24 GiB: f32 would leave less than an eighth; Q8_0 fits, said as a fallback.
        let p = HostWeights::decide(seven_b(), Some(24 * G), CpuWeights::Auto).unwrap();
        assert_eq!((p.q8_0, p.bytes, p.fell_back), (true, 9 * G + G / 2, true));
        let line = p.to_string();
        assert!(line.contains("Q8_0") && line.contains("30.0 GiB"), "{line}");
        // Asked for, Q8_0 is no fallback; f32 asked for does not fall back.
        let p = HostWeights::decide(seven_b(), Some(64 * G), CpuWeights::Q8_0).unwrap();
        assert_eq!((p.q8_0, p.fell_back), (true, false));
        assert!(HostWeights::decide(seven_b(), Some(24 * G), CpuWeights::F32).is_err());
        // 8 GiB: neither.
        let text = HostWeights::decide(seven_b(), Some(8 * G), CpuWeights::Auto)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("30.0 GiB") && text.contains("9.5 GiB") && text.contains("8.0 GiB"),
            "{text}"
        );
        // Unknown memory refuses nothing.
        let p = HostWeights::decide(seven_b(), None, CpuWeights::Auto).unwrap();
        assert!(!p.q8_0);
    }

    #[test]
    fn a_quantized_model_has_one_form_and_no_fallback() {
        let q = HostFootprint {
            f32: 5 * G,
            q8_0: 5 * G,
        };
        assert!(
            !HostWeights::decide(q, Some(8 * G), CpuWeights::Auto)
                .unwrap()
                .q8_0
        );
        assert!(HostWeights::decide(q, Some(4 * G), CpuWeights::Auto).is_err());
    }

    #[test]
    fn the_system_says_how_much_memory_is_available() {
        // Linux: a positive amount no larger than the machine's memory.
        if let Some(a) = host_available() {
            let total: u64 = std::fs::read_to_string("/proc/meminfo")
                .unwrap()
                .lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap();
            assert!(a > 0 && a <= total * 1024, "{a} of {total} KiB");
        }
    }
}
