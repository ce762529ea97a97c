// Paged attention for a whole ragged batch in one launch per layer.
//
// The grid is (new tokens, key-value heads); one block computes the rows of every query head of
// its group (grouped-query attention: query head h reads key-value head h / group), so each key
// and value row is read once per token and group, not once per query head: at batch 512 and
// about 1,000 positions of context that is most of a decode step's bytes. The arithmetic is
// `attend_reference` in src/ragged.rs (the test reference): scores q.k * scale over the positions
// the token sees (causal, and within `window` when it is not 0), a softmax that subtracts the
// row's maximum, and the weighted sum of the values. Decode rows and prefill or extension rows
// differ only in their position, so one launch covers a step's every sequence.
//
// The batch metadata is `RaggedBatch` (src/ragged.rs), uploaded as it is:
//   token_seq[t], token_pos[t]   the sequence and the position of new token t;
//   page_start[s]                where sequence s's pages begin in block_table (n_seq + 1 entries);
//   block_table[...]             every sequence's pages, concatenated.
// The pool of one layer holds `rows = pages * page_size` rows of `n_kv * head_dim` values.
//
// Dynamic shared memory holds the group's queries and one score per (query head, attended
// position): the launcher passes group * (longest context + head_dim) * 4 bytes, and refuses a
// group above MAX_GROUP.
//
// The warps and split forms are compiled for groups of up to G = 4 and of up to G = 8 (the `g4`
// and `g8` in their names): a thread keeps G accumulators per value it sums, so a form sized for
// 8 where the model's groups are 4 (Llama 3 8B, Qwen3 8B, Mistral, Gemma 3 1B) holds twice the
// registers it uses. ptxas gave the heads of 128 in f16 128 registers a thread sized for 8, two
// blocks of 256 threads an SM, before the forms were split.
//
// Split-K (flash-decoding, the `_split` kernels): a third grid dimension cuts each token's
// positions into chunks of `chunk`, one block per (token, key-value head, chunk), so a step with
// few rows still fills the GPU (a decode step at batch 1 on SmolLM2 is 3 blocks otherwise, on 132
// SMs) and a context too long for one block's shared memory still runs. A chunk's block writes,
// per query head, its scores' maximum m, the sum l of exp(score - m), and the unnormalized sum of
// exp(score - m) * value; `paged_attention_combine` then rescales every chunk to the largest
// maximum M and divides: out = sum_z exp(m_z - M) acc_z / sum_z exp(m_z - M) l_z. Chunks past a
// token's last position write m = -inf, l = 0, acc = 0, which the combine weighs 0. The
// arithmetic is `attend_split_reference` in src/ragged.rs.

#define MAX_GROUP 8

#include "common.cuh"

// A block's reductions of G values per thread, at once, through `red` (RED_WARPS * G floats: one
// per value and warp; blocks of at most RED_WARPS warps): two barriers for the whole group,
// where a reduction per query head took two each (16 a softmax for groups of 4). Each value is
// reduced in the same order as alone; values past the group's heads hold the reduction's
// identity (-inf, 0), so all G are reduced without a branch (a branch per head gave some split
// forms 96-107 registers where 80 do). Every thread gets the results.
#define RED_WARPS 8
template <bool MAX, int G>
__device__ void block_reduce_group(float* x, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        x[g] = MAX ? warp_max(x[g]) : warp_sum(x[g]);
        if (lane == 0) red[g * RED_WARPS + warp] = x[g];
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float y = lane < warps ? red[g * RED_WARPS + lane] : (MAX ? -INFINITY : 0.0f);
        x[g] = MAX ? warp_max(y) : warp_sum(y);
    }
    __syncthreads();
}

// What block (token t, a key-value head) attends: its sequence's block table, and positions
// first .. first + n - 1 (causal, and within `window` when it is not 0).
struct Attended {
    const uint32_t* pages;
    int first, n;
};

__device__ __forceinline__ Attended attended(int t, const uint32_t* token_seq,
                                             const uint32_t* token_pos,
                                             const uint32_t* page_start,
                                             const uint32_t* block_table, int window) {
    const int pos = token_pos[t];
    const int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    return Attended{block_table + page_start[token_seq[t]], first, pos + 1 - first};
}

// Position p's row in a layer's pool, through its sequence's block table `pages`.
__device__ __forceinline__ uint32_t pool_row(const uint32_t* pages, int p, int page_size) {
    return pages[p / page_size] * (uint32_t)page_size + (uint32_t)(p % page_size);
}

// Scores of the group's query heads against the attended positions, into `scores` (group rows of
// n): a warp per position (warp w takes w, w + warps, ...), its lanes across the head's dimensions
// (coalesced reads), the key row loaded once for every query head of the group. `row_of(j)` is
// position j's row in the pool. UNROLL: how many positions a warp's loop unrolls (1: none).
template <typename KV, int UNROLL, typename RowOf>
__device__ void group_scores(const float* qs, const KV* __restrict__ k, RowOf row_of, int n,
                             int group, int head_dim, int kv_dim, int kv_head, float scale,
                             float* scores) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll UNROLL
    for (int j = warp; j < n; j += warps) {
        const KV* krow = k + (size_t)row_of(j) * kv_dim + (size_t)kv_head * head_dim;
        float dot[MAX_GROUP];
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) dot[g] = 0.0f;
        for (int i = lane; i < head_dim; i += 32) {
            const float kx = to_float(krow[i]);
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g)
                if (g < group) dot[g] += qs[g * head_dim + i] * kx;
        }
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) {
            if (g < group) {
                const float d = warp_sum(dot[g]) * scale;
                if (lane == 0) scores[g * n + j] = d;
            }
        }
    }
    __syncthreads();
}

// One 16-byte piece of a key row (`raw`, piece `piece` of the row) multiplied with the group's
// queries into `dot`, token i's query head g at dot[i * G + g]: the arithmetic the scores share
// whether their key rows come from global memory (group_scores_threads) or from shared memory
// (group_scores_staged), so that the two give the same bits.
template <typename KV, int G, int T>
__device__ __forceinline__ void dot_piece(const uint4& raw, const float* qs, int piece,
                                          int group, int head_dim, float* dot) {
    constexpr int PER = 16 / sizeof(KV);
    const KV* x = reinterpret_cast<const KV*>(&raw);
    float kx[PER];
#pragma unroll
    for (int e = 0; e < PER; ++e) kx[e] = to_float(x[e]);
    // The queries in 16-byte shared loads (a broadcast: every lane reads the same words), four
    // values a load where one a load made the scores wait on shared memory: 32 loads per 32
    // products for groups of 4.
#pragma unroll
    for (int i = 0; i < T; ++i) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (g < group) {
                const float* qg = qs + (i * group + g) * head_dim + piece * PER;
                float& d = dot[i * G + g];
#pragma unroll
                for (int e = 0; e < PER; e += 4) {
                    const float4 q4 = SHARED_LOAD4(qg + e);
                    d += q4.x * kx[e];
                    d += q4.y * kx[e + 1];
                    d += q4.z * kx[e + 2];
                    d += q4.w * kx[e + 3];
                }
            }
        }
    }
}

// Position j's scores from its group's dot products, token i's query head g at
// scores[(i * group + g) * n + j] (-inf where j is outside token i's range, T > 1).
template <int G, int T>
__device__ __forceinline__ void write_scores(const float* dot, int j, int n, int group,
                                             float scale, float* scores, const int* lo,
                                             const int* hi) {
#pragma unroll
    for (int i = 0; i < T; ++i) {
        const bool seen = T == 1 || (j >= lo[i] && j <= hi[i]);
#pragma unroll
        for (int g = 0; g < G; ++g)
            if (g < group)
                scores[(i * group + g) * n + j] = seen ? dot[i * G + g] * scale : -INFINITY;
    }
}

// 16-byte loads of a key row a thread issues before their arithmetic (128 bytes).
#define KEY_BATCH 8

