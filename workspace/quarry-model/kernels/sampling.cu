// Masks, bans and sampling for a whole step's rows in one launch: the logits stay on
// the GPU and only one token id (and a status) per row comes back to the host.
//
// One block of 512 threads per row computes exactly the draw that `pick` in src/sampling.rs
// defines (its module documentation is the specification), on its row of logits (logit_row[r])
// after the row's edits, which are those the host applies in quarry-engine's `logits.rs`:
//   - bans: the ids in ban_ids[ban_start[r] .. ban_start[r + 1]] get -inf (the logit processors
//     and the end-of-generation ban while thinking, gathered by the host);
//   - the mask: when mask_index[r] is not NO_MASK, row r's token i survives only if bit i % 32 of
//     word i / 32 of mask `mask_index[r]` (words_per_mask words each) is set, and only if it is
//     covered by the mask at all (a vocabulary padded past the tokenizer's is masked).
// Then: a NaN logit is an error (status 2, token = its id); no candidate left is an error
// (status 1); temperature 0 is the first maximum; otherwise top-k by (logit desc, id asc), weights
// exp((logit - max) / temperature), top-p by (weight desc, id asc), and the uniform walks the
// kept tokens in id order. The k-th logit and the top-p boundary weight are found by radix
// selection on their bit patterns (four passes of 8-bit digits over the row, no sort), ties at
// the boundary resolved by token id with a block scan; the final walk is a block prefix sum.
// Sums are in double, like the host's; they are added in another order, so the two devices agree
// except when the uniform falls within rounding of a boundary between two tokens.

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <stdint.h>

#define SAMPLE_THREADS 512
#define NO_MASK 0xffffffffu

enum Status : uint32_t { OK = 0, ALL_MASKED = 1, NAN_LOGIT = 2 };

struct ArgMax {
    float value;
    uint32_t index;
};

struct ArgMaxOp {
    __device__ __forceinline__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
        if (a.value > b.value) return a;
        if (b.value > a.value) return b;
        return a.index <= b.index ? a : b;
    }
};

struct MinOp {
    __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return a < b ? a : b; }
};
struct MaxOp {
    __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};

// Order-preserving map from a float's bits to an unsigned key (-0 below +0, as total_cmp).
__device__ __forceinline__ uint32_t logit_key(float x) {
    const uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

typedef cub::BlockReduce<ArgMax, SAMPLE_THREADS> ReduceArgMax;
typedef cub::BlockReduce<uint32_t, SAMPLE_THREADS> ReduceU32;
typedef cub::BlockReduce<double, SAMPLE_THREADS> ReduceF64;
typedef cub::BlockScan<uint32_t, SAMPLE_THREADS> ScanU32;
typedef cub::BlockScan<double, SAMPLE_THREADS> ScanF64;

struct Shared {
    union {
        ReduceArgMax::TempStorage argmax;
        ReduceU32::TempStorage reduce_u32;
        ReduceF64::TempStorage reduce_f64;
        ScanU32::TempStorage scan_u32;
        ScanF64::TempStorage scan_f64;
    } cub;
    uint32_t count[256];
    double mass[256];
    uint32_t word;  // a value thread 0 hands to the block
    double value;
    int found;
};

// The row as the host's edits leave it.
struct RowView {
    const float* logits;
    const uint32_t* mask;  // nullptr: unconstrained
    uint32_t covered;      // tokens the mask covers
    __device__ __forceinline__ float operator()(uint32_t i) const {
        if (mask != nullptr && (i >= covered || !((mask[i >> 5] >> (i & 31)) & 1u))) return -INFINITY;
        return logits[i];
    }
};

// The id of the `rank`-th token (1-based, in id order) for which `pred` holds; every thread gets
// it. The caller guarantees there are at least `rank` such tokens.
template <typename Pred>
__device__ uint32_t nth_in_id_order(Shared& sh, uint32_t vocab, uint32_t rank, Pred pred) {
    uint32_t carry = 0;
    if (threadIdx.x == 0) sh.found = 0;
    __syncthreads();
    for (uint32_t base = 0; base < vocab; base += SAMPLE_THREADS) {
        const uint32_t i = base + threadIdx.x;
        const uint32_t hit = (i < vocab && pred(i)) ? 1u : 0u;
        uint32_t incl, total;
        ScanU32(sh.cub.scan_u32).InclusiveSum(hit, incl, total);
        if (hit && carry + incl == rank) {
            sh.word = i;
            sh.found = 1;
        }
        __syncthreads();
        if (sh.found) break;
        carry += total;
    }
    const uint32_t id = sh.word;
    __syncthreads();
    return id;
}

// Radix selection by count: the key of the `rank`-th largest key (1-based) among tokens for which
// `key_of` returns true, and how many tokens with exactly that key are taken (in id order) to
// reach `rank`.
template <typename KeyOf>
__device__ uint32_t select_by_count(Shared& sh, uint32_t vocab, uint32_t& rank, KeyOf key_of) {
    uint32_t prefix = 0, prefix_mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += SAMPLE_THREADS) sh.count[d] = 0;
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
            uint32_t key;
            if (key_of(i, key) && (key & prefix_mask) == prefix) atomicAdd(&sh.count[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t above = 0, digit = 0;
            for (int d = 255; d >= 0; --d) {
                if (above + sh.count[d] >= rank) {
                    digit = (uint32_t)d;
                    break;
                }
                above += sh.count[d];
            }
            sh.word = digit;
            sh.value = (double)above;
        }
        __syncthreads();
        prefix |= sh.word << shift;
        prefix_mask |= 255u << shift;
        rank -= (uint32_t)sh.value;
        __syncthreads();
    }
    return prefix;
}

