// cub's BlockReduce on the CPU (quarry-cuda-emu): the block's values through shared slots, reduced
// in thread order by thread 0, which alone gets the result, as in cub (every other thread gets a
// poisoned value, so a kernel that reads it elsewhere fails its test). Like cub's, the storage
// may be reused only after a __syncthreads.
#pragma once
#include "../../cuda_emu.h"
#include "poison.h"

namespace cub {
template <typename T, int THREADS>
class BlockReduce {
  public:
    struct TempStorage {
        T slot[THREADS];
    };
    explicit BlockReduce(TempStorage& storage) : s_(storage) {}

    template <typename Op>
    T Reduce(T x, Op op) {
        if (blockDim.x != THREADS) quarry_emu::fail("BlockReduce: the block is not THREADS threads");
        s_.slot[threadIdx.x] = x;
        __syncthreads();
        if (threadIdx.x != 0) return quarry_emu::poison<T>();
        T r = s_.slot[0];
        for (int i = 1; i < THREADS; ++i) r = op(r, s_.slot[i]);
        return r;
    }
    T Sum(T x) {
        return Reduce(x, [](const T& a, const T& b) { return a + b; });
    }

  private:
    TempStorage& s_;
};
}  // namespace cub