// The warps layout's scores: a thread per position (thread i takes i, i + blockDim.x, ...), its
// key row read with 16-byte loads (eight issued before their arithmetic), each value multiplied with the group's queries from
// shared memory (every lane reads the same query value: a broadcast). No shuffles: the layout
// above it (a warp per position, its lanes across the dimensions) spent 15 shuffles per
// position on SmolLM2's groups of 3 and kept 128 bytes in flight per warp, and read the pool at
// 19% of a device copy's rate on an H100 at batch 512 (BENCHMARKS.md, 2026-11-26). Rows whose
// head does not start on 16 bytes (head_dim * sizeof(KV) % 16) are read value by value.
//
// T tokens of one sequence at once (the tiled form, below): query head g of token i is row
// i * group + g of `qs` and `scores`, and a position outside token i's range (`lo[i]` to
// `hi[i]`, the causal end and the window's start) scores -inf, so the key row is read once for
// T tokens. T = 1 is the one-token form (its range every position).
template <typename KV, int DPL, int G, int T = 1>
__device__ void group_scores_threads(const float* qs, const KV* __restrict__ k,
                                     const uint32_t* rows, int n, int group, int head_dim,
                                     int kv_dim, int kv_head, float scale, float* scores,
                                     const int* lo = nullptr, const int* hi = nullptr) {
    constexpr int PER = 16 / sizeof(KV);       // values per 16-byte load
    constexpr int LOADS = DPL * 32 / PER;      // loads that cover the longest head of DPL
    constexpr int BATCH = LOADS < KEY_BATCH ? LOADS : KEY_BATCH;
    const bool vector = head_dim % PER == 0 && kv_dim % PER == 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const KV* krow = k + (size_t)rows[j] * kv_dim + (size_t)kv_head * head_dim;
        float dot[T * G];
#pragma unroll
        for (int g = 0; g < T * G; ++g) dot[g] = 0.0f;
        if (vector) {
            // Eight loads (128 bytes) issued at a time, then their arithmetic: registers for
            // 32 values, whatever the head.
#pragma unroll 1
            for (int c0 = 0; c0 < LOADS && c0 * PER < head_dim; c0 += BATCH) {
                uint4 raw[BATCH];
#pragma unroll
                for (int c = 0; c < BATCH; ++c)
                    if ((c0 + c) * PER < head_dim)
                        raw[c] = __ldg(reinterpret_cast<const uint4*>(krow) + c0 + c);
#pragma unroll
                for (int c = 0; c < BATCH; ++c) {
                    if ((c0 + c) * PER >= head_dim) break;
                    dot_piece<KV, G, T>(raw[c], qs, c0 + c, group, head_dim, dot);
                }
            }
        } else {
            for (int x = 0; x < head_dim; ++x) {
                const float kx = to_float(krow[x]);
#pragma unroll
                for (int i = 0; i < T; ++i)
#pragma unroll
                    for (int g = 0; g < G; ++g)
                        if (g < group) dot[i * G + g] += qs[(i * group + g) * head_dim + x] * kx;
            }
        }
        write_scores<G, T>(dot, j, n, group, scale, scores, lo, hi);
    }
    __syncthreads();
}

// The same scores with the key rows staged in shared memory (`attention_keys = staged`, the
// STAGE_KEYS bit of `reads`). In group_scores_threads each lane of a warp loads 16 bytes of a
// different row, so every 16-byte load of a warp touches 32 cache lines: 32 of L1's wavefronts
// (16 bytes each) where a coalesced load of as many bytes takes 4, and at a device copy's rate
// (about 15 bytes a cycle per SM on an H200) that is near all L1 can serve. Here the block
// first loads a tile of blockDim.x positions' rows KEY_BATCH pieces at a time, consecutive
// threads taking consecutive 16-byte pieces of a row (a warp: 4 rows of 128 bytes, 4 lines per
// load), into `stage` (KEY_STAGE_STRIDE pieces a row: the padding puts the 8 rows that 8
// threads read at once in different banks); then each thread multiplies its own position's
// pieces from there, as group_scores_threads does from its registers: the same thread per
// position and the same order of products (dot_piece), so the same bits. Every thread loads 8
// pieces a round, LOADS at a time (below); two barriers a round. `stage` is 16-byte
// aligned and holds blockDim.x * KEY_STAGE_STRIDE pieces (kernel_plan's STAGE_WORDS). Heads
// whose rows do not split into 16-byte pieces take group_scores_threads.
#define KEY_STAGE_STRIDE (KEY_BATCH + 1)
template <typename KV, int DPL, int G>
__device__ void group_scores_staged(const float* qs, const KV* __restrict__ k,
                                    const uint32_t* rows, int n, int group, int head_dim,
                                    int kv_dim, int kv_head, float scale, float* scores,
                                    uint4* stage) {
    constexpr int PER = 16 / sizeof(KV);
    static_assert(DPL * 32 / PER >= KEY_BATCH, "a round is KEY_BATCH pieces of every row");
    // Loads a thread issues before it stores them: 64 bytes (32 for an f32 pool), where the
    // direct reads keep 128 in flight. ptxas: with 8 the `g4` forms, held to 80 registers for
    // three blocks an SM, spilled 20-124 bytes; with these none does.
    constexpr int LOADS = sizeof(KV) == 4 ? 2 : 4;
    const int tx = threadIdx.x, nt = blockDim.x;  // nt a multiple of KEY_BATCH (256)
    const int pieces = head_dim / PER;
    const int piece = tx % KEY_BATCH, first_row = tx / KEY_BATCH, row_step = nt / KEY_BATCH;
    const uint4* khead = reinterpret_cast<const uint4*>(k + (size_t)kv_head * head_dim);
    const size_t row_pieces = (size_t)kv_dim / PER;
    for (int j0 = 0; j0 < n; j0 += nt) {  // the same trips for every thread: barriers inside
        const int here = min(nt, n - j0), j = j0 + tx;
        float dot[G];
#pragma unroll
        for (int g = 0; g < G; ++g) dot[g] = 0.0f;
#pragma unroll 1
        for (int c0 = 0; c0 < pieces; c0 += KEY_BATCH) {
            const int per_row = min(KEY_BATCH, pieces - c0);
            // Thread tx takes piece tx % KEY_BATCH of rows tx / KEY_BATCH, + nt / KEY_BATCH,
            // ... (8 consecutive threads: a row's 128 consecutive bytes), LOADS loads issued
            // before their stores; a piece past the round's is nobody's.
            const bool mine = piece < per_row;
#pragma unroll 1
            for (int m0 = first_row; m0 < here; m0 += LOADS * row_step) {
                uint4 raw[LOADS];
#pragma unroll
                for (int u = 0; u < LOADS; ++u) {
                    const int m = m0 + u * row_step;
                    if (mine && m < here)
                        raw[u] = __ldg(khead + (size_t)rows[j0 + m] * row_pieces + c0 + piece);
                }
#pragma unroll
                for (int u = 0; u < LOADS; ++u) {
                    const int m = m0 + u * row_step;
                    if (mine && m < here)
                        SHARED_STORE16(stage + m * KEY_STAGE_STRIDE + piece, raw[u]);
                }
            }
            __syncthreads();
            if (tx < here) {
#pragma unroll 2
                for (int c = 0; c < per_row; ++c) {
                    const uint4 raw = SHARED_LOAD16(stage + tx * KEY_STAGE_STRIDE + c);
                    dot_piece<KV, G, 1>(raw, qs, c0 + c, group, head_dim, dot);
                }
            }
            __syncthreads();
        }
        if (tx < here) write_scores<G, 1>(dot, j, n, group, scale, scores, nullptr, nullptr);
    }
    __syncthreads();
}

