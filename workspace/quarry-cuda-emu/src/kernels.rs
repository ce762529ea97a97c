//! The kernels' entry points as compiled for the CPU, by family: each family's forms share one
//! signature (16-bit and f32 element pointers as `c_void`), and `by_name` finds a form by the name
//! the CUDA launcher loads, so a test follows the launcher's own choice (e.g.
//! [`quarry_model::kernel_plan::AttentionPlan`]'s). The signatures are those of
//! `workspace/quarry-model/kernels/*.cu`, which the launchers in `quarry-model/src/cuda/` pass
//! their arguments to in the same order.

macro_rules! family {
    ($(#[$doc:meta])* $module:ident: fn $args:tt { $($name:ident),* $(,)? }) => {
        $(#[$doc])*
        pub mod $module {
            #[allow(unused_imports)]
            use std::ffi::c_void;

            /// The family's signature.
            pub type Kernel = unsafe extern "C" fn $args;

            $(declare!($name $args);)*

            /// The form compiled under `name`, if the family has one.
            pub fn by_name(name: &str) -> Option<Kernel> {
                match name {
                    $(stringify!($name) => Some($name as Kernel),)*
                    _ => None,
                }
            }
        }
    };
}

macro_rules! declare {
    ($name:ident ($($arg:ty),* $(,)?)) => {
        extern "C" {
            fn $name($(_: $arg),*);
        }
    };
}

family! {
    /// `paged_attention_*` (per-dimension) and `paged_attention_warps*`: q, k, v, token_seq,
    /// token_pos, page_start, block_table, out (f32, or f16 for the `_out16` forms), n_head, n_kv,
    /// head_dim, page_size, scale, window, prefetch (the L2 prefetch's bits: 1 the value rows,
    /// 2 the key rows; the per-dimension forms ignore it).
    attention: fn(*const f32, *const c_void, *const c_void, *const u32, *const u32, *const u32,
                  *const u32, *mut c_void, i32, i32, i32, i32, f32, i32, i32) {
        paged_attention_f32, paged_attention_f16, paged_attention_bf16,
        paged_attention_f32_out16, paged_attention_f16_out16, paged_attention_bf16_out16,
        paged_attention_warps2g4_f32, paged_attention_warps2g4_f32_out16,
        paged_attention_warps2g4_f16, paged_attention_warps2g4_f16_out16,
        paged_attention_warps2g4_bf16, paged_attention_warps2g4_bf16_out16,
        paged_attention_warps4g4_f32, paged_attention_warps4g4_f32_out16,
        paged_attention_warps4g4_f16, paged_attention_warps4g4_f16_out16,
        paged_attention_warps4g4_bf16, paged_attention_warps4g4_bf16_out16,
        paged_attention_warps8g4_f32, paged_attention_warps8g4_f32_out16,
        paged_attention_warps8g4_f16, paged_attention_warps8g4_f16_out16,
        paged_attention_warps8g4_bf16, paged_attention_warps8g4_bf16_out16,
        paged_attention_warps2g8_f32, paged_attention_warps2g8_f32_out16,
        paged_attention_warps2g8_f16, paged_attention_warps2g8_f16_out16,
        paged_attention_warps2g8_bf16, paged_attention_warps2g8_bf16_out16,
        paged_attention_warps4g8_f32, paged_attention_warps4g8_f32_out16,
        paged_attention_warps4g8_f16, paged_attention_warps4g8_f16_out16,
        paged_attention_warps4g8_bf16, paged_attention_warps4g8_bf16_out16,
        paged_attention_warps8g8_f32, paged_attention_warps8g8_f32_out16,
        paged_attention_warps8g8_f16, paged_attention_warps8g8_f16_out16,
        paged_attention_warps8g8_bf16, paged_attention_warps8g8_bf16_out16,
    }
}

family! {
    /// `paged_attention_split*`: the attention's arguments, then chunk, ml, token_shared,
    /// slot0 (the cascade's prefix slots before the chunks; 0 elsewhere), and the last-block
    /// combine's counters, f32 output and f16 output (null counters: the combine's launch), and
    /// prefetch (as the one-token forms').
    attention_split: fn(*const f32, *const c_void, *const c_void, *const u32, *const u32,
                        *const u32, *const u32, *mut f32, i32, i32, i32, i32, f32, i32, i32,
                        *mut f32, *const u32, i32, *mut u32, *mut f32, *mut c_void, i32) {
        paged_attention_split2g4_f32, paged_attention_split2g4_f16, paged_attention_split2g4_bf16,
        paged_attention_split4g4_f32, paged_attention_split4g4_f16, paged_attention_split4g4_bf16,
        paged_attention_split8g4_f32, paged_attention_split8g4_f16, paged_attention_split8g4_bf16,
        paged_attention_split2g8_f32, paged_attention_split2g8_f16, paged_attention_split2g8_bf16,
        paged_attention_split4g8_f32, paged_attention_split4g8_f16, paged_attention_split4g8_bf16,
        paged_attention_split8g8_f32, paged_attention_split8g8_f16, paged_attention_split8g8_bf16,
    }
}

family! {
    /// `paged_attention_tiled*`: the attention's arguments, then the batch's tokens.
    attention_tiled: fn(*const f32, *const c_void, *const c_void, *const u32, *const u32,
                        *const u32, *const u32, *mut c_void, i32, i32, i32, i32, f32, i32, i32) {
        paged_attention_tiled2g4_f32, paged_attention_tiled2g4_f32_out16,
        paged_attention_tiled2g4_f16, paged_attention_tiled2g4_f16_out16,
        paged_attention_tiled2g4_bf16, paged_attention_tiled2g4_bf16_out16,
        paged_attention_tiled4g4_f32, paged_attention_tiled4g4_f32_out16,
        paged_attention_tiled4g4_f16, paged_attention_tiled4g4_f16_out16,
        paged_attention_tiled4g4_bf16, paged_attention_tiled4g4_bf16_out16,
        paged_attention_tiled8g4_f32, paged_attention_tiled8g4_f32_out16,
        paged_attention_tiled8g4_f16, paged_attention_tiled8g4_f16_out16,
        paged_attention_tiled8g4_bf16, paged_attention_tiled8g4_bf16_out16,
        paged_attention_tiled2g8_f32, paged_attention_tiled2g8_f32_out16,
        paged_attention_tiled2g8_f16, paged_attention_tiled2g8_f16_out16,
        paged_attention_tiled2g8_bf16, paged_attention_tiled2g8_bf16_out16,
        paged_attention_tiled4g8_f32, paged_attention_tiled4g8_f32_out16,
        paged_attention_tiled4g8_f16, paged_attention_tiled4g8_f16_out16,
        paged_attention_tiled4g8_bf16, paged_attention_tiled4g8_bf16_out16,
        paged_attention_tiled8g8_f32, paged_attention_tiled8g8_f32_out16,
        paged_attention_tiled8g8_f16, paged_attention_tiled8g8_f16_out16,
        paged_attention_tiled8g8_bf16, paged_attention_tiled8g8_bf16_out16,
    }
}

family! {
    /// `paged_attention_prefix*` (the cascade's shared prefix): q, k, v, token_seq, token_shared,
    /// page_start, block_table, part, ml, tokens, n_head, n_kv, head_dim, page_size, scale, slots.
    attention_prefix: fn(*const f32, *const c_void, *const c_void, *const u32, *const u32,
                         *const u32, *const u32, *mut f32, *mut f32, i32, i32, i32, i32, i32,
                         f32, i32) {
        paged_attention_prefix2g4_f32, paged_attention_prefix2g4_f16, paged_attention_prefix2g4_bf16,
        paged_attention_prefix4g4_f32, paged_attention_prefix4g4_f16, paged_attention_prefix4g4_bf16,
        paged_attention_prefix8g4_f32, paged_attention_prefix8g4_f16, paged_attention_prefix8g4_bf16,
        paged_attention_prefix2g8_f32, paged_attention_prefix2g8_f16, paged_attention_prefix2g8_bf16,
        paged_attention_prefix4g8_f32, paged_attention_prefix4g8_f16, paged_attention_prefix4g8_bf16,
        paged_attention_prefix8g8_f32, paged_attention_prefix8g8_f16, paged_attention_prefix8g8_bf16,
    }
}

family! {
    /// `paged_attention_combine` and `_out16`: part, ml, out (f32 or f16), head_dim, splits.
    combine: fn(*const f32, *const f32, *mut c_void, i32, i32) {
        paged_attention_combine, paged_attention_combine_out16,
    }
}

family! {
    /// `rms_norm_{in}_{out}`: x, out, w, width, eps.
    rms_norm: fn(*const c_void, *mut c_void, *const f32, i32, f32) {
        rms_norm_f32_f32, rms_norm_f32_f16, rms_norm_f16_f32, rms_norm_f16_f16,
    }
}

family! {
    /// `add_into_{y}`: x (f32, in place), y, n.
    add_into: fn(*mut f32, *const c_void, u64) { add_into_f32, add_into_f16 }
}

family! {
    /// `add_norm_{y}`: xh (f32: the stream's rows, in place, then room for as many normalized
    /// rows), y, w, width, eps; a block per row.
    add_norm: fn(*mut f32, *const c_void, *const f32, i32, f32) { add_norm_f32, add_norm_f16 }
}

family! {
    /// `gemv_q8_r{room}_{x}` and `gemv_q8_add_r{room}_f16`: q (int8), scales (f16), x (f32 or
    /// f16), y (f32: written, or the stream added into), inputs, outputs, rows (at most room),
    /// ahead (the trips of weights each lane prefetches into L2; every form takes it after rows).
    gemv_q8: fn(*const i8, *const c_void, *const c_void, *mut f32, i32, i32, i32, i32) {
        gemv_q8_r1_f32, gemv_q8_r2_f32, gemv_q8_r4_f32, gemv_q8_r8_f32,
        gemv_q8_r1_f16, gemv_q8_r2_f16, gemv_q8_r4_f16, gemv_q8_r8_f16,
        gemv_q8_add_r1_f16, gemv_q8_add_r2_f16, gemv_q8_add_r4_f16, gemv_q8_add_r8_f16,
    }
}

family! {
    /// `gemv_q8_glu_{act}_r{room}_f16_{out}`: q, scales, x (f16), y (`[rows, outputs / 2]` in
    /// `out`), inputs, outputs (the gate and up rows stacked), rows, ahead.
    gemv_q8_glu: fn(*const i8, *const c_void, *const c_void, *mut c_void, i32, i32, i32, i32) {
        gemv_q8_glu_silu_r1_f16_f16, gemv_q8_glu_silu_r2_f16_f16, gemv_q8_glu_silu_r4_f16_f16,
        gemv_q8_glu_silu_r8_f16_f16, gemv_q8_glu_silu_r1_f16_f32, gemv_q8_glu_silu_r2_f16_f32,
        gemv_q8_glu_silu_r4_f16_f32, gemv_q8_glu_silu_r8_f16_f32,
        gemv_q8_glu_gelu_tanh_r1_f16_f16, gemv_q8_glu_gelu_tanh_r2_f16_f16,
        gemv_q8_glu_gelu_tanh_r4_f16_f16, gemv_q8_glu_gelu_tanh_r8_f16_f16,
        gemv_q8_glu_gelu_tanh_r1_f16_f32, gemv_q8_glu_gelu_tanh_r2_f16_f32,
        gemv_q8_glu_gelu_tanh_r4_f16_f32, gemv_q8_glu_gelu_tanh_r8_f16_f32,
    }
}

family! {
    /// `gemv_q8_rope_r{room}_f16_{pool}`: q, scales, x (f16), bias (or null), cos, sin,
    /// positions, slots, q_out (f32), k_pool, v_pool, n_head, n_kv, head_dim, interleaved,
    /// inputs, rows, ahead.
    gemv_q8_rope: fn(*const i8, *const c_void, *const c_void, *const f32, *const f32,
                     *const f32, *const u32, *const u32, *mut f32, *mut c_void, *mut c_void,
                     i32, i32, i32, i32, i32, i32, i32) {
        gemv_q8_rope_r1_f16_f32, gemv_q8_rope_r2_f16_f32, gemv_q8_rope_r4_f16_f32,
        gemv_q8_rope_r8_f16_f32, gemv_q8_rope_r1_f16_f16, gemv_q8_rope_r2_f16_f16,
        gemv_q8_rope_r4_f16_f16, gemv_q8_rope_r8_f16_f16, gemv_q8_rope_r1_f16_bf16,
        gemv_q8_rope_r2_f16_bf16, gemv_q8_rope_r4_f16_bf16, gemv_q8_rope_r8_f16_bf16,
    }
}

family! {
    /// `gemv_q8_norm_glu_{act}_r{room}_f32_{out}`: q, scales, x (the stream's f32 rows), y,
    /// inputs, outputs, rows, ahead, norm_w, eps (dynamic shared memory: room · inputs f16).
    gemv_q8_norm_glu: fn(*const i8, *const c_void, *const f32, *mut c_void, i32, i32, i32, i32,
                         *const f32, f32) {
        gemv_q8_norm_glu_silu_r1_f32_f16, gemv_q8_norm_glu_silu_r2_f32_f16,
        gemv_q8_norm_glu_silu_r1_f32_f32, gemv_q8_norm_glu_silu_r2_f32_f32,
        gemv_q8_norm_glu_gelu_tanh_r1_f32_f16, gemv_q8_norm_glu_gelu_tanh_r2_f32_f16,
        gemv_q8_norm_glu_gelu_tanh_r1_f32_f32, gemv_q8_norm_glu_gelu_tanh_r2_f32_f32,
    }
}

family! {
    /// `gemv_q8_norm_rope_r{room}_f32_{pool}`: `gemv_q8_rope`'s arguments with the stream's f32
    /// rows as x, then norm_w, eps (dynamic shared memory: room · inputs f16).
    gemv_q8_norm_rope: fn(*const i8, *const c_void, *const f32, *const f32, *const f32,
                          *const f32, *const u32, *const u32, *mut f32, *mut c_void, *mut c_void,
                          i32, i32, i32, i32, i32, i32, i32, *const f32, f32) {
        gemv_q8_norm_rope_r1_f32_f32, gemv_q8_norm_rope_r2_f32_f32,
        gemv_q8_norm_rope_r1_f32_f16, gemv_q8_norm_rope_r2_f32_f16,
        gemv_q8_norm_rope_r1_f32_bf16, gemv_q8_norm_rope_r2_f32_bf16,
    }
}

family! {
    /// `glu_{act}_{in}_{out}`: gate_up, out, rows, f.
    glu: fn(*const c_void, *mut c_void, u64, u64) {
        glu_silu_f32_f32, glu_silu_f32_f16, glu_silu_f16_f32, glu_silu_f16_f16,
        glu_gelu_tanh_f32_f32, glu_gelu_tanh_f32_f16, glu_gelu_tanh_f16_f32,
        glu_gelu_tanh_f16_f16,
    }
}

family! {
    /// `rope_qk_{in}`: qkv, bias, q_norm, k_norm, cos, sin, positions, out, tokens, n_head, n_kv,
    /// head_dim, interleaved, eps.
    rope_qk: fn(*const c_void, *const f32, *const f32, *const f32, *const f32, *const f32,
                *const u32, *mut f32, i32, i32, i32, i32, i32, f32) {
        rope_qk_f32, rope_qk_f16,
    }
}

family! {
    /// `rope_store_{in}_{pool}`: qkv, bias, q_norm, k_norm, cos, sin, positions, slots, q_out,
    /// k_pool, v_pool, n_head, n_kv, head_dim, interleaved, eps.
    rope_store: fn(*const c_void, *const f32, *const f32, *const f32, *const f32, *const f32,
                   *const u32, *const u32, *mut f32, *mut c_void, *mut c_void, i32, i32, i32,
                   i32, f32) {
        rope_store_f32_f32, rope_store_f32_f16, rope_store_f32_bf16, rope_store_f16_f32,
        rope_store_f16_f16, rope_store_f16_bf16,
    }
}

family! {
    /// `store_rows_{pool}`: src, slots, pool, tokens, width.
    store_rows: fn(*const f32, *const u32, *mut c_void, u64, u64) {
        store_rows_f32, store_rows_f16, store_rows_bf16,
    }
}

family! {
    /// `sample_rows`: logits, logit_row, vocab, mask_words, words_per_mask, mask_index,
    /// ban_start, ban_ids, temperature, top_k, top_p, uniform, token, status.
    sampling: fn(*mut f32, *const u32, u32, *const u32, u32, *const u32, *const u32, *const u32,
                 *const f32, *const u32, *const f32, *const f64, *mut u32, *mut u32) {
        sample_rows,
    }
}
