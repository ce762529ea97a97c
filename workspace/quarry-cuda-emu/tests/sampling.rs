//! The sampling kernel (`kernels/sampling.cu`: bans, masks, greedy, temperature, top-k, top-p,
//! one block of 512 threads per row, cub's block reductions and scans) on the CPU against the
//! host's draw (`SampleRows::pick_row`), as quarry-model's GPU test compares them, on the same
//! rows of every kind.

mod common;

use common::run;
use quarry_cuda_emu::{kernels, Buf};
use quarry_model::reference::SamplingCase;

const THREADS: u32 = 512;

/// Rows of every kind over a vocabulary that is not a multiple of 32 (the last tokens past the
/// mask's cover), with logits quantized so that many tie at the top-k and top-p boundaries: the
/// kernel's token equals the host's, except where the uniform sits within rounding of a boundary
/// between two tokens (the sums are added in another order); a NaN row and an all-masked row
/// give the host's errors. The case is `SamplingCase`, the GPU test's own.
#[test]
fn sampling_matches_the_host_draw_row_for_row() {
    let case = SamplingCase::new();
    let (vocab, words, rows) = (case.vocab, case.words_per_mask, &case.rows);
    let n = rows.rows();
    let mut dl = Buf::from_slice(&case.reversed);
    let dm = Buf::from_slice(&case.masks);
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
    // The statuses as the CUDA launcher reads them (src/cuda/sampling.rs).
    let (token, status) = (token.read("token"), status.read("status"));
    let got: Vec<Result<u32, String>> = token
        .iter()
        .zip(&status)
        .map(|(&t, &s)| match s {
            0 => Ok(t),
            1 => Err("every token is masked (all logits are -inf)".to_string()),
            _ => Err(format!("logit of token {t} is NaN")),
        })
        .collect();
    let (exact, boundary) = case.check(&got);
    eprintln!("sampling: {exact} rows equal the host's draw, {boundary} at a rounding boundary");
}