// One softmax per query head of the group, in place over its row of n scores, the G heads' maxima
// and sums each reduced together (block_reduce_group). SPLIT: the weights stay unnormalized,
// exp(score - max), and thread 0 writes each head's max and sum to ml[2 * g * ml_stride],
// ml[2 * g * ml_stride + 1] (a chunk's share of the combine).
template <bool SPLIT, int G>
__device__ void group_softmax(float* scores, int group, int n, float* red, float* ml,
                              size_t ml_stride) {
    float max[G], sum[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        max[g] = -INFINITY;
        sum[g] = 0.0f;
    }
#pragma unroll 1
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
#pragma unroll
        for (int g = 0; g < G; ++g)
            if (g < group) max[g] = fmaxf(max[g], scores[g * n + j]);
    }
    block_reduce_group<true, G>(max, red);
#pragma unroll 1
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (g < group) {
                const float e = __expf(scores[g * n + j] - max[g]);
                scores[g * n + j] = e;
                sum[g] += e;
            }
        }
    }
    block_reduce_group<false, G>(sum, red);
    if constexpr (SPLIT) {
        if (threadIdx.x == 0) {
#pragma unroll
            for (int g = 0; g < G; ++g) {
                if (g < group) {
                    ml[2 * g * ml_stride] = max[g];
                    ml[2 * g * ml_stride + 1] = sum[g];
                }
            }
        }
    } else {
        float inv[G];
#pragma unroll
        for (int g = 0; g < G; ++g) inv[g] = 1.0f / sum[g];
#pragma unroll 1
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (g < group) scores[g * n + j] *= inv[g];
        }
    }
    __syncthreads();
}

// Two layouts of the same attention. The warps layout (the default; an H100 measured both on
// 2026-11-26: 123 µs a layer against 303 at batch 1, when its scores took a warp per position
// as its weighted sum does; the thread per position of group_scores_threads is newer and not
// yet measured) splits the block's threads over the attended positions in both phases. In the per-dimension layout (`QUARRY_ATTENTION=per-dimension`) a
// thread per dimension walks every position in turn to sum the values, two dependent loads per
// step (the block table, then the value), so a decode row at 1,000 positions is a chain of 1,000
// latencies per layer whatever the batch, with half of the 128 threads idle for 64-dimensional
// heads. In the warps layout 256 threads first write every attended position's pool row to
// shared memory; in the weighted sum each warp takes a few positions at a time, a lane a 16-byte
// piece of a value row (group_sum_vectors; heads whose rows do not split into 16-byte pieces
// over a warp take a position per warp, its lanes across the dimensions), keeping one partial sum
// per query head and dimension; the partial sums of the 8 warps are then added in warp order (no
// atomics: the result does not depend on scheduling). Dynamic shared memory: the group's queries,
// its scores, the rows, and the partial sums: (group * (head_dim + longest) + longest + WARPS *
// group * head_dim) * 4 bytes.
#define WARPS 8

// Whether the weighted sum can read whole value rows in 16-byte loads: every head starts on 16
// bytes, and a row's loads (head_dim / (16 / sizeof(KV)) lanes) divide a warp.
template <typename KV>
__device__ __forceinline__ bool vector_rows(int head_dim, int kv_dim) {
    constexpr int PER = 16 / sizeof(KV);
    const int lanes = head_dim / PER;
    return head_dim % PER == 0 && kv_dim % PER == 0 && lanes > 0 && lanes <= 32 && 32 % lanes == 0;
}

// The warps layout's weighted sum in 16-byte loads: a warp takes 32 / lanes positions at a time
// (lanes = head_dim / (16 / sizeof(KV)): 8 for an f16 head of 64, so 4 positions), each lane one
// 16-byte piece of its position's value row, multiplied by the group's weights; then the lanes
// that hold the same piece of different positions add their sums across the warp, and the
// warp's sums go to `partial` (WARPS * group * head_dim) as the other path's do. A warp per
// position with a value per lane kept 4 bytes per lane in flight (an f16 head of 64); this keeps
// 16 per load. Heads whose rows do not split so (an f32 head of 256, a head of 80) take the warp
// per position.
//
// `scores` holds the group's rows of n weights; this warp is warp `wi` of the `wn` that share
// positions begin .. end - 1 (the one-token form: every warp, every position; the tiled form:
// the warps of one token, its range) and writes its sums to `partial` (group * head_dim).
template <typename KV, int G>
__device__ void group_sum_vectors(const float* scores, const KV* __restrict__ v,
                                  const uint32_t* rows, int n, int begin, int end, int group,
                                  int head_dim, int kv_dim, int kv_head, int wi, int wn,
                                  float* partial) {
    constexpr int PER = 16 / sizeof(KV);
    // Loads a lane issues before their arithmetic: U 16-byte loads, 2 KiB a warp in flight,
    // where the loop that loaded one position at a time (unrolled twice) kept about 1 KiB. An
    // H200 read the pool at a quarter of its copy rate in a decode step at batch 256
    // (2026-11-28), with two blocks an SM; attention-bench measures this form.
    constexpr int U = 4;
    const int lane = threadIdx.x & 31;
    const int lanes = head_dim / PER, per_warp = 32 / lanes;
    const int piece = lane % lanes, slot = lane / lanes;
    const int step = wn * per_warp;
    const KV* vhead = v + (size_t)kv_head * head_dim;
    float acc[G][PER] = {};
#pragma unroll 1
    for (int j0 = begin + wi * per_warp + slot; j0 < end; j0 += U * step) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + u * step;
            if (j < end)
                raw[u] = __ldg(reinterpret_cast<const uint4*>(vhead + (size_t)rows[j] * kv_dim) +
                               piece);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + u * step;
            if (j < end) {
                const KV* x = reinterpret_cast<const KV*>(&raw[u]);
                float vx[PER];
#pragma unroll
                for (int e = 0; e < PER; ++e) vx[e] = to_float(x[e]);
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    if (g < group) {
                        const float w = scores[g * n + j];
#pragma unroll
                        for (int e = 0; e < PER; ++e) acc[g][e] += w * vx[e];
                    }
                }
            }
        }
    }
    // Lanes holding the same piece of different positions: add across the warp (uniform loop,
    // every lane shuffles).
    for (int o = lanes; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            if (g < group) {
#pragma unroll
                for (int e = 0; e < PER; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
            }
        }
    }
    if (slot == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g)
            if (g < group)
#pragma unroll
                for (int e = 0; e < PER; ++e) partial[g * head_dim + piece * PER + e] = acc[g][e];
    }
}

// The warps and split forms' prefetch (bits 1 and 2 of `reads`; kernel_plan's `Prefetch`):
// as a thread finds an attended position's pool row, it asks L2 for the row's key bytes (bit 2)
// and its value bytes (bit 1) of this block's head, a 128-byte line at a time, without waiting
// and without a register held. The block otherwise requests its key rows 128 bytes a thread at a
// time, a few round trips apart, and its value rows only after the softmax: an H200 read the pool
// at 2.2-2.6 TB/s in these forms where a copy reads 4.0-4.2 (attention-bench, 2026-11-30). The
// loads that follow are the same, so the output is the same bits; only where the bytes wait
// changes (L2, 50 MB on an H100, so a batch's whole working set does not fit: attention-bench
// times each bit against none).
#define PREFETCH_VALUES 1
#define PREFETCH_KEYS 2
// `reads`' third bit (kernel_plan's `KeyReads::Staged`): the scores read their key rows through
// shared memory (group_scores_staged), where the plan has made room for it.
#define STAGE_KEYS 4
template <typename KV>
__device__ __forceinline__ void prefetch_head_row(const KV* pool, uint32_t row, int kv_dim,
                                                  int kv_head, int head_dim) {
    const char* start =
        reinterpret_cast<const char*>(pool + (size_t)row * kv_dim + (size_t)kv_head * head_dim);
    const char* end = start + (size_t)head_dim * sizeof(KV);
    const char* line = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(start) &
                                                     ~(uintptr_t)127);
    for (; line < end; line += 128) PREFETCH_L2(line);
}

