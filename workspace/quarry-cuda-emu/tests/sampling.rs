//! The sampling kernel (`kernels/sampling.cu`: bans, masks, greedy, temperature, top-k, top-p,
//! one block of 512 threads per row, cub's block reductions and scans) on the CPU against the
//! host's draw (`SampleRows::pick_row`), as quarry-model's GPU test compares them, on the same
//! rows of every kind.

mod common;

use common::{run, values};
use quarry_cuda_emu::{kernels, Buf};
use quarry_model::{SampleRows, Sampler, SamplingParams};

const THREADS: u32 = 512;

fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
    }
}

/// Rows of every kind over a vocabulary that is not a multiple of 32 (the last tokens past the
/// mask's cover), with logits quantized so that many tie at the top-k and top-p boundaries: the
/// kernel's token equals the host's, except where the uniform sits within rounding of a boundary
/// between two tokens (the sums are added in another order); a NaN row and an all-masked row
/// give the host's errors.
#[test]
fn sampling_matches_the_host_draw_row_for_row() {
    let vocab = 49_157;
    let words = 1536; // covers 49,152 tokens: the last 5 are masked under a mask
    let n_masks = 3;
    let mut masks = vec![0u32; n_masks * words];
    let bits = values(77, n_masks * words, 0.0, 1.0);
    for (m, (w, b)) in masks.iter_mut().zip(&bits).enumerate() {
        // Mask 0 dense, mask 1 sparse, mask 2 a handful of tokens.
        *w = match m / words {
            0 => (b * u32::MAX as f32) as u32 | 0x0101_0101,
            1 => 1 << ((b * 32.0) as u32 % 32),
            _ if m % words < 4 => 0x8000_0001,
            _ => 0,
        };
    }
    let kinds = [
        params(0.0, 0, 1.0, 0),
        params(1.0, 0, 1.0, 1),
        params(0.7, 40, 1.0, 2),
        params(1.3, 0, 0.9, 3),
        params(0.8, 50, 0.95, 4),
        params(2.0, 1, 0.5, 5),
        params(0.5, 100_000, 0.3, 6),
    ];
    let mut rows = SampleRows::default();
    let mut logits = Vec::new();
    for (r, p) in kinds.iter().cycle().take(64).enumerate() {
        // Logits quantized to 1/8 so that many tie, including at the boundaries.
        let row: Vec<f32> = values(1000 + r as u64, vocab, -12.0, 12.0)
            .into_iter()
            .map(|x| (x * 8.0).round() / 8.0)
            .collect();
        logits.extend(row);
        let mut s = Sampler::new(SamplingParams {
            seed: r as u64,
            ..*p
        })
        .unwrap();
        let mask = match r % 4 {
            3 => None,
            m => Some(m as u32),
        };
        let bans: Vec<u32> = (0..(r % 3) as u32)
            .map(|i| i * 7919 % vocab as u32)
            .collect();
        rows.push(&mut s, r, mask, bans);
    }
    // A row with a NaN, and a row with every token masked by an empty mask.
    let nan_row = rows.rows();
    logits.extend((0..vocab).map(|i| if i == 4242 { f32::NAN } else { 0.0 }));
    rows.push(&mut Sampler::new(kinds[1]).unwrap(), nan_row, None, []);
    let empty = masks.len() / words;
    masks.extend(std::iter::repeat_n(0, words));
    logits.extend(std::iter::repeat_n(1.0, vocab));
    rows.push(
        &mut Sampler::new(kinds[1]).unwrap(),
        nan_row + 1,
        Some(empty as u32),
        [],
    );
    // The rows read their logits through logit_row: reversed, so the indirection is tested.
    let n = rows.rows();
    let reversed: Vec<f32> = (0..n)
        .rev()
        .flat_map(|r| logits[r * vocab..(r + 1) * vocab].to_vec())
        .collect();
    for r in 0..n {
        rows.logit_row[r] = (n - 1 - r) as u32;
    }

    let mut dl = Buf::from_slice(&reversed);
    let dm = Buf::from_slice(&masks);
    let ban_ids = if rows.ban_ids.is_empty() {
        vec![0]
    } else {
        rows.ban_ids.clone()
    };
    let u32s = [
        &rows.logit_row,
        &rows.mask_index,
        &rows.ban_start,
        &ban_ids,
        &rows.top_k,
    ]
    .map(|a| Buf::from_slice(a));
    let [logit_row, mask_index, ban_start, bans, top_k] = u32s.each_ref().map(|b| b.ptr());
    let (temperature, top_p) = (
        Buf::from_slice(&rows.temperature),
        Buf::from_slice(&rows.top_p),
    );
    let uniform = Buf::from_slice(&rows.uniform);
    let (mut token, mut status) = (Buf::<u32>::poisoned(n), Buf::<u32>::poisoned(n));
    let kernel = kernels::sampling::by_name("sample_rows").unwrap();
    let (lp, mp, tp, pp, up) = (
        dl.ptr_mut(),
        dm.ptr(),
        temperature.ptr(),
        top_p.ptr(),
        uniform.ptr(),
    );
    let (tokp, stp) = (token.ptr_mut(), status.ptr_mut());
    unsafe {
        run("sample_rows", (n as u32, 1, 1), THREADS, 0, || {
            kernel(
                lp,
                logit_row,
                vocab as u32,
                mp,
                words as u32,
                mask_index,
                ban_start,
                bans,
                tp,
                top_k,
                pp,
                up,
                tokp,
                stp,
            )
        })
    };
    let (token, status) = (token.read("token"), status.read("status"));
    let mut scratch = Vec::new();
    let (mut exact, mut boundary) = (0, 0);
    for r in 0..n {
        let row = || logits[r * vocab..(r + 1) * vocab].to_vec();
        let want = rows.pick_row(r, &mut row(), &masks, words, &mut scratch);
        match (want, status[r]) {
            (Ok(w), 0) if w == token[r] => exact += 1,
            (Ok(w), 0) => {
                let g = token[r];
                let mut moved = rows.clone();
                let near = [-1e-9, 1e-9].iter().any(|d| {
                    moved.uniform[r] = rows.uniform[r] + d;
                    moved
                        .pick_row(r, &mut row(), &masks, words, &mut scratch)
                        .ok()
                        == Some(g)
                });
                assert!(
                    near,
                    "row {r} ({:?}): host {w}, kernel {g}",
                    kinds[r % kinds.len()]
                );
                boundary += 1;
            }
            (Err(e), 1) => assert!(
                e.to_string().contains("every token is masked"),
                "row {r}: {e}"
            ),
            (Err(e), 2) => {
                let nan = format!("logit of token {} is NaN", token[r]);
                assert!(
                    e.to_string().contains(&nan),
                    "row {r}: host {e}, kernel {nan}"
                );
            }
            (w, s) => panic!("row {r}: host {w:?}, kernel status {s} token {}", token[r]),
        }
    }
    eprintln!("sampling: {exact} rows equal the host's draw, {boundary} at a rounding boundary");
    assert!(boundary <= 2, "{boundary} rows differ: more than rounding");
    assert!(exact >= n - 2 - 2, "{exact} of {n} rows exact");
}
