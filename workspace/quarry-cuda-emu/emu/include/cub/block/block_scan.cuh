// cub's BlockScan on the CPU (quarry-cuda-emu): each thread adds the slots of the threads up to
// its own (inclusive) and all of them (the block's aggregate, which every thread gets, as in
// cub). Like cub's, the storage may be reused only after a __syncthreads.
#pragma once
#include "../../cuda_emu.h"

namespace cub {
template <typename T, int THREADS>
class BlockScan {
  public:
    struct TempStorage {
        T slot[THREADS];
    };
    explicit BlockScan(TempStorage& storage) : s_(storage) {}

    void InclusiveSum(T x, T& inclusive, T& aggregate) {
        if (blockDim.x != THREADS) quarry_emu::fail("BlockScan: the block is not THREADS threads");
        s_.slot[threadIdx.x] = x;
        __syncthreads();
        T sum = T();
        for (unsigned i = 0; i < THREADS; ++i) {
            sum = sum + s_.slot[i];
            if (i == threadIdx.x) inclusive = sum;
        }
        aggregate = sum;
    }

  private:
    TempStorage& s_;
};
}  // namespace cub