// Both layouts in one template: DPL 0 is the per-dimension layout above; 2, 4 or 8 the warps
// layout with head_dim / 32 rounded up dimensions per lane (heads of up to 64, 128 or 256), a
// template parameter so that a 64-dimensional head keeps 16 accumulators, not 64.
//
// SPLIT (warps layout only): this block takes chunk blockIdx.z of `chunk` positions; `out` is the
// chunks' unnormalized sums, [tokens, n_head, chunks, head_dim], and `ml` their maxima and sums,
// [tokens, n_head, chunks, 2]. OUT: the output's element type (f16 where the output projection
// multiplies dense f16 weights, so no cast follows; the split kernels' sums stay f32).
template <typename KV, typename OUT, int DPL, int G, bool SPLIT>
__device__ void paged_attention(
    const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
    const uint32_t* __restrict__ token_seq, const uint32_t* __restrict__ token_pos,
    const uint32_t* __restrict__ page_start, const uint32_t* __restrict__ block_table,
    OUT* __restrict__ out, int n_head, int n_kv, int head_dim, int page_size, float scale,
    int window, int chunk, float* __restrict__ ml, const uint32_t* __restrict__ token_shared,
    int slot0, int t, int reads) {
    static_assert(!SPLIT || DPL > 0, "split-K runs the warps layout");
    static_assert(!SPLIT || sizeof(OUT) == 4, "split-K's sums are f32");
    static_assert(G <= MAX_GROUP, "groups of at most MAX_GROUP");
    DYNAMIC_SHARED(float, shared);
    __shared__ float red[RED_WARPS * MAX_GROUP];  // block_reduce_group's (the plan's STATIC_SHARED)
    const int kv_head = blockIdx.y;
    const int group = n_head / n_kv;
    const Attended a = attended(t, token_seq, token_pos, page_start, block_table, window);
    int first = a.first, n = a.n;
    const uint32_t* pages = a.pages;
    const int kv_dim = n_kv * head_dim;
    const int gd = group * head_dim;
    // SPLIT: where this chunk's results go (query head g of the group at g * split_stride): after
    // the cascade's `slot0` slots of the shared prefix, whose positions a token of it skips.
    const size_t splits = slot0 + gridDim.z, split_stride = splits * (size_t)head_dim;
    const size_t split_row =
        ((size_t)t * n_head + (size_t)kv_head * group) * splits + slot0 + blockIdx.z;
    if constexpr (SPLIT) {
        if (slot0 > 0) {
            const int skip = (int)token_shared[t];
            if (skip > first) {
                n -= skip - first;
                first = skip;
            }
        }
        first += (int)blockIdx.z * chunk;
        n = min(chunk, n - (int)blockIdx.z * chunk);
        ml += 2 * split_row;
        if (n <= 0) {  // past this token's last position: a chunk the combine weighs 0
            for (int e = threadIdx.x; e < gd; e += blockDim.x) {
                const int g = e / head_dim;
                out[split_row * head_dim + g * split_stride + e % head_dim] = from_float<OUT>(0.0f);
                if (e % head_dim == 0) {
                    ml[2 * g * splits] = -INFINITY;
                    ml[2 * g * splits + 1] = 0.0f;
                }
            }
            return;
        }
    }
    float* qs = shared;                                     // gd query values
    float* scores = qs + gd;                                // group rows of n scores, then weights
    uint32_t* rows = reinterpret_cast<uint32_t*>(scores + group * n);  // warps: n pool rows
    float* partial = reinterpret_cast<float*>(rows + n);    // warps: WARPS * gd partial sums
    const float* qrow = q + (size_t)t * n_head * head_dim + (size_t)kv_head * gd;
    for (int i = threadIdx.x; i < gd; i += blockDim.x) qs[i] = qrow[i];
    if constexpr (DPL == 0) {
        __syncthreads();
        group_scores<KV, 1>(qs, k, [&](int j) { return pool_row(pages, first + j, page_size); },
                            n, group, head_dim, kv_dim, kv_head, scale, scores);
    } else {
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const uint32_t row = pool_row(pages, first + j, page_size);
            rows[j] = row;
            if (reads & PREFETCH_KEYS) prefetch_head_row(k, row, kv_dim, kv_head, head_dim);
            if (reads & PREFETCH_VALUES) prefetch_head_row(v, row, kv_dim, kv_head, head_dim);
        }
        __syncthreads();
        constexpr int PER = 16 / sizeof(KV);
        if ((reads & STAGE_KEYS) && head_dim % PER == 0 && kv_dim % PER == 0) {
            // After the rows, on 16 bytes (the plan's STAGE_WORDS hold the rounding); the
            // partial sums reuse the room after the scores.
            const uintptr_t at = reinterpret_cast<uintptr_t>(rows + n);
            uint4* stage = reinterpret_cast<uint4*>((at + 15) & ~(uintptr_t)15);
            group_scores_staged<KV, DPL, G>(qs, k, rows, n, group, head_dim, kv_dim, kv_head,
                                            scale, scores, stage);
        } else {
            group_scores_threads<KV, DPL, G>(qs, k, rows, n, group, head_dim, kv_dim, kv_head,
                                             scale, scores);
        }
    }
    group_softmax<SPLIT, G>(scores, group, n, red, ml, splits);

    if constexpr (DPL == 0) {
        // The weighted sums: a thread per dimension, every position (adjacent threads, adjacent
        // values), the value loaded once for every query head of the group.
        OUT* orow = out + (size_t)t * n_head * head_dim + (size_t)kv_head * group * head_dim;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
            float acc[MAX_GROUP];
    #pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) acc[g] = 0.0f;
            for (int j = 0; j < n; ++j) {
                const size_t row = pool_row(pages, first + j, page_size);
                const float vx = to_float(v[row * kv_dim + (size_t)kv_head * head_dim + i]);
    #pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g)
                    if (g < group) acc[g] += scores[g * n + j] * vx;
            }
    #pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g)
                if (g < group) orow[g * head_dim + i] = from_float<OUT>(acc[g]);
        }
    } else {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (vector_rows<KV>(head_dim, kv_dim)) {
            group_sum_vectors<KV, G>(scores, v, rows, n, 0, n, group, head_dim, kv_dim, kv_head,
                                     warp, WARPS, partial + warp * gd);
        } else {
            float acc[G][DPL];
    #pragma unroll
            for (int g = 0; g < G; ++g)
    #pragma unroll
                for (int m = 0; m < DPL; ++m) acc[g][m] = 0.0f;
    #pragma unroll 2
            for (int j = warp; j < n; j += WARPS) {
                const KV* vrow = v + (size_t)rows[j] * kv_dim + (size_t)kv_head * head_dim;
    #pragma unroll
                for (int m = 0; m < DPL; ++m) {
                    const int i = lane + 32 * m;
                    if (i < head_dim) {
                        const float vx = to_float(vrow[i]);
    #pragma unroll
                        for (int g = 0; g < G; ++g)
                            if (g < group) acc[g][m] += scores[g * n + j] * vx;
                    }
                }
            }
    #pragma unroll
            for (int g = 0; g < G; ++g)
    #pragma unroll
                for (int m = 0; m < DPL; ++m) {
                    const int i = lane + 32 * m;
                    if (g < group && i < head_dim) partial[warp * gd + g * head_dim + i] = acc[g][m];
                }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < gd; e += blockDim.x) {
            float sum = 0.0f;
            for (int w = 0; w < WARPS; ++w) sum += partial[w * gd + e];
            if constexpr (SPLIT) {
                out[split_row * head_dim + (e / head_dim) * split_stride + e % head_dim] =
                    from_float<OUT>(sum);
            } else {
                out[(size_t)t * n_head * head_dim + (size_t)kv_head * gd + e] = from_float<OUT>(sum);
            }
        }
    }
}

