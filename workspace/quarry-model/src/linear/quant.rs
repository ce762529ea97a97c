//! The quantized matmul kernels of our own for Q4_1 and Q8_0 on CPU
//! (and Q5_0, Q4_K and Q6_K, whose blocks are repacked exactly into those kernels' forms: see
//! [`Format::of`]).
//!
//! candle-core 0.11 multiplies Q4_1 weights with a scalar dot product (no SIMD path), which made
//! the required SmolLM2 Q4_1 model about 10× slower than its Q4_0 and Q8_0 kernels; and its Q8_0
//! matmul streams the whole weight matrix once per activation row, which at batch 32 made the
//! 28 MB vocabulary projection a fifth of a decode step. [`QuantMatrix`] does the same arithmetic as
//! llama.cpp's `ggml_vec_dot_q4_1_q8_1` and `ggml_vec_dot_q8_0_q8_0`:
//! - activations are quantized per 32-block to 8 bits with a scale `d` (and, for Q4_1, `s = d·Σq`),
//!   both rounded to f16, as `quantize_row_q8_1`/`quantize_row_q8_0` do;
//! - a Q4_1 block's dot product is `d_w·d_a·Σ(q_w·q_a) + m_w·s_a`, a Q8_0 block's `d_w·d_a·Σ(q_w·q_a)`,
//!   summed over blocks.
//!
//! The weights are repacked at load so that one 256-bit register holds four values of each of
//! eight output rows ([`QuantMatrix`]); `maddubs` against four activation bytes broadcast to every
//! lane then yields eight rows' partial sums at once, a block's sums stay in integer lanes until
//! one multiply by the scales, and eight outputs leave as one store. Each unpacked weight block
//! serves four activation rows. This is how GEMM micro-kernels (and llama.cpp's repacked Q4_0
//! layouts) reuse registers; against the row-by-row dot products it replaced, prefill and batch-32
//! decode run about 1.7× faster end to end (BENCHMARKS.md). On x86-64 without AVX2 and FMA, and elsewhere, a scalar loop
//! computes the identical integer sums and rounds the same float operations.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use half::f16;

use crate::error::Result;
use crate::host_mem::SharedMut;
use crate::simd::Avx2;

const QK: usize = 32;

/// The block formats with a kernel here.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Format {
    /// A scale `d` and a minimum `m` per 32 values, 4-bit `q` in 0..16: `w = d·q + m`.
    Q4_1,
    /// A scale `d` per 32 values, signed bytes: `w = d·q`.
    Q8_0,
    /// Signed bytes with a scale per 16 values: `w = d_h·q` in half `h` of each 32-block.
    Q8x16,
}

impl Format {
    /// The kernel for GGUF type `dtype`. Every mapping is exact: each weight the kernel sees is
    /// the value llama.cpp's `dequantize_row_*` computes, in f32.
    /// - Q5_0 (`w = d·(q - 16)`, `q` in 0..32) runs as Q8_0: its values are exact signed bytes,
    ///   and llama.cpp's `ggml_vec_dot_q5_0_q8_0` is the same sum, `d_w·d_a·Σ(q_w·q_a)` per
    ///   block, as Q8_0's. candle-core 0.11 has no SIMD path for Q5_0, which Gemma 3's and
    ///   Qwen2.5's Q4_K_M files use for most of their projections.
    /// - Q4_K (256-value super-blocks of eight 32-value sub-blocks, `w = d·sc_j·q - dmin·m_j` with
    ///   6-bit `sc_j`, `m_j`) runs as Q4_1 with `d = d·sc_j` and `m = -dmin·m_j`: both products
    ///   are exact in f32 (an 11-bit mantissa times 6 bits), and the repacked matrix keeps its
    ///   scales in f32.
    /// - Q6_K (sixteen 16-value sub-blocks, `w = d·sc_j·(q - 32)` with signed 8-bit `sc_j`) runs
    ///   as Q8x16 with `d_h = d·sc_j`, also exact in f32.
    ///
    /// candle multiplies the two K-quants by whole 256-value rows per activation row; here they
    /// join the repacked kernel, whose weights are read once per call whatever the batch.
    pub(crate) fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_1 | GgmlDType::Q4K => Some(Format::Q4_1),
            GgmlDType::Q8_0 | GgmlDType::Q5_0 => Some(Format::Q8_0),
            GgmlDType::Q6K => Some(Format::Q8x16),
            _ => None,
        }
    }

    /// Bytes of quantized values per block (after the scales are split out).
    fn qs_bytes(self) -> usize {
        match self {
            Format::Q4_1 => QK / 2,
            Format::Q8_0 | Format::Q8x16 => QK,
        }
    }

    /// Weight scales per 32-value block.
    const fn scales(self) -> usize {
        match self {
            Format::Q8x16 => 2,
            Format::Q4_1 | Format::Q8_0 => 1,
        }
    }
}

/// One 32-value block of weights decoded from GGUF: the values as [`Format::gguf_blocks`]'s
/// format stores them (a Q4_1 nibble, or a signed byte), the scales of its halves (both the same
/// when the block has one), and the Q4_1 minimum.
struct Block32 {
    q: [u8; QK],
    d: [f32; 2],
    m: f32,
}

/// Weight rows are interleaved in groups of this many. One 256-bit register holds [`STEP`]
/// consecutive values of each of the group's rows, so `maddubs` against [`STEP`] activation bytes
/// broadcast to every lane gives all the rows' partial sums at once, and a group's outputs are
/// adjacent floats: no horizontal sums.
const LANES: usize = 8;
/// Values of one row per 32-bit lane.
const STEP: usize = 4;
/// Register-wide steps per 32-value block.
const STEPS: usize = QK / STEP;