// Radix selection by mass: the bit pattern of the weight at which the running weight, in the
// order (weight desc), first reaches `need`; `need` comes back as what tokens of exactly that
// weight must still supply. Returns false when the whole mass falls short of `need` (rounding):
// then every token is kept, as the host does.
template <typename WeightOf>
__device__ bool select_by_mass(Shared& sh, uint32_t vocab, double& need, uint32_t& boundary, WeightOf weight_of) {
    uint32_t prefix = 0, prefix_mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += SAMPLE_THREADS) sh.mass[d] = 0.0;
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
            float w;
            if (weight_of(i, w)) {
                const uint32_t key = __float_as_uint(w);
                if ((key & prefix_mask) == prefix) atomicAdd(&sh.mass[(key >> shift) & 255u], (double)w);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double above = 0.0;
            int digit = -1;
            for (int d = 255; d >= 0; --d) {
                if (above + sh.mass[d] >= need) {
                    digit = d;
                    break;
                }
                above += sh.mass[d];
            }
            sh.found = digit >= 0;
            sh.word = digit < 0 ? 0u : (uint32_t)digit;
            sh.value = above;
        }
        __syncthreads();
        if (!sh.found) {
            __syncthreads();
            return false;
        }
        prefix |= sh.word << shift;
        prefix_mask |= 255u << shift;
        need -= sh.value;
        __syncthreads();
    }
    boundary = prefix;
    return true;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows(
    float* __restrict__ logits, const uint32_t* __restrict__ logit_row, uint32_t vocab,
    const uint32_t* __restrict__ mask_words,
    uint32_t words_per_mask, const uint32_t* __restrict__ mask_index,
    const uint32_t* __restrict__ ban_start, const uint32_t* __restrict__ ban_ids,
    const float* __restrict__ temperature, const uint32_t* __restrict__ top_k,
    const float* __restrict__ top_p, const double* __restrict__ uniform,
    uint32_t* __restrict__ token, uint32_t* __restrict__ status) {
    __shared__ Shared sh;
    const uint32_t r = blockIdx.x;
    float* row = logits + (size_t)logit_row[r] * vocab;
    for (uint32_t j = ban_start[r] + threadIdx.x; j < ban_start[r + 1]; j += SAMPLE_THREADS) {
        if (ban_ids[j] < vocab) row[ban_ids[j]] = -INFINITY;
    }
    __syncthreads();
    RowView x{row, nullptr, 0};
    if (mask_index[r] != NO_MASK) {
        x.mask = mask_words + (size_t)mask_index[r] * words_per_mask;
        x.covered = min(words_per_mask * 32u, vocab);
    }

    // The maximum (first on ties), the first NaN, the candidates.
    ArgMax best{-INFINITY, 0xffffffffu};
    uint32_t nan_at = 0xffffffffu, candidates = 0;
    for (uint32_t i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        const float v = x(i);
        if (isnan(v)) nan_at = min(nan_at, i);
        else if (v > -INFINITY) {
            ++candidates;
            if (v > best.value) best = ArgMax{v, i};
        }
    }
    best = ReduceArgMax(sh.cub.argmax).Reduce(best, ArgMaxOp());
    __syncthreads();
    nan_at = ReduceU32(sh.cub.reduce_u32).Reduce(nan_at, MinOp());
    __syncthreads();
    candidates = ReduceU32(sh.cub.reduce_u32).Sum(candidates);
    if (threadIdx.x == 0) {
        sh.word = nan_at;
        sh.found = (int)candidates;
        sh.value = best.value;
        sh.count[0] = best.index;
    }
    __syncthreads();
    nan_at = sh.word;
    candidates = (uint32_t)sh.found;
    const float top = (float)sh.value;
    const uint32_t argmax = sh.count[0];
    __syncthreads();
    if (nan_at != 0xffffffffu || candidates == 0) {
        if (threadIdx.x == 0) {
            status[r] = nan_at != 0xffffffffu ? NAN_LOGIT : ALL_MASKED;
            token[r] = nan_at;
        }
        return;
    }
    const float t = temperature[r];
    if (t == 0.0f) {
        if (threadIdx.x == 0) {
            status[r] = OK;
            token[r] = argmax;
        }
        return;
    }

    // Top-k: the k-th key and the last token id taken at that key.
    const uint32_t k = top_k[r];
    const bool by_k = k > 0 && k < candidates;
    uint32_t kth = 0, k_cut = 0;
    if (by_k) {
        uint32_t rank = k;
        kth = select_by_count(sh, vocab, rank, [&](uint32_t i, uint32_t& key) {
            const float v = x(i);
            key = logit_key(v);
            return v > -INFINITY;
        });
        k_cut = nth_in_id_order(sh, vocab, rank, [&](uint32_t i) {
            const float v = x(i);
            return v > -INFINITY && logit_key(v) == kth;
        });
    }
    const float inv_t = 1.0f / t;
    auto kept_by_k = [&](uint32_t i, float& w) {
        const float v = x(i);
        if (!(v > -INFINITY)) return false;
        if (by_k) {
            const uint32_t key = logit_key(v);
            if (key < kth || (key == kth && i > k_cut)) return false;
        }
        w = expf((v - top) * inv_t);
        return true;
    };

    // Top-p: the boundary weight and the last token id taken at that weight.
    const float p = top_p[r];
    bool by_p = false;
    uint32_t p_bits = 0, p_cut = 0;
    if (p < 1.0f) {
        double total = 0.0;
        for (uint32_t i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
            float w;
            if (kept_by_k(i, w)) total += (double)w;
        }
        total = ReduceF64(sh.cub.reduce_f64).Sum(total);
        if (threadIdx.x == 0) sh.value = total;
        __syncthreads();
        double need = (double)p * sh.value;
        __syncthreads();
        by_p = select_by_mass(sh, vocab, need, p_bits, kept_by_k);
        if (by_p) {
            const double v = (double)__uint_as_float(p_bits);
            const uint32_t m = v > 0.0 ? max(1u, (uint32_t)ceil(need / v)) : 1u;
            uint32_t equal = 0;
            for (uint32_t i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
                float w;
                if (kept_by_k(i, w) && __float_as_uint(w) == p_bits) ++equal;
            }
            equal = ReduceU32(sh.cub.reduce_u32).Sum(equal);
            if (threadIdx.x == 0) sh.word = equal;
            __syncthreads();
            equal = sh.word;
            __syncthreads();
            p_cut = nth_in_id_order(sh, vocab, min(m, equal), [&](uint32_t i) {
                float w;
                return kept_by_k(i, w) && __float_as_uint(w) == p_bits;
            });
        }
    }
    auto kept = [&](uint32_t i, float& w) {
        if (!kept_by_k(i, w)) return false;
        if (by_p) {
            const uint32_t bits = __float_as_uint(w);
            if (bits < p_bits || (bits == p_bits && i > p_cut)) return false;
        }
        return true;
    };

    // The walk: the kept mass, then the first kept token in id order whose running weight
    // exceeds uniform * mass; rounding past the end takes the last kept token.
    double mass = 0.0;
    uint32_t last = 0;
    for (uint32_t i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        float w;
        if (kept(i, w)) {
            mass += (double)w;
            last = max(last, i);
        }
    }
    mass = ReduceF64(sh.cub.reduce_f64).Sum(mass);
    __syncthreads();
    last = ReduceU32(sh.cub.reduce_u32).Reduce(last, MaxOp());
    if (threadIdx.x == 0) {
        sh.value = uniform[r] * mass;
        sh.word = last;
        sh.found = 0;
    }
    __syncthreads();
    const double target = sh.value;
    __syncthreads();
    double carry = 0.0;
    for (uint32_t base = 0; base < vocab; base += SAMPLE_THREADS) {
        const uint32_t i = base + threadIdx.x;
        float w = 0.0f;
        const bool in = i < vocab && kept(i, w);
        double incl, tile;
        ScanF64(sh.cub.scan_f64).InclusiveSum(in ? (double)w : 0.0, incl, tile);
        __syncthreads();
        // The first kept token whose running weight exceeds the target (the lowest id that does,
        // so rounding in the scan cannot make two threads claim it).
        uint32_t first = (in && carry + incl > target) ? i : 0xffffffffu;
        first = ReduceU32(sh.cub.reduce_u32).Reduce(first, MinOp());
        if (threadIdx.x == 0 && first != 0xffffffffu) {
            sh.word = first;
            sh.found = 1;
        }
        __syncthreads();
        if (sh.found) break;
        carry += tile;
    }
    if (threadIdx.x == 0) {
        status[r] = OK;
        token[r] = sh.word;
    }
}