// Split-K's chunks combined, one output at a time: dimension i of row `row` (token * n_head +
// query head) is sum_z exp(m_z - M) acc_z[i] / sum_z exp(m_z - M) l_z, with M the largest m_z, in
// chunk order (no atomics). `part` and `ml` are the split kernel's `out` and `ml` (and the
// cascade's prefix slots before them); the token's first chunk of its own positions always holds
// one, so M is finite. A slot with m = -inf (an empty chunk, or a prefix slot of a token outside
// the shared prefix, whose sums are never written) weighs 0 and is not read. L2: the loads skip
// L1 (__ldcg), as the last-block combine (combine_if_last) needs, since other blocks of the same
// launch wrote them and L1 is not coherent between SMs; the combine's own launch reads through
// L1 (the same values, so the same bits).
template <bool L2>
__device__ __forceinline__ float combine_load(const float* p) {
    if constexpr (L2)
        return __ldcg(p);
    else
        return *p;
}
template <typename OUT, bool L2>
__device__ void combine_one(const float* __restrict__ part, const float* __restrict__ ml,
                            OUT* __restrict__ out, size_t row, int i, int head_dim, int splits) {
    const float* m = ml + row * splits * 2;
    float max = -INFINITY;
    for (int z = 0; z < splits; ++z) max = fmaxf(max, combine_load<L2>(m + 2 * z));
    float sum = 0.0f;
    for (int z = 0; z < splits; ++z)
        sum += __expf(combine_load<L2>(m + 2 * z) - max) * combine_load<L2>(m + 2 * z + 1);
    const float inv = 1.0f / sum;
    const float* p = part + row * splits * head_dim;
    float acc = 0.0f;
    for (int z = 0; z < splits; ++z) {
        const float mz = combine_load<L2>(m + 2 * z);
        if (mz != -INFINITY) acc += __expf(mz - max) * combine_load<L2>(p + (size_t)z * head_dim + i);
    }
    out[row * head_dim + i] = from_float<OUT>(acc * inv);
}

// Split-K's combine inside the split launch (`split_combine`; `counters` not null): a block
// counts itself done once its chunk's results are written, and the last of a (token, key-value
// head)'s gridDim.z blocks to count combines the group's query heads, as the combine's own
// launch would (the same combine_one, so bit for bit), then sets the counter back to 0 for the
// next launch (a CUDA graph replays the same buffer). One launch a layer fewer; the cost is a
// fence and an atomic a block, and the last block's combine. The output is f16 where `out16` is
// not null, else f32 in `out`.
__device__ void combine_if_last(const float* part, const float* ml, uint32_t* counters, float* out,
                                __half* out16, int n_head, int n_kv, int head_dim, int splits,
                                int t) {
    __threadfence();  // this thread's sums and maxima, seen by whichever block combines
    __syncthreads();  // every thread's, before the block counts itself
    uint32_t* counter = counters + (size_t)t * n_kv + blockIdx.y;
    bool last = false;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.z - 1;
    if (!__syncthreads_or(last)) return;
    if (threadIdx.x == 0) *counter = 0;
    __threadfence();  // the other blocks' results, read after their counts
    const int group = n_head / n_kv;
    const size_t row0 = (size_t)t * n_head + (size_t)blockIdx.y * group;
    for (int e = threadIdx.x; e < group * head_dim; e += blockDim.x) {
        const size_t row = row0 + e / head_dim;
        if (out16)
            combine_one<__half, true>(part, ml, out16, row, e % head_dim, head_dim, splits);
        else
            combine_one<float, true>(part, ml, out, row, e % head_dim, head_dim, splits);
    }
}

// The tiled form (`AttentionKernel::Tiled`): the warps layout, where a prefill or extension's
// tokens of one sequence share their key reads. The grid is still a block per (token, key-value
// head). Tokens are taken in tiles of TILE by their index in the batch (t - t % TILE onwards);
// where a tile's TILE tokens are one sequence's at consecutive positions and its heads' rows
// split into 16-byte pieces, the tile's first block computes all of them and the others return.
// Every other block (a decode row, a tile across two sequences, the batch's last partial tile)
// computes its own token as the warps layout does. The tile's block reads each position of the
// union of the tokens' ranges once for the scores of TILE * group query heads (each token's
// positions past its own end, or before its window, score -inf), runs the TILE * group
// softmaxes' reductions together, and gives WARPS / TILE warps to each token's weighted sum (its
// value rows, the same ones, are read by each token's warps: from L1 or L2 after the first).
// Dynamic shared memory: the larger of the warps layout's for the longest context and the tile's,
// (TILE * group * (head_dim + n) + n + WARPS * group * head_dim + RED_WARPS * TILE * G) * 4 bytes
// with n = longest + TILE - 1 (the union of the tile's ranges). `tokens`: the batch's tokens.
#define TILE 4  // kernel_plan::TILE
template <typename KV, typename OUT, int DPL, int G>
__device__ void paged_attention_tiled(
    const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
    const uint32_t* __restrict__ token_seq, const uint32_t* __restrict__ token_pos,
    const uint32_t* __restrict__ page_start, const uint32_t* __restrict__ block_table,
    OUT* __restrict__ out, int n_head, int n_kv, int head_dim, int page_size, float scale,
    int window, int tokens) {
    static_assert(WARPS % TILE == 0, "a tile's tokens share the warps evenly");
    const int t = blockIdx.x, kv_head = blockIdx.y;
    const int lead = t - t % TILE;
    const int kv_dim = n_kv * head_dim;
    // Every block of the tile reads the same answer, so the returns below are the whole block's.
    bool whole = lead + TILE <= tokens && vector_rows<KV>(head_dim, kv_dim);
    for (int i = 1; whole && i < TILE; ++i)
        whole = token_seq[lead + i] == token_seq[lead] && token_pos[lead + i] == token_pos[lead] + i;
    if (!whole) {
        paged_attention<KV, OUT, DPL, G, false>(q, k, v, token_seq, token_pos, page_start,
                                                block_table, out, n_head, n_kv, head_dim,
                                                page_size, scale, window, 0, nullptr, nullptr,
                                                0, t, 0);
        return;
    }
    if (t != lead) return;
    DYNAMIC_SHARED(float, shared);
    const int group = n_head / n_kv, gd = group * head_dim;
    const Attended a = attended(lead, token_seq, token_pos, page_start, block_table, window);
    const int first = a.first;
    const int n = (int)token_pos[lead + TILE - 1] + 1 - first;  // the union of the ranges
    int lo[TILE], hi[TILE];
#pragma unroll
    for (int i = 0; i < TILE; ++i) {
        const Attended ai =
            attended(lead + i, token_seq, token_pos, page_start, block_table, window);
        lo[i] = ai.first - first;
        hi[i] = ai.first + ai.n - 1 - first;
    }
    float* qs = shared;                                     // TILE * gd query values
    float* scores = qs + TILE * gd;                         // TILE * group rows of n
    uint32_t* rows = reinterpret_cast<uint32_t*>(scores + TILE * group * n);
    float* partial = reinterpret_cast<float*>(rows + n);    // WARPS * gd partial sums
    float* red = partial + WARPS * gd;                      // RED_WARPS * TILE * G
    for (int e = threadIdx.x; e < TILE * gd; e += blockDim.x)
        qs[e] = q[(size_t)(lead + e / gd) * n_head * head_dim + (size_t)kv_head * gd + e % gd];
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        rows[j] = pool_row(a.pages, first + j, page_size);
    __syncthreads();
    group_scores_threads<KV, DPL, G, TILE>(qs, k, rows, n, group, head_dim, kv_dim, kv_head,
                                           scale, scores, lo, hi);
    group_softmax<false, TILE * G>(scores, TILE * group, n, red, nullptr, 0);
    // Warp w sums token w % TILE's values, with the tile's other warps of that token.
    const int warp = threadIdx.x >> 5, mine = warp % TILE;
    int begin = 0, end = 0;
#pragma unroll
    for (int i = 0; i < TILE; ++i) {
        if (i == mine) {
            begin = lo[i];
            end = hi[i] + 1;
        }
    }
    group_sum_vectors<KV, G>(scores + mine * group * n, v, rows, n, begin, end, group, head_dim,
                             kv_dim, kv_head, warp / TILE, WARPS / TILE, partial + warp * gd);
    __syncthreads();
    for (int e = threadIdx.x; e < TILE * gd; e += blockDim.x) {
        const int i = e / gd, r = e % gd;
        float sum = 0.0f;
        for (int w = i; w < WARPS; w += TILE) sum += partial[w * gd + r];
        out[(size_t)(lead + i) * n_head * head_dim + (size_t)kv_head * gd + r] =
            from_float<OUT>(sum);
    }
}