/// A weight matrix of `rows` outputs by `cols` inputs, repacked at load from GGUF blocks: the f16
/// scales become f32 (so they are not converted again for every activation row), and the values
/// of [`LANES`] rows are interleaved per block. In one group-block, step `s` (values `4s..4s+4` of
/// each row) puts row `c`'s four values in bytes `4c..4c+4` of a 32-byte lane set:
/// - Q8_0: step `s` is bytes `32s..32s+32`;
/// - Q4_1: steps `2p` and `2p+1` share bytes `32p..32p+32`, `2p` in the low nibbles.
///
/// Rows past `rows` in the last group are zero and their outputs are dropped.
pub(crate) struct QuantMatrix {
    format: Format,
    rows: usize,
    cols: usize,
    /// [`Format::group_bytes`] per group and block, groups outer.
    qs: Vec<u8>,
    /// Per group and block, [`LANES`] scales `d`.
    d: Vec<f32>,
    /// Per group and block, [`LANES`] Q4_1 minimums `m` (empty for Q8_0).
    m: Vec<f32>,
}

/// Activation rows quantized to 8 bits per 32-block.
#[derive(Default)]
struct QuantRows {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

const ROUND_MAGIC: f32 = 12_582_912.0;

/// Activation rows multiplied against one unpacked weight group-block at a time.
const ROW_TILE: usize = 4;

impl Format {
    /// Bytes of one group-block: [`LANES`] rows of 32 values.
    fn group_bytes(self) -> usize {
        LANES * self.qs_bytes()
    }