// The cascade (`AttentionKernel::Cascade`): a batch's sequences that share their first P
// positions' pages (an extraction job's instructions, held once by the radix cache) attend to
// them once for all of them. Per new token, `token_shared` is P where the token's sequence holds
// the batch's shared prefix (kernel_plan and ragged.rs choose it), else 0. This launch computes
// the shared positions' share of every such token's attention, in split-K's form: the grid is
// (tokens / PREFIX_ROWS rounded up, key-value heads, slots); a block takes PREFIX_ROWS tokens in
// batch order, each with its group's query heads (PREFIX_ROWS * group query rows), reads the
// prefix's key and value rows PREFIX_CHUNK positions at a time into shared memory once for all
// of them, and keeps an online softmax per query row (its running maximum m, its sum l, and the
// sums of weighted values, rescaled by exp(m_old - m_new) as m grows). Slot z of the gridDim.z
// takes the z-th of as many equal runs of whole chunks, and writes its (m, l, sums) at slot z of
// the split kernel's layout ([tokens, n_head, slots, head_dim] and [.., 2]); the split kernel
// then computes each token's own positions, P onwards, into the slots after them
// (`slot0` = gridDim.z here), and the combine adds them all. A token outside the shared prefix,
// or a slot past P, gets m = -inf, l = 0, which the combine weighs 0 without reading the sums.
// Every member row of the batch reads one prefix, so a block reads it through its first
// member's block table. Where a step's decode rows each read the same few hundred shared
// positions (an 8B model at batch 256: a third to half of the attention's bytes), this reads
// them once per PREFIX_ROWS tokens and multiplies them from shared memory.
//
// Threads: in the scores, thread i takes query rows i / 8 (+ 32, ...) against positions i % 8,
// i % 8 + 8, ... of the chunk (the key rows padded by 16 bytes, so the 8 positions a warp reads
// at once fall in different banks); in the softmax a warp takes PREFIX_ROWS * G / 8 query rows, a
// lane two positions; in the weighted sums thread i takes query rows i / 8 (+ 32, ...) and the
// 16-byte pieces i % 8, i % 8 + 8, ... of the value rows (8 lanes, a row's 128 consecutive
// bytes). Heads whose rows split into 8 pieces per lane evenly (head_dim a multiple of
// 8 * 16 / sizeof(KV): 64, 128, 256 in f16) only: the plan runs the others as `warps`.
// Dynamic shared memory (kernel_plan's prefix_shared_bytes): the query rows, (head_dim + 4)
// floats each; the key and value chunks, (head_dim * sizeof(KV) + 16) bytes a position; the
// weights, PREFIX_SCORE_STRIDE floats a query row; m, l and the rescaling, a float each per row.
#define PREFIX_ROWS 8           // kernel_plan::PREFIX_ROWS
#define PREFIX_CHUNK 64         // kernel_plan::PREFIX_CHUNK
#define PREFIX_SCORE_STRIDE 72  // a query row's weights: 64 and 8 floats of padding (banks)
template <typename KV, int DPL, int G>
__device__ void paged_attention_prefix(
    const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
    const uint32_t* __restrict__ token_seq, const uint32_t* __restrict__ token_shared,
    const uint32_t* __restrict__ page_start, const uint32_t* __restrict__ block_table,
    float* __restrict__ part, float* __restrict__ ml, int tokens, int n_head, int n_kv,
    int head_dim, int page_size, float scale, int slots) {
    constexpr int PER = 16 / sizeof(KV);  // values per 16-byte piece
    constexpr int Q = PREFIX_ROWS * G;    // query rows a block has room for
    constexpr int QPT = Q / 32;           // query rows a thread takes in the scores and sums
    constexpr int PIECES = DPL * 4 / PER; // 16-byte pieces a thread sums, at most (head_dim / 8)
    constexpr int POS = PREFIX_CHUNK / 8; // positions a thread scores per chunk
    static_assert(Q % 32 == 0 && Q / 8 <= 32, "query rows by warps and lanes");
    static_assert(PREFIX_CHUNK == 64, "a lane takes two positions in the softmax");
    DYNAMIC_SHARED(float, shared);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r0 = blockIdx.x * PREFIX_ROWS, kv_head = blockIdx.y;
    const int group = n_head / n_kv, kv_dim = n_kv * head_dim;
    const int real = min(PREFIX_ROWS, tokens - r0);
    // The prefix (every member's is the batch's one) and the first member, whose table is read.
    int prefix = 0, lead = -1;
    for (int i = 0; i < real; ++i) {
        const int s = (int)token_shared[r0 + i];
        if (s > 0) {
            prefix = s;
            if (lead < 0) lead = r0 + i;
        }
    }
    const int per = ((prefix + (int)gridDim.z - 1) / (int)gridDim.z + PREFIX_CHUNK - 1) /
                    PREFIX_CHUNK * PREFIX_CHUNK;
    const int begin = (int)blockIdx.z * per, end = min(prefix, begin + per);
    // Slot z of token r0 + i's query head g of this group.
    const auto slot = [&](int i, int g) {
        return ((size_t)(r0 + i) * n_head + (size_t)kv_head * group + g) * slots + blockIdx.z;
    };
    if (begin >= end) {  // no member here, or a slot past the prefix: weighed 0
        for (int e = tid; e < real * group; e += blockDim.x) {
            const size_t s = slot(e / group, e % group);
            ml[2 * s] = -INFINITY;
            ml[2 * s + 1] = 0.0f;
        }
        return;
    }
    const int qstride = head_dim + 4, kstride = head_dim + PER;
    float* qs = shared;                                             // Q rows of qstride
    KV* kt = reinterpret_cast<KV*>(qs + Q * qstride);               // PREFIX_CHUNK rows
    KV* vt = kt + PREFIX_CHUNK * kstride;                           // PREFIX_CHUNK rows
    float* w = reinterpret_cast<float*>(vt + PREFIX_CHUNK * kstride);  // Q rows of weights
    float* m = w + Q * PREFIX_SCORE_STRIDE;                         // Q running maxima
    float* l = m + Q;                                               // Q running sums
    float* alpha = l + Q;                                           // Q rescalings
    for (int e = tid; e < Q * head_dim; e += blockDim.x) {
        const int r = e / head_dim, d = e % head_dim;
        const int i = r / group, g = r % group;
        qs[r * qstride + d] =
            r < real * group
                ? q[((size_t)(r0 + i) * n_head + (size_t)kv_head * group + g) * head_dim + d]
                : 0.0f;
    }
    for (int r = tid; r < Q; r += blockDim.x) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const uint32_t* pages = block_table + page_start[token_seq[lead]];
    const int pieces = head_dim / PER, mine = pieces / 8;  // a row's pieces, a thread's in the sums
    const int qa = tid >> 3, part8 = tid & 7;
    float acc[QPT][PIECES][PER] = {};
#pragma unroll 1
    for (int c0 = begin; c0 < end; c0 += PREFIX_CHUNK) {
        const int cn = min(PREFIX_CHUNK, end - c0);
        // The chunk's key and value rows, 16 bytes a load.
        for (int e = tid; e < cn * pieces; e += blockDim.x) {
            const int j = e / pieces, c = e % pieces;
            const size_t at = (size_t)pool_row(pages, c0 + j, page_size) * kv_dim +
                              (size_t)kv_head * head_dim + (size_t)c * PER;
            const uint4 kx = __ldg(reinterpret_cast<const uint4*>(k + at));
            const uint4 vx = __ldg(reinterpret_cast<const uint4*>(v + at));
            SHARED_STORE16(kt + j * kstride + c * PER, kx);
            SHARED_STORE16(vt + j * kstride + c * PER, vx);
        }
        __syncthreads();
        // Scores: query rows qa (+ 32 ...) against positions part8 + 8 p.
        float dot[QPT][POS] = {};
#pragma unroll 1
        for (int d = 0; d < head_dim; d += PER) {
            float qx[QPT][PER];
#pragma unroll
            for (int u = 0; u < QPT; ++u)
#pragma unroll
                for (int e = 0; e < PER; e += 4) {
                    const float4 q4 = SHARED_LOAD4(qs + (qa + 32 * u) * qstride + d + e);
                    qx[u][e] = q4.x;
                    qx[u][e + 1] = q4.y;
                    qx[u][e + 2] = q4.z;
                    qx[u][e + 3] = q4.w;
                }
#pragma unroll
            for (int p = 0; p < POS; ++p) {
                const uint4 raw = SHARED_LOAD16(kt + (part8 + 8 * p) * kstride + d);
                const KV* x = reinterpret_cast<const KV*>(&raw);
#pragma unroll
                for (int e = 0; e < PER; ++e) {
                    const float kx = to_float(x[e]);
#pragma unroll
                    for (int u = 0; u < QPT; ++u) dot[u][p] += qx[u][e] * kx;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < QPT; ++u)
#pragma unroll
            for (int p = 0; p < POS; ++p) {
                const int j = part8 + 8 * p;
                w[(qa + 32 * u) * PREFIX_SCORE_STRIDE + j] = j < cn ? dot[u][p] * scale : -INFINITY;
            }
        __syncthreads();
        // The online softmax: a warp per Q / 8 query rows, a lane per two positions.
#pragma unroll 1
        for (int r = warp * (Q / 8); r < (warp + 1) * (Q / 8); ++r) {
            float* wr = w + r * PREFIX_SCORE_STRIDE;
            const float s0 = wr[lane], s1 = wr[lane + 32];
            const float old = m[r];
            const float top = fmaxf(old, warp_max(fmaxf(s0, s1)));  // finite: cn >= 1
            const float p0 = __expf(s0 - top), p1 = __expf(s1 - top);
            wr[lane] = p0;
            wr[lane + 32] = p1;
            const float sum = warp_sum(p0 + p1);
            if (lane == 0) {
                const float a = __expf(old - top);
                alpha[r] = a;
                l[r] = l[r] * a + sum;
                m[r] = top;
            }
        }
        __syncthreads();
        // The weighted sums, rescaled to the new maxima first.
#pragma unroll
        for (int u = 0; u < QPT; ++u) {
            const float a = alpha[qa + 32 * u];
#pragma unroll
            for (int c = 0; c < PIECES; ++c)
#pragma unroll
                for (int e = 0; e < PER; ++e) acc[u][c][e] *= a;
        }
#pragma unroll 2
        for (int j = 0; j < cn; ++j) {
            float wj[QPT];
#pragma unroll
            for (int u = 0; u < QPT; ++u) wj[u] = w[(qa + 32 * u) * PREFIX_SCORE_STRIDE + j];
#pragma unroll
            for (int c = 0; c < PIECES; ++c) {
                if (c < mine) {
                    const uint4 raw = SHARED_LOAD16(vt + j * kstride + (part8 + 8 * c) * PER);
                    const KV* x = reinterpret_cast<const KV*>(&raw);
#pragma unroll
                    for (int e = 0; e < PER; ++e) {
                        const float vx = to_float(x[e]);
#pragma unroll
                        for (int u = 0; u < QPT; ++u) acc[u][c][e] += wj[u] * vx;
                    }
                }
            }
        }
        __syncthreads();
    }
    // Each member row's maximum, sum and sums at slot z; other rows weigh 0.
#pragma unroll
    for (int u = 0; u < QPT; ++u) {
        const int r = qa + 32 * u;
        if (r >= real * group) continue;
        const int i = r / group, g = r % group;
        const bool member = token_shared[r0 + i] > 0;
        const size_t s = slot(i, g);
        if (part8 == 0) {
            ml[2 * s] = member ? m[r] : -INFINITY;
            ml[2 * s + 1] = member ? l[r] : 0.0f;
        }
        if (!member) continue;
#pragma unroll
        for (int c = 0; c < PIECES; ++c)
            if (c < mine)
#pragma unroll
                for (int e = 0; e < PER; ++e)
                    part[s * head_dim + (part8 + 8 * c) * PER + e] = acc[u][c][e];
    }
}

// The forms: a pool's element type, and the output's (the `_out16` forms write f16). Every
// one-token form takes `reads` last (the L2 prefetch's bits and STAGE_KEYS; the per-dimension
// layout takes it and ignores it, so that the launchers pass one signature).
#define PAGED_ATTENTION(NAME, KV, OUT)                                                         \
    extern "C" __global__ void NAME(                                                           \
        const float* q, const KV* k, const KV* v, const uint32_t* token_seq,                  \
        const uint32_t* token_pos, const uint32_t* page_start, const uint32_t* block_table,   \
        OUT* out, int n_head, int n_kv, int head_dim, int page_size, float scale,             \
        int window, int reads) {                                                               \
        paged_attention<KV, OUT, 0, MAX_GROUP, false>(q, k, v, token_seq, token_pos,         \
                                                      page_start, block_table, out, n_head,   \
                                                      n_kv, head_dim, page_size, scale,       \
                                                      window, 0, nullptr, nullptr, 0,         \
                                                      blockIdx.x, reads);                     \
    }

// The warps and split forms ask ptxas for three blocks of 256 threads an SM where groups are at
// most 4 (85 registers a thread at most; it gives them 80 without spilling) and two for 8: where
// the `g4` forms were left to ptxas, the fused reductions made some of the split ones take 96-107
// registers, two blocks an SM.
#define PAGED_ATTENTION_WARPS(NAME, KV, OUT, DPL, G)                                           \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, G == 4 ? 3 : 2) NAME(             \
        const float* q, const KV* k, const KV* v, const uint32_t* token_seq,                  \
        const uint32_t* token_pos, const uint32_t* page_start, const uint32_t* block_table,   \
        OUT* out, int n_head, int n_kv, int head_dim, int page_size, float scale,             \
        int window, int reads) {                                                               \
        paged_attention<KV, OUT, DPL, G, false>(q, k, v, token_seq, token_pos, page_start,   \
                                                block_table, out, n_head, n_kv, head_dim,      \
                                                page_size, scale, window, 0, nullptr, nullptr, \
                                                0, blockIdx.x, reads);                         \
    }

#define PAGED_ATTENTION_TILED(NAME, KV, OUT, DPL, G)                                           \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) NAME(                          \
        const float* q, const KV* k, const KV* v, const uint32_t* token_seq,                  \
        const uint32_t* token_pos, const uint32_t* page_start, const uint32_t* block_table,   \
        OUT* out, int n_head, int n_kv, int head_dim, int page_size, float scale,             \
        int window, int tokens) {                                                              \
        paged_attention_tiled<KV, OUT, DPL, G>(q, k, v, token_seq, token_pos, page_start,    \
                                               block_table, out, n_head, n_kv, head_dim,       \
                                               page_size, scale, window, tokens);              \
    }

// The split-K kernels: `out` is the chunks' sums and `ml` their maxima and sums (see the top).
// `slot0` > 0 (the cascade): the slots before it are the shared prefix's, and a token whose
// `token_shared` is P starts at position P; `token_shared` is not read where `slot0` is 0.
// `counters` not null: the last block of each (token, key-value head) combines the chunks into
// `combined`, or `combined16` where that is not null (combine_if_last); null: the combine's
// launch does.
#define PAGED_ATTENTION_SPLIT(NAME, KV, DPL, G)                                                \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, G == 4 ? 3 : 2) NAME(             \
        const float* q, const KV* k, const KV* v, const uint32_t* token_seq,                  \
        const uint32_t* token_pos, const uint32_t* page_start, const uint32_t* block_table,   \
        float* out, int n_head, int n_kv, int head_dim, int page_size, float scale,           \
        int window, int chunk, float* ml, const uint32_t* token_shared, int slot0,             \
        uint32_t* counters, float* combined, __half* combined16, int reads) {                 \
        paged_attention<KV, float, DPL, G, true>(q, k, v, token_seq, token_pos, page_start,  \
                                                 block_table, out, n_head, n_kv, head_dim,     \
                                                 page_size, scale, window, chunk, ml,          \
                                                 token_shared, slot0, blockIdx.x, reads);      \
        if (counters)                                                                          \
            combine_if_last(out, ml, counters, combined, combined16, n_head, n_kv, head_dim,   \
                            slot0 + gridDim.z, blockIdx.x);                                    \
    }