    /// The 32-value blocks of `data`, GGUF blocks of `dtype` (a type [`Format::of`] maps here),
    /// in order, each passed to `f`.
    fn gguf_blocks(dtype: GgmlDType, data: &[u8], mut f: impl FnMut(&Block32)) {
        let half = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        let mut out = Block32 {
            q: [0; QK],
            d: [0.0; 2],
            m: 0.0,
        };
        let size = dtype.type_size();
        for block in data.chunks_exact(size) {
            match dtype {
                GgmlDType::Q4_1 => {
                    let d = half(block, 0);
                    for j in 0..QK / 2 {
                        out.q[j] = block[4 + j] & 0x0F;
                        out.q[j + QK / 2] = block[4 + j] >> 4;
                    }
                    (out.d, out.m) = ([d, d], half(block, 2));
                    f(&out);
                }
                GgmlDType::Q5_0 => {
                    // f16 d, 32 high bits (bit j for value j), then 16 bytes of low nibbles
                    // (values j and j + 16 share byte j).
                    let d = half(block, 0);
                    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                    for j in 0..QK {
                        let low = if j < QK / 2 {
                            block[6 + j] & 0x0F
                        } else {
                            block[6 + j - QK / 2] >> 4
                        };
                        out.q[j] = ((low | (((qh >> j) & 1) << 4) as u8) as i8 - 16) as u8;
                    }
                    out.d = [d, d];
                    f(&out);
                }
                GgmlDType::Q4K => {
                    // f16 d, f16 dmin, 12 bytes of packed 6-bit scales and minimums, then 128
                    // bytes: 64-value chunk i in bytes 32i..32i+32, sub-block 2i in the low
                    // nibbles and 2i + 1 in the high ones.
                    let (d, dmin) = (half(block, 0), half(block, 2));
                    let (scales, qs) = (&block[4..16], &block[16..144]);
                    for j in 0..8 {
                        let (sc, mn) = if j < 4 {
                            (scales[j] & 63, scales[j + 4] & 63)
                        } else {
                            (
                                (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
                                (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
                            )
                        };
                        let shift = 4 * (j % 2);
                        for (l, q) in out.q.iter_mut().enumerate() {
                            *q = (qs[32 * (j / 2) + l] >> shift) & 0x0F;
                        }
                        let ds = d * sc as f32;
                        (out.d, out.m) = ([ds, ds], -(dmin * mn as f32));
                        f(&out);
                    }
                }
                GgmlDType::Q6K => {
                    // 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 signed scales,
                    // f16 d. Per 128-value half n: values 32k + l take low bits from
                    // ql[64n + l + 32(k % 2)] (low nibble for k < 2) and high bits 2k..2k+2
                    // of qh[32n + l]; 16-value sub-block 8n + 2k + l / 16 scales them.
                    let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
                    let d = half(block, 208);
                    for n in 0..2 {
                        for k in 0..4 {
                            for l in 0..QK {
                                let low = ql[64 * n + l + 32 * (k % 2)] >> (4 * (k / 2));
                                let high = (qh[32 * n + l] >> (2 * k)) & 3;
                                out.q[l] = (((low & 0x0F) | (high << 4)) as i8 - 32) as u8;
                            }
                            let scale = |h: usize| d * (sc[8 * n + 2 * k + h] as i8) as f32;
                            out.d = [scale(0), scale(1)];
                            f(&out);
                        }
                    }
                }
                _ => {
                    // Q8_0: f16 d, 32 signed bytes.
                    let d = half(block, 0);
                    out.q.copy_from_slice(&block[2..2 + QK]);
                    out.d = [d, d];
                    f(&out);
                }
            }
        }
    }

    /// Where value `j` of lane `c` lives in a group-block: byte, and the shift of a Q4_1 nibble.
    fn packed_at(self, c: usize, j: usize) -> (usize, u32) {
        let (s, t) = (j / STEP, j % STEP);
        match self {
            Format::Q4_1 => ((s / 2) * 32 + STEP * c + t, 4 * (s % 2) as u32),
            Format::Q8_0 | Format::Q8x16 => (s * 32 + STEP * c + t, 0),
        }
    }
}

impl QuantMatrix {
    /// The rows of `parts` (all of one format, all the same width), stacked in order.
    pub(crate) fn new(parts: &[QTensor]) -> Result<Self> {
        let format = Format::of(parts[0].dtype()).expect("a format with a kernel");
        let cols = parts[0].shape().dims2()?.1;
        // Each part's GGUF blocks, with its type (Q5_0 and Q8_0 parts stack, as do Q4_K and Q4_1).
        let mut raw: Vec<(GgmlDType, std::borrow::Cow<'_, [u8]>)> = Vec::new();
        let mut rows = 0;
        for t in parts {
            let (r, c) = t.shape().dims2()?;
            let dtype = t.dtype();
            if c % dtype.block_size() != 0 || c != cols || Format::of(dtype) != Some(format) {
                return Err(crate::ModelError::Forward {
                    message: format!(
                        "{format:?} matrix: a {dtype:?} part of width {c} does not stack with \
                         width {cols} (a multiple of {})",
                        dtype.block_size()
                    ),
                });
            }
            let data = t.data()?;
            debug_assert_eq!(
                data.len(),
                r * cols / dtype.block_size() * dtype.type_size()
            );
            raw.push((dtype, data));
            rows += r;
        }
        let nb = cols / QK;
        let blocks = rows.div_ceil(LANES) * nb;
        let scales = format.scales();
        let mut m = Self {
            format,
            rows,
            cols,
            qs: vec![0; blocks * format.group_bytes()],
            d: vec![0.0; blocks * scales * LANES],
            m: match format {
                Format::Q4_1 => vec![0.0; blocks * LANES],
                Format::Q8_0 | Format::Q8x16 => Vec::new(),
            },
        };
        let gb = format.group_bytes();
        let mut n = 0;
        for (dtype, data) in &raw {
            Format::gguf_blocks(*dtype, data, |block| {
                let (row, i) = (n / nb, n % nb);
                let (at, c) = ((row / LANES) * nb + i, row % LANES);
                for h in 0..scales {
                    m.d[(at * scales + h) * LANES + c] = block.d[h];
                }
                if format == Format::Q4_1 {
                    m.m[at * LANES + c] = block.m;
                }
                let out = &mut m.qs[at * gb..(at + 1) * gb];
                for (j, &q) in block.q.iter().enumerate() {
                    let (byte, shift) = format.packed_at(c, j);
                    out[byte] |= q << shift;
                }
                n += 1;
            });
        }
        Ok(m)
    }

    /// Weight group `g`: rows `g·LANES..(g+1)·LANES`.
    fn group(&self, g: usize) -> Group<'_> {
        let nb = self.cols / QK;
        let gb = self.format.group_bytes();
        let scales = g * nb * LANES..(g + 1) * nb * LANES;
        let d = self.format.scales() * LANES;
        Group {
            format: self.format,
            blocks: nb,
            qs: &self.qs[g * nb * gb..(g + 1) * nb * gb],
            d: &self.d[g * nb * d..(g + 1) * nb * d],
            m: match self.format {
                Format::Q4_1 => &self.m[scales],
                Format::Q8_0 | Format::Q8x16 => &[],
            },
        }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (m, _) = x.dims2()?;
        let x = x.contiguous()?;
        let mut dst = Vec::new();
        crate::host_mem::with_host_slice(&x, |xs| self.forward_host(xs, m, &mut dst))??;
        Ok(Tensor::from_vec(dst, (m, self.rows), x.device())?)
    }

    /// `m` rows of `xs` times the weights into `dst` (`[m, rows]`). `dst` is resized, not cleared:
    /// every element is written, so a buffer reused across calls is never zeroed.
    pub(crate) fn forward_host(&self, xs: &[f32], m: usize, dst: &mut Vec<f32>) -> Result<()> {
        let k = self.cols;
        if xs.len() != m * k {
            return Err(crate::ModelError::Forward {
                message: format!(
                    "{:?} matmul: input of {} values is not {m} rows of width {k}",
                    self.format,
                    xs.len()
                ),
            });
        }
        let n = self.rows;
        dst.resize(m * n, 0.0);
        let dst_ptr = SharedMut::new(dst);
        ACTS.with(|cell| {
            let mut a = cell.borrow_mut();
            quantize_rows(xs, m, k, &mut a);
            // Row views made once, not per group and tile.
            let acts: Vec<Act> = (0..m).map(|r| a.row(r, k)).collect();
            let avx = Avx2::detect();
            // A work item is one group: its weights stay in L1 while every activation row streams
            // past, so they are read from memory once per call whatever the number of rows.
            candle_core::utils::barrier_pool().execute_chunked(n.div_ceil(LANES), |range| {
                for g in range {
                    let w = self.group(g);
                    let cols = LANES.min(n - g * LANES);
                    let store = |r: usize, out: &[f32; LANES]| {
                        // SAFETY: each (row, column) is written by exactly one work item, and
                        // `g·LANES + cols <= n`.
                        let to = unsafe { dst_ptr.slice(r * n + g * LANES, cols) };
                        if let Ok(full) = <&mut [f32; LANES]>::try_from(&mut *to) {
                            // A fixed-size copy, not a `memmove` call per row and group.
                            *full = *out;
                        } else {
                            to.copy_from_slice(&out[..cols]);
                        }
                    };
                    let mut r = 0;
                    while r < m {
                        if avx.is_some() && m - r >= ROW_TILE {
                            // SAFETY: `avx` is `Some`: an `Avx2` exists only where AVX2 and FMA were detected.
                            let out = unsafe { group_avx2::<ROW_TILE>(&w, &acts[r..r + ROW_TILE]) };
                            for (i, o) in out.iter().enumerate() {
                                store(r + i, o);
                            }
                            r += ROW_TILE;
                        } else {
                            let out = if avx.is_some() {
                                // SAFETY: as above.
                                unsafe { group_avx2::<1>(&w, &acts[r..r + 1])[0] }
                            } else {
                                group_scalar(&w, &acts[r])
                            };
                            store(r, &out);
                            r += 1;
                        }
                    }
                }
            });
        });
        Ok(())
    }
}

thread_local! {
    /// Quantized activations, reused across calls.
    static ACTS: std::cell::RefCell<QuantRows> = const {
        std::cell::RefCell::new(QuantRows { qs: Vec::new(), d: Vec::new(), s: Vec::new() })
    };
}

/// One group of [`LANES`] weight rows.
struct Group<'a> {
    format: Format,
    /// 32-value blocks per row.
    blocks: usize,
    qs: &'a [u8],
    d: &'a [f32],
    m: &'a [f32],
}

/// One quantized activation row.
#[derive(Clone, Copy)]
struct Act<'a> {
    qs: &'a [i8],
    d: &'a [f32],
    s: &'a [f32],
}

impl QuantRows {
    fn row(&self, r: usize, k: usize) -> Act<'_> {
        let nb = k / QK;
        Act {
            qs: &self.qs[r * k..(r + 1) * k],
            d: &self.d[r * nb..(r + 1) * nb],
            s: &self.s[r * nb..(r + 1) * nb],
        }
    }
}

/// llama.cpp's `quantize_row_q8_1` (and, ignoring `s`, `quantize_row_q8_0`): per block,
/// `d = max|x| / 127`, `q = round(x·127/max|x|)`, `s = d·Σq`. Rows are shared out on the pool
/// when there are several.
fn quantize_rows(xs: &[f32], m: usize, k: usize, out: &mut QuantRows) {
    let nb = m * k / QK;
    out.qs.resize(m * k, 0);
    out.d.resize(nb, 0.0);
    out.s.resize(nb, 0.0);
    let per_row = k / QK;
    let (qs, d, s) = (
        SharedMut::new(&mut out.qs),
        SharedMut::new(&mut out.d),
        SharedMut::new(&mut out.s),
    );
    let avx = Avx2::detect();
    let rows = |range: std::ops::Range<usize>| {
        for r in range {
            // SAFETY: each row's values, scales and sums are written by one work item only.
            let (q, d, s) = unsafe {
                (
                    qs.slice(r * k, k),
                    d.slice(r * per_row, per_row),
                    s.slice(r * per_row, per_row),
                )
            };
            let x = &xs[r * k..(r + 1) * k];
            #[cfg(target_arch = "x86_64")]
            if avx.is_some() {
                // SAFETY: `avx` is `Some`: an `Avx2` exists only where AVX2 and FMA were detected.
                unsafe { quantize_row_avx2(x, q, d, s) };
                continue;
            }
            quantize_row(x, q, d, s);
        }
    };
    if m >= 4 {
        candle_core::utils::barrier_pool().execute_chunked(m, rows);
    } else {
        rows(0..m);
    }
}

/// [`quantize_row`] in AVX2: the same products `x·id`, rounded half to even by `cvtps` under the
/// default rounding mode, so the bytes are identical.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(xs: &[f32], qs: &mut [i8], ds: &mut [f32], ss: &mut [f32]) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    for (((x, q), d_out), s_out) in xs
        .chunks_exact(QK)
        .zip(qs.chunks_exact_mut(QK))
        .zip(ds.iter_mut())
        .zip(ss.iter_mut())
    {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let abs = |v| _mm256_andnot_ps(sign, v);
        let m = _mm256_max_ps(
            _mm256_max_ps(abs(v[0]), abs(v[1])),
            _mm256_max_ps(abs(v[2]), abs(v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let i: [__m256i; 4] = std::array::from_fn(|j| _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id)));
        let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let sum = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let sum = _mm_add_epi32(sum, _mm_unpackhi_epi64(sum, sum));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32(sum, 1)));
        // Packing works per 128-bit lane; the permute puts the 32 bytes back in order.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, bytes);
        *d_out = f16::from_f32(d).to_f32();
        *s_out = f16::from_f32(d * sum as f32).to_f32();
    }
}

fn quantize_row(xs: &[f32], qs: &mut [i8], ds: &mut [f32], ss: &mut [f32]) {
    for (((x, q), d_out), s_out) in xs
        .chunks_exact(QK)
        .zip(qs.chunks_exact_mut(QK))
        .zip(ds.iter_mut())
        .zip(ss.iter_mut())
    {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (qi, &xi) in q.iter_mut().zip(x) {
            // Round half to even, as llama.cpp's SIMD quantizer does; |x·id| ≤ 127, so adding and
            // subtracting 1.5·2^23 rounds in the FPU's default mode without a libm call.
            *qi = (((xi * id) + ROUND_MAGIC) - ROUND_MAGIC) as i8;
            sum += *qi as i32;
        }
        *d_out = f16::from_f32(d).to_f32();
        *s_out = f16::from_f32(d * sum as f32).to_f32();
    }
}