// The cascade's prefix forms: the split layout's results for the shared prefix (see above).
#define PAGED_ATTENTION_PREFIX(NAME, KV, DPL, G)                                               \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) NAME(                          \
        const float* q, const KV* k, const KV* v, const uint32_t* token_seq,                  \
        const uint32_t* token_shared, const uint32_t* page_start,                             \
        const uint32_t* block_table, float* part, float* ml, int tokens, int n_head,          \
        int n_kv, int head_dim, int page_size, float scale, int slots) {                      \
        paged_attention_prefix<KV, DPL, G>(q, k, v, token_seq, token_shared, page_start,     \
                                           block_table, part, ml, tokens, n_head, n_kv,        \
                                           head_dim, page_size, scale, slots);                 \
    }

// The forms by pool type and kind. build.rs compiles a module of each pool type's one-token forms
// (per-dimension, warps, split, and the combine: -DQUARRY_POOL_F16=1 -DQUARRY_TILED=0
// -DQUARRY_PREFIX=0, the other pools 0), one of its tiled forms (-DQUARRY_TILED=1) and one of
// its cascade prefix forms (-DQUARRY_PREFIX=1), since the driver compiles a module's PTX whole
// the first time it is loaded: a process reads one pool type, and only `attention = tiled` and
// `attention = cascade` load the other two (5.2 MB of PTX for f16's tiled forms, where the
// one-token forms take 2.9). Compiled without them (quarry-cuda-emu), the file holds every form.
#ifndef QUARRY_POOL_F32
#define QUARRY_POOL_F32 1
#define QUARRY_POOL_F16 1
#define QUARRY_POOL_BF16 1
#endif
#ifndef QUARRY_TILED
#define QUARRY_ONE_TOKEN_FORMS 1
#define QUARRY_TILED_FORMS 1
#define QUARRY_PREFIX_FORMS 1
#else
#define QUARRY_ONE_TOKEN_FORMS (!QUARRY_TILED && !QUARRY_PREFIX)
#define QUARRY_TILED_FORMS QUARRY_TILED
#define QUARRY_PREFIX_FORMS QUARRY_PREFIX
#endif

// Every one-token form of a pool type P (f32, f16, bf16) of element KV: per-dimension, then warps
// and split for heads of up to 64, 128 and 256 dimensions and groups of up to 4 and 8; and every
// tiled form.
#define PAGED_ATTENTION_WARPS_DPL(P, KV, DPL, G)                                                \
    PAGED_ATTENTION_WARPS(paged_attention_warps##DPL##g##G##_##P, KV, float, DPL, G)            \
    PAGED_ATTENTION_WARPS(paged_attention_warps##DPL##g##G##_##P##_out16, KV, __half, DPL, G)   \
    PAGED_ATTENTION_SPLIT(paged_attention_split##DPL##g##G##_##P, KV, DPL, G)
#define PAGED_ATTENTION_TILED_DPL(P, KV, DPL, G)                                                \
    PAGED_ATTENTION_TILED(paged_attention_tiled##DPL##g##G##_##P, KV, float, DPL, G)            \
    PAGED_ATTENTION_TILED(paged_attention_tiled##DPL##g##G##_##P##_out16, KV, __half, DPL, G)
#define PAGED_ATTENTION_HEADS(FORMS, P, KV, G)                                                 \
    FORMS(P, KV, 2, G)                                                                          \
    FORMS(P, KV, 4, G)                                                                          \
    FORMS(P, KV, 8, G)
#define PAGED_ATTENTION_POOL(P, KV)                                                            \
    PAGED_ATTENTION(paged_attention_##P, KV, float)                                             \
    PAGED_ATTENTION(paged_attention_##P##_out16, KV, __half)                                    \
    PAGED_ATTENTION_HEADS(PAGED_ATTENTION_WARPS_DPL, P, KV, 4)                                  \
    PAGED_ATTENTION_HEADS(PAGED_ATTENTION_WARPS_DPL, P, KV, 8)
#define PAGED_ATTENTION_POOL_TILED(P, KV)                                                      \
    PAGED_ATTENTION_HEADS(PAGED_ATTENTION_TILED_DPL, P, KV, 4)                                  \
    PAGED_ATTENTION_HEADS(PAGED_ATTENTION_TILED_DPL, P, KV, 8)
#define PAGED_ATTENTION_PREFIX_DPL(P, KV, DPL, G)                                               \
    PAGED_ATTENTION_PREFIX(paged_attention_prefix##DPL##g##G##_##P, KV, DPL, G)
#define PAGED_ATTENTION_POOL_PREFIX(P, KV)                                                     \
    PAGED_ATTENTION_HEADS(PAGED_ATTENTION_PREFIX_DPL, P, KV, 4)                                 \
    PAGED_ATTENTION_HEADS(PAGED_ATTENTION_PREFIX_DPL, P, KV, 8)

#if QUARRY_ONE_TOKEN_FORMS && QUARRY_POOL_F32
PAGED_ATTENTION_POOL(f32, float)
#endif
#if QUARRY_ONE_TOKEN_FORMS && QUARRY_POOL_F16
PAGED_ATTENTION_POOL(f16, __half)
#endif
#if QUARRY_ONE_TOKEN_FORMS && QUARRY_POOL_BF16
PAGED_ATTENTION_POOL(bf16, __nv_bfloat16)
#endif
#if QUARRY_TILED_FORMS && QUARRY_POOL_F32
PAGED_ATTENTION_POOL_TILED(f32, float)
#endif
#if QUARRY_TILED_FORMS && QUARRY_POOL_F16
PAGED_ATTENTION_POOL_TILED(f16, __half)
#endif
#if QUARRY_TILED_FORMS && QUARRY_POOL_BF16
PAGED_ATTENTION_POOL_TILED(bf16, __nv_bfloat16)
#endif
#if QUARRY_PREFIX_FORMS && QUARRY_POOL_F32
PAGED_ATTENTION_POOL_PREFIX(f32, float)
#endif
#if QUARRY_PREFIX_FORMS && QUARRY_POOL_F16
PAGED_ATTENTION_POOL_PREFIX(f16, __half)
#endif
#if QUARRY_PREFIX_FORMS && QUARRY_POOL_BF16
PAGED_ATTENTION_POOL_PREFIX(bf16, __nv_bfloat16)
#endif

#if QUARRY_ONE_TOKEN_FORMS
// Split-K's combine as its own launch: one block per (token, query head), a thread per
// dimension (combine_one).
extern "C" __global__ void paged_attention_combine(const float* part, const float* ml, float* out,
                                                   int head_dim, int splits) {
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
        combine_one<float, false>(part, ml, out, blockIdx.x, i, head_dim, splits);
}
extern "C" __global__ void paged_attention_combine_out16(const float* part, const float* ml,
                                                         __half* out, int head_dim, int splits) {
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
        combine_one<__half, false>(part, ml, out, blockIdx.x, i, head_dim, splits);
}
#endif  // QUARRY_ONE_TOKEN_FORMS