/// The group's [`LANES`] dot products with one activation row, in the SIMD path's order: per
/// block (per half-block for Q8x16), `acc = fma(d_w·d_a, Σq_w·q_a, acc)`, then for Q4_1
/// `acc = fma(m_w, s_a, acc)`.
fn group_scalar(w: &Group, a: &Act) -> [f32; LANES] {
    let gb = w.format.group_bytes();
    let scales = w.format.scales();
    let span = QK / scales;
    let mut acc = [0f32; LANES];
    for (i, x) in a.qs.chunks_exact(QK).enumerate() {
        let block = &w.qs[i * gb..(i + 1) * gb];
        for (c, acc) in acc.iter_mut().enumerate() {
            for h in 0..scales {
                let isum: i32 = (h * span..(h + 1) * span)
                    .map(|j| {
                        let (byte, shift) = w.format.packed_at(c, j);
                        let q = match w.format {
                            Format::Q4_1 => ((block[byte] >> shift) & 0x0F) as i32,
                            Format::Q8_0 | Format::Q8x16 => block[byte] as i8 as i32,
                        };
                        q * x[j] as i32
                    })
                    .sum();
                let d = w.d[(i * scales + h) * LANES + c];
                *acc = (d * a.d[i]).mul_add(isum as f32, *acc);
            }
            if w.format == Format::Q4_1 {
                *acc = w.m[i * LANES + c].mul_add(a.s[i], *acc);
            }
        }
    }
    acc
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn group_avx2<const R: usize>(_: &Group, _: &[Act]) -> [[f32; LANES]; R] {
    unreachable!("no Avx2 is ever made off x86-64")
}

/// The group's [`LANES`] dot products with each of `R` activation rows; each group-block is
/// loaded (and for Q4_1 unpacked) once for all of them.
///
/// Q4_1 sums a block's eight steps in 16-bit lanes before widening: a step's `maddubs` pair is at
/// most 2·15·127 = 3,810, so eight of them stay below 2^15. Q8_0 pairs reach 2·127·127 and widen
/// every step. Q8x16 sums each half-block's four steps apart, to scale them apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_avx2<const R: usize>(w: &Group, a: &[Act]) -> [[f32; LANES]; R] {
    use std::arch::x86_64::*;
    // A slice, not an array of `R` rows: building that array per call was a `memmove`.
    let a: &[Act; R] = a.try_into().expect("R activation rows");
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let gb = w.format.group_bytes();
    // Four activation bytes, broadcast to every lane.
    let bcast = |r: usize, at: usize| {
        _mm256_set1_epi32((a[r].qs.as_ptr().add(at) as *const i32).read_unaligned())
    };
    let mut acc = [_mm256_setzero_ps(); R];
    // `ints` into `acc` with the weight scales at `wd`: `acc = fma(d_w·d_a, Σ, acc)`.
    let scale_into = |acc: &mut [__m256; R], ints: &[__m256i; R], wd: *const f32, i: usize| {
        let wd = _mm256_loadu_ps(wd);
        for r in 0..R {
            let scale = _mm256_mul_ps(wd, _mm256_set1_ps(*a[r].d.get_unchecked(i)));
            acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(ints[r]), acc[r]);
        }
    };
    // Steps `steps` of a signed-byte group-block into fresh 32-bit sums.
    let signed_steps = |qs: *const u8, i: usize, steps: std::ops::Range<usize>| {
        let mut ints = [_mm256_setzero_si256(); R];
        for s in steps {
            let wq = _mm256_loadu_si256(qs.add(32 * s) as *const __m256i);
            // maddubs takes unsigned × signed: |w| against a with w's sign.
            let wabs = _mm256_sign_epi8(wq, wq);
            for (r, int) in ints.iter_mut().enumerate() {
                let signed = _mm256_sign_epi8(bcast(r, i * QK + STEP * s), wq);
                let pairs = _mm256_maddubs_epi16(wabs, signed);
                *int = _mm256_add_epi32(*int, _mm256_madd_epi16(pairs, ones));
            }
        }
        ints
    };
    for i in 0..w.blocks {
        let qs = w.qs.as_ptr().add(i * gb);
        match w.format {
            Format::Q4_1 => {
                let mut ints = [_mm256_setzero_si256(); R];
                for p in 0..STEPS / 2 {
                    let packed = _mm256_loadu_si256(qs.add(32 * p) as *const __m256i);
                    let lo = _mm256_and_si256(packed, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                    let at = i * QK + 2 * STEP * p;
                    for (r, int) in ints.iter_mut().enumerate() {
                        let s = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, bcast(r, at)),
                            _mm256_maddubs_epi16(hi, bcast(r, at + STEP)),
                        );
                        *int = _mm256_add_epi16(*int, s);
                    }
                }
                for int in ints.iter_mut() {
                    *int = _mm256_madd_epi16(*int, ones);
                }
                scale_into(&mut acc, &ints, w.d.as_ptr().add(i * LANES), i);
                let wm = _mm256_loadu_ps(w.m.as_ptr().add(i * LANES));
                for r in 0..R {
                    acc[r] = _mm256_fmadd_ps(wm, _mm256_set1_ps(*a[r].s.get_unchecked(i)), acc[r]);
                }
            }
            Format::Q8_0 => {
                let ints = signed_steps(qs, i, 0..STEPS);
                scale_into(&mut acc, &ints, w.d.as_ptr().add(i * LANES), i);
            }
            Format::Q8x16 => {
                for h in 0..2 {
                    let ints = signed_steps(qs, i, h * STEPS / 2..(h + 1) * STEPS / 2);
                    scale_into(&mut acc, &ints, w.d.as_ptr().add((2 * i + h) * LANES), i);
                }
            }
        }
    }
    let mut out = [[0f32; LANES]; R];
    for r in 0..R {
        _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::gemm_add::GemmAdd;
    use super::super::{Fused, GpuForms, Linear};

    /// Dense from 4 rows, Q8_0 through the 8-bit GEMV below.
    const Q8_GEMV_FROM_4: GpuForms = GpuForms {
        dense_from: 4,
        q8_gemv: true,
        gemv_prefetch: 0,
    };
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module};

    /// `GemmAdd`'s CPU side (the GPU test's reference) adds each row's products into the stream
    /// in place, against the same sums in f64, at an offset into the stream's storage; and names
    /// shapes that do not fit.
    #[test]
    fn gemm_add_adds_the_products_into_the_stream() {
        use crate::simd::testing::values;
        let (rows, inputs, outputs) = (3, 70, 9);
        let x0 = values(1, 2 * rows * outputs, -2.0, 2.0);
        let (a, w) = (
            values(2, rows * inputs, -1.0, 1.0),
            values(3, outputs * inputs, -1.0, 1.0),
        );
        let dev = Device::Cpu;
        let f16s = |v: &[f32], shape: (usize, usize)| {
            Tensor::from_vec(v.iter().map(|&x| f16::from_f32(x)).collect(), shape, &dev).unwrap()
        };
        let (at, wt) = (f16s(&a, (rows, inputs)), f16s(&w, (outputs, inputs)));
        // The stream: the second half of a larger tensor (a view with an offset).
        let whole = Tensor::from_vec(x0.clone(), (2 * rows, outputs), &dev).unwrap();
        let x = whole.narrow(0, rows, rows).unwrap();
        x.inplace_op3(&at, &wt, &GemmAdd).unwrap();
        let got = whole.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(
            got[..rows * outputs],
            x0[..rows * outputs],
            "outside the view"
        );
        let round = |v: f32| f16::from_f32(v).to_f32() as f64;
        for r in 0..rows {
            for o in 0..outputs {
                let dot: f64 = (0..inputs)
                    .map(|i| round(a[r * inputs + i]) * round(w[o * inputs + i]))
                    .sum();
                let want = x0[(rows + r) * outputs + o] as f64 + dot;
                let g = got[(rows + r) * outputs + o] as f64;
                assert!(
                    (g - want).abs() < 1e-4,
                    "row {r}, output {o}: {g} against {want}"
                );
            }
        }
        let err = x.inplace_op3(&wt, &at, &GemmAdd).unwrap_err().to_string();
        assert!(err.contains("add into the stream"), "{err}");
    }

    /// Each kernel against candle's own dequantize-then-matmul on random weights, and the SIMD path
    /// against the scalar one.
    fn matches_dequantized_weights(dtype: GgmlDType) {
        let dev = Device::Cpu;
        // 43 rows: a last group with 3 real rows; 6 activation rows: a tile of 4 and two single rows;
        // two super-blocks of the K-quants.
        let (n, k, m) = (43, 512, 6);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        let exact = q.dequantize(&dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let want = x.matmul(&exact.t().unwrap()).unwrap();
        let mat = QuantMatrix::new(std::slice::from_ref(&q)).unwrap();
        assert_eq!(mat.format, Format::of(dtype).unwrap());
        let got = mat.forward(&x).unwrap();
        let max_abs = |t: &Tensor| {
            t.abs()
                .and_then(|a| a.max_all())
                .and_then(|m| m.to_scalar::<f32>())
                .unwrap()
        };
        let diff = max_abs(&(&got - &want).unwrap());
        let scale = max_abs(&want);
        // 8-bit activations: about 1% of the largest output.
        assert!(diff < 0.02 * scale, "{dtype:?}: {diff} vs {scale}");
        // The SIMD path, in tiles of 4 and 1, and the scalar one compute the same integer sums
        // and round the same float operations.
        let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut a = QuantRows::default();
        quantize_rows(&xs, m, k, &mut a);
        let got = got.to_vec2::<f32>().unwrap();
        for g in 0..n.div_ceil(LANES) {
            let w = mat.group(g);
            for (r, got) in got.iter().enumerate() {
                let s = group_scalar(&w, &a.row(r, k));
                let cols = LANES.min(n - g * LANES);
                assert_eq!(
                    s[..cols],
                    got[g * LANES..g * LANES + cols],
                    "{dtype:?} row {r}"
                );
                if Avx2::detect().is_some() {
                    let one = unsafe { group_avx2::<1>(&w, &[a.row(r, k)]) };
                    assert_eq!(s, one[0], "{dtype:?} row {r}");
                }
            }
        }
    }

    /// The dual projection: below its switch the quantized weights (Q8_0 through the 8-bit GEMV
    /// with `q8_gemv`, within f32 rounding of the dequantized weights, where candle's matmul
    /// rounds the activations to 8 bits), from it the f16 copy, within f16 rounding of the
    /// dequantized weights; 0 keeps only the quantized form. Other formats, a switch above the
    /// GEMV's rows, and Q8_0 without `q8_gemv` take candle's matmul below the switch, exactly.
    #[test]
    fn dual_weights_switch_at_their_row_count() {
        let dev = Device::Cpu;
        let (n, k) = (40, 256);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let exact = q.dequantize(&dev).unwrap();
        let quant = QMatMul::from_qtensor(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap()).unwrap();
        let dual = Linear::dual(q, &dev, Q8_GEMV_FROM_4).unwrap();
        assert!(matches!(dual, Linear::Dual { dense_from: 4, .. }));
        let rel = |a: &Tensor, b: &Tensor| {
            let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            crate::simd::testing::relative_error(&v(a), &v(b))
        };
        for m in [1usize, 3, 4, 9] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
            let got = dual.forward(&x).unwrap();
            assert_eq!(got.dims(), [m, n]);
            assert_eq!(got.dtype(), candle_core::DType::F32);
            if m < 4 {
                let want = x.matmul(&exact.t().unwrap()).unwrap();
                let err = rel(&got, &want);
                assert!(err < 1e-6, "{m} rows: the 8-bit GEMV off by {err}");
                let candle = rel(&got, &quant.forward(&x).unwrap());
                assert!(
                    candle > 1e-4,
                    "{m} rows: not candle's 8-bit activations ({candle})"
                );
            } else {
                let want = x.matmul(&exact.t().unwrap()).unwrap();
                let err = rel(&got, &want);
                // f16 inputs and weights: about 2^-11 relative each.
                assert!(err < 2e-3, "{m} rows: dense path off by {err}");
                let q8 = quant.forward(&x).unwrap();
                assert!(rel(&got, &q8) > 0.0, "{m} rows: the dense path ran");
            }
        }
        let off = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        assert!(matches!(
            Linear::dual(off, &dev, GpuForms::dense_from(0)).unwrap(),
            Linear::Candle(_)
        ));
        let x = Tensor::randn(0f32, 1.0, (2, k), &dev).unwrap();
        for (format, forms) in [
            (GgmlDType::Q4_1, Q8_GEMV_FROM_4),
            (
                GgmlDType::Q8_0,
                GpuForms {
                    dense_from: 32,
                    q8_gemv: true,
                    gemv_prefetch: 0,
                },
            ),
            (GgmlDType::Q8_0, GpuForms::dense_from(4)),
        ] {
            let dual = Linear::dual(QTensor::quantize(&w, format).unwrap(), &dev, forms).unwrap();
            assert!(matches!(
                dual,
                Linear::Dual {
                    quant: super::super::Small::Candle(_),
                    ..
                }
            ));
            let want = QMatMul::from_qtensor(QTensor::quantize(&w, format).unwrap())
                .unwrap()
                .forward(&x)
                .unwrap();
            assert_eq!(rel(&dual.forward(&x).unwrap(), &want), 0.0, "{format:?}");
        }
    }

    /// A fused projection's output is its parts' outputs side by side: for parts that each switch
    /// alone (`Separate`) and for the GPU's stacked f16 weights (`Dense`, here on the CPU), on
    /// either side of the switch, equal to each part alone (the stacked GEMM's f16 output is the
    /// part's, before its cast to f32).
    #[test]
    fn fused_parts_side_by_side_equal_each_part_alone() {
        let dev = Device::Cpu;
        let k = 256;
        let weights = [40usize, 24].map(|n| Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap());
        let quantized = || {
            weights
                .iter()
                .map(|w| QTensor::quantize(w, GgmlDType::Q8_0).unwrap())
        };
        let alone: Vec<Linear> = quantized()
            .map(|q| Linear::dual(q, &dev, Q8_GEMV_FROM_4).unwrap())
            .collect();
        let separate = Fused::Separate(
            quantized()
                .map(|q| Linear::dual(q, &dev, Q8_GEMV_FROM_4).unwrap())
                .collect(),
        );
        let dense = Fused::stack(
            quantized()
                .map(|q| Linear::dual(q, &dev, Q8_GEMV_FROM_4).unwrap())
                .collect(),
        )
        .unwrap();
        assert!(matches!(dense, Fused::Dense { dense_from: 4, .. }));
        let v = crate::simd::testing::f32s;
        for m in [1usize, 3, 4, 9] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
            let want: Vec<Tensor> = alone.iter().map(|l| l.forward(&x).unwrap()).collect();
            let want = v(&Tensor::cat(&want, 1).unwrap());
            for (fused, what) in [(&separate, "separate"), (&dense, "stacked")] {
                let got = fused.forward(&x).unwrap();
                assert_eq!(got.dims(), [m, 64], "{what}");
                let dtype = if m >= 4 && what == "stacked" {
                    candle_core::DType::F16
                } else {
                    candle_core::DType::F32
                };
                assert_eq!(got.dtype(), dtype, "{what}, {m} rows");
                assert_eq!(v(&got), want, "{what}, {m} rows");
            }
        }
        // A part without a quantized form keeps the parts apart.
        let f32_part = QTensor::quantize(&weights[0], GgmlDType::F32).unwrap();
        let q8 = QTensor::quantize(&weights[1], GgmlDType::Q8_0).unwrap();
        let parts = vec![
            Linear::dual(f32_part, &dev, Q8_GEMV_FROM_4).unwrap(),
            Linear::dual(q8, &dev, Q8_GEMV_FROM_4).unwrap(),
        ];
        assert!(matches!(Fused::stack(parts).unwrap(), Fused::Separate(_)));
    }

    /// The AVX2 activation quantizer writes the scalar one's bytes, scales and sums, on random
    /// rows, an all-zero block and a block of exact halves (`x·127/max|x|` = k + 0.5, which must
    /// round to even).
    #[test]
    fn quantizers_agree() {
        if !crate::simd::testing::avx2_or_say("quantizers_agree") {
            return;
        }
        let mut x = crate::simd::testing::values(0x2545_f491_4f6c_dd1d, QK * 64, -4.0, 4.0);
        x[..QK].fill(0.0);
        for (j, v) in x[QK..2 * QK].iter_mut().enumerate() {
            // max|x| = 127, so id = 1 and x itself is rounded.
            *v = if j == 0 { 127.0 } else { j as f32 - 16.5 };
        }
        let nb = x.len() / QK;
        let (mut qa, mut da, mut sa) = (vec![0i8; x.len()], vec![0f32; nb], vec![0f32; nb]);
        let (mut qb, mut db, mut sb) = (qa.clone(), da.clone(), sa.clone());
        quantize_row(&x, &mut qa, &mut da, &mut sa);
        unsafe { quantize_row_avx2(&x, &mut qb, &mut db, &mut sb) };
        assert_eq!(qa, qb);
        assert_eq!(da, db);
        assert_eq!(sa, sb);
        assert_eq!(qa[QK + 1], -16, "-15.5 rounds to even");
        assert_eq!(qa[QK + 2], -14, "-14.5 rounds to even");
    }

    /// The GGUF types with a kernel here (some repacked into another's form).
    const KERNEL_FORMATS: [GgmlDType; 5] = [
        GgmlDType::Q4_1,
        GgmlDType::Q8_0,
        GgmlDType::Q5_0,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ];

    /// Every format with a kernel here, against the same matmul on dequantized weights: Q4_1 and
    /// Q8_0 on their own kernels; Q5_0 on the Q8_0 kernel (its unpacking: high bits, nibble
    /// order, the offset of 16); Q4_K on the Q4_1 kernel (packed 6-bit scales and minimums,
    /// sub-block nibble order) and Q6_K on Q8x16 (split low and high bits, sixteen signed
    /// scales), each checked against candle's own dequantization of the same blocks.
    #[test]
    fn every_kernel_format_matches_dequantized_weights() {
        for dtype in KERNEL_FORMATS {
            matches_dequantized_weights(dtype);
        }
    }

    /// The repacked weights are exactly candle's (and llama.cpp's) dequantized values: every
    /// format's decoding of a GGUF block times its scale, against `QTensor::dequantize`, bit for
    /// bit.
    #[test]
    fn decoded_blocks_equal_dequantized_weights() {
        let dev = Device::Cpu;
        let (n, k) = (3, 512);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        for dtype in KERNEL_FORMATS {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let want = q
                .dequantize(&dev)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let format = Format::of(dtype).unwrap();
            let mut got = Vec::new();
            Format::gguf_blocks(dtype, &q.data().unwrap(), |b| {
                for (j, &v) in b.q.iter().enumerate() {
                    let d = b.d[j * format.scales() / QK];
                    got.push(match format {
                        Format::Q4_1 => d * v as f32 + b.m,
                        Format::Q8_0 | Format::Q8x16 => d * v as i8 as f32,
                    });
                }
            });
            assert_eq!(got.len(), want.len(), "{dtype:?}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{dtype:?} value {i}: {g} vs {w}");
            }
        }
    }

    /// candle's Q8_0 (and Q5_0) matmul quantizes activations the same way and sums the same integer products,
    /// so the kernel agrees with it to float rounding. (Its Q4_1 rounds `s` as `f16(Σq)·f16(d)`,
    /// not `f16(d·Σq)` as llama.cpp does, so Q4_1 is checked against the block formula instead.)
    #[test]
    fn q8_0_matmul_matches_candle() {
        let dev = Device::Cpu;
        let (n, k, m) = (33, 128, 7);
        // Fixed data: candle rounds half away from zero through 1/d, llama.cpp (and this kernel)
        // half to even through 127/max, so a value within an ulp of a tie may round apart; these
        // have none.
        let wave = |len: usize, f: f32| -> Vec<f32> {
            (0..len).map(|i| (i as f32 * f).sin() * 2.0).collect()
        };
        let w = Tensor::from_vec(wave(n * k, 0.37), (n, k), &dev).unwrap();
        let x = Tensor::from_vec(wave(m * k, 0.71), (m, k), &dev).unwrap();
        // Q5_0 too: candle multiplies it against the same 8-bit activations (ggml's `q5_0·q8_0`).
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q5_0] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let ours = QuantMatrix::new(std::slice::from_ref(&q))
                .unwrap()
                .forward(&x)
                .unwrap();
            let theirs = QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap();
            let diff = (ours - theirs)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-3, "{dtype:?}: {diff}");
        }
    }

    /// The repacked kernel against llama.cpp's `ggml_vec_dot_q4_1_q8_1` formula evaluated on the
    /// GGUF block bytes themselves: `Σ_blocks d_w·d_a·Σ(q_w·q_a) + m_w·s_a`, with `q_w` read from
    /// the nibbles as GGUF lays them out (low nibbles first). This does not share the repacking.
    #[test]
    fn q4_1_matmul_matches_the_block_formula() {
        let dev = Device::Cpu;
        let (n, k, m) = (19, 160, 5);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let got = QuantMatrix::new(std::slice::from_ref(&q))
            .unwrap()
            .forward(&x)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut a = QuantRows::default();
        quantize_rows(&xs, m, k, &mut a);
        let raw = q.data().unwrap();
        let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32() as f64;
        for (c, row) in raw.chunks_exact(k / QK * 20).enumerate() {
            for (r, got) in got.iter().enumerate() {
                let act = a.row(r, k);
                let mut want = 0f64;
                for (i, b) in row.chunks_exact(20).enumerate() {
                    let mut isum = 0i32;
                    for j in 0..QK / 2 {
                        isum += (b[4 + j] & 0x0F) as i32 * act.qs[i * QK + j] as i32;
                        isum += (b[4 + j] >> 4) as i32 * act.qs[i * QK + j + QK / 2] as i32;
                    }
                    want += isum as f64 * half(&b[0..2]) * act.d[i] as f64
                        + half(&b[2..4]) * act.s[i] as f64;
                }
                let err = (got[c] as f64 - want).abs();
                assert!(err <= 1e-5 * want.abs().max(1.0), "row {r} col {c}: {err}");
            }
        }
    }
}
