// The launch: blocks one after another on the calling OS thread, each block's threads as fibers
// on stacks of their own, switched cooperatively at barriers (see cuda_emu.h). x86-64 System V
// only: the switch below saves the callee-saved registers and the floating-point control words.

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <string>
#include <vector>

#include "cuda_emu.h"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

extern "C" void quarry_emu_switch(void** save_sp, void* to_sp);
extern "C" void quarry_emu_fiber_start();

asm(R"(
    .text
    .globl quarry_emu_switch
    .type quarry_emu_switch,@function
quarry_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size quarry_emu_switch, .-quarry_emu_switch

    .globl quarry_emu_fiber_start
    .type quarry_emu_fiber_start,@function
quarry_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size quarry_emu_fiber_start, .-quarry_emu_fiber_start
    .section .note.GNU-stack,"",@progbits
    .text
)");

namespace quarry_emu {
namespace {

constexpr size_t STACK = 256 * 1024;
constexpr size_t GUARD = 4096;
constexpr size_t CANARY = 64;

enum class State { Ready, Block, Warp, Done };

struct Fiber {
    void* sp = nullptr;
    char* base = nullptr;  // the mapping: a guard page, then the stack
    State state = State::Ready;
    uint64_t waits_for = 0;  // the barrier generation it waits to see pass
};

// A barrier over the threads still running (a block's, or a warp's): it opens, and its
// generation advances, when every live thread has arrived; a thread that returns leaves it, which
// may open it for the others.
struct Barrier {
    uint64_t generation = 0;
    unsigned arrived = 0, live = 0;

    // True when this arrival opens the barrier (the caller runs on); else the caller waits for
    // `generation` to pass.
    bool arrive() {
        if (++arrived < live) return false;
        arrived = 0;
        ++generation;
        return true;
    }
    void leave() {
        if (--live == arrived && arrived > 0) {
            arrived = 0;
            ++generation;
        }
    }
};

struct Warp {
    Barrier barrier;
    uint64_t slots[32];
};

struct Launch {
    const char* name;
    void (*body)(void*);
    void* data;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    Barrier block;
    void* scheduler_sp = nullptr;
    unsigned current = 0;
    // __syncthreads_or's votes, by the block barrier's generation's parity: a generation's slot is
    // cleared by its first arrival, and read by its threads before the next generation can end.
    int votes[2] = {0, 0};
    std::vector<unsigned char> shared;  // 16 bytes of alignment slack, the memory, a canary
    size_t shared_bytes = 0;
    std::string error;
};

thread_local Launch* L = nullptr;

unsigned char* shared_start(Launch& l) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(l.shared.data());
    return reinterpret_cast<unsigned char*>((p + 15) & ~uintptr_t(15));
}

void yield() {
    Launch& l = *L;
    quarry_emu_switch(&l.fibers[l.current].sp, l.scheduler_sp);
}

extern "C" void quarry_emu_fiber_main(Launch* l) {
    l->body(l->data);
    // The thread has returned: it no longer counts at the barriers of its block and warp.
    Fiber& f = l->fibers[l->current];
    f.state = State::Done;
    l->block.leave();
    l->warps[l->current / 32].barrier.leave();
    yield();
    __builtin_trap();  // a finished fiber is never resumed
}

// A fresh stack whose first switch enters quarry_emu_fiber_start with r12 = the launch and
// r13 = quarry_emu_fiber_main.
void prepare(Fiber& f, Launch* l) {
    uint64_t* top = reinterpret_cast<uint64_t*>(f.base + GUARD + STACK);
    uint64_t* sp = top - 10;  // 16-byte aligned: the ret below leaves rsp 16-byte aligned
    uint32_t mxcsr;
    uint16_t fpcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    sp[0] = (uint64_t)mxcsr | ((uint64_t)fpcw << 32);
    sp[1] = 0;                                                        // r15
    sp[2] = 0;                                                        // r14
    sp[3] = reinterpret_cast<uint64_t>(&quarry_emu_fiber_main);       // r13
    sp[4] = reinterpret_cast<uint64_t>(l);                            // r12
    sp[5] = 0;                                                        // rbx
    sp[6] = 0;                                                        // rbp
    sp[7] = reinterpret_cast<uint64_t>(&quarry_emu_fiber_start);      // return address
    f.sp = sp;
    f.state = State::Ready;
}

bool waiting(const Launch& l, unsigned i) {
    const Fiber& f = l.fibers[i];
    switch (f.state) {
        case State::Ready: return false;
        case State::Block: return f.waits_for == l.block.generation;
        case State::Warp: return f.waits_for == l.warps[i / 32].barrier.generation;
        case State::Done: return true;
    }
    return true;
}

// Runs one block to its end; false (with l.error) on a deadlock.
bool run_block(Launch& l) {
    const unsigned n = (unsigned)l.fibers.size();
    for (auto& f : l.fibers) prepare(f, &l);
    l.block = Barrier{0, 0, n};
    for (unsigned w = 0; w < l.warps.size(); ++w) {
        l.warps[w] = Warp{};
        l.warps[w].barrier.live = n - 32 * w < 32 ? n - 32 * w : 32;
    }
    unsigned char* s = shared_start(l);
    memset(s, 0xff, l.shared_bytes);
    memset(s + l.shared_bytes, 0xa5, CANARY);
    unsigned done = 0;
    while (done < n) {
        bool ran = false;
        for (unsigned i = 0; i < n; ++i) {
            if (waiting(l, i)) continue;
            ran = true;
            l.fibers[i].state = State::Ready;
            l.current = i;
            threadIdx = dim3{i, 0, 0};
            quarry_emu_switch(&l.scheduler_sp, l.fibers[i].sp);
            if (l.fibers[i].state == State::Done) ++done;
        }
        if (!ran && done < n) {
            unsigned in_block = 0, in_warp = 0;
            for (auto& f : l.fibers) {
                in_block += f.state == State::Block;
                in_warp += f.state == State::Warp;
            }
            l.error = std::string(l.name) + ": deadlock in block (" + std::to_string(blockIdx.x) +
                      ", " + std::to_string(blockIdx.y) + ", " + std::to_string(blockIdx.z) +
                      "): " + std::to_string(in_block) + " threads wait at __syncthreads, " +
                      std::to_string(in_warp) +
                      " at a warp exchange, and the others have returned (a barrier not every "
                      "thread of the block reaches)";
            return false;
        }
    }
    for (size_t i = 0; i < CANARY; ++i) {
        if (s[l.shared_bytes + i] != 0xa5) {
            l.error = std::string(l.name) + ": wrote past its " + std::to_string(l.shared_bytes) +
                      " bytes of dynamic shared memory in block (" + std::to_string(blockIdx.x) +
                      ", " + std::to_string(blockIdx.y) + ", " + std::to_string(blockIdx.z) + ")";
            return false;
        }
    }
    return true;
}

}  // namespace

// The calling fiber waits at `b` until it opens (it yields to the scheduler, which resumes it
// once `b`'s generation has passed).
static void wait_at(Barrier& b, State state) {
    Launch& l = *L;
    if (b.arrive()) return;
    Fiber& f = l.fibers[l.current];
    f.state = state;
    f.waits_for = b.generation;
    yield();
}

void sync_block() { wait_at(L->block, State::Block); }

int sync_block_or(int pred) {
    Launch& l = *L;
    const uint64_t g = l.block.generation;
    int& vote = l.votes[g & 1];
    if (l.block.arrived == 0) vote = 0;
    vote |= pred != 0;
    wait_at(l.block, State::Block);
    return l.votes[g & 1];
}

void sync_warp() { wait_at(L->warps[L->current / 32].barrier, State::Warp); }

uint64_t* warp_slots() { return L->warps[L->current / 32].slots; }

void* dynamic_shared() { return shared_start(*L); }

[[noreturn]] void fail(const char* what) {
    fprintf(stderr, "quarry-cuda-emu: %s: %s (thread %u of block (%u, %u, %u))\n",
            L ? L->name : "?", what, threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
    abort();
}

void check_shared(const void* p, size_t n) {
    const unsigned char* s = shared_start(*L);
    const unsigned char* at = static_cast<const unsigned char*>(p);
    if (at < s || at + n > s + L->shared_bytes)
        fail("a 16-byte shared memory access outside the launch's dynamic shared memory");
}

// The lines PREFETCH_L2 asked for on this OS thread since the last take.
thread_local std::vector<uintptr_t> PREFETCHED;

void prefetch_l2(const void* p) {
    PREFETCHED.push_back(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127));
}

}  // namespace quarry_emu

// The lines the calling OS thread's launches prefetched (PREFETCH_L2) since the last take, in
// the order asked: their count, and, where `out` is not null, the lines copied into it (`cap` at
// most) and forgotten.
extern "C" size_t quarry_emu_take_prefetches(uintptr_t* out, size_t cap) {
    using quarry_emu::PREFETCHED;
    const size_t n = PREFETCHED.size();
    if (out == nullptr) return n;
    const size_t m = n < cap ? n : cap;
    memcpy(out, PREFETCHED.data(), m * sizeof(uintptr_t));
    PREFETCHED.clear();
    return m;
}

// Runs `body(data)` as every thread of a grid of `grid` blocks of `threads` threads (one
// dimension) with `shared_bytes` of dynamic shared memory. Returns 0, or 1 with a message in
// `error` (at most `error_len` bytes, NUL-terminated).
extern "C" int quarry_emu_launch(const char* name, const uint32_t grid[3], uint32_t threads,
                                 size_t shared_bytes, void (*body)(void*), void* data,
                                 char* error, size_t error_len) {
    using namespace quarry_emu;
    Launch l;
    l.name = name;
    l.body = body;
    l.data = data;
    l.fibers.resize(threads);
    l.warps.resize((threads + 31) / 32);
    l.shared.resize(shared_bytes + 16 + CANARY);
    l.shared_bytes = shared_bytes;
    for (auto& f : l.fibers) {
        void* m = mmap(nullptr, GUARD + STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            l.error = "cannot map a fiber's stack";
            break;
        }
        mprotect(m, GUARD, PROT_NONE);  // a stack overflow faults instead of writing elsewhere
        f.base = static_cast<char*>(m);
    }
    Launch* outer = L;
    L = &l;
    const dim3 saved_block = blockIdx, saved_dim = blockDim, saved_grid = gridDim;
    blockDim = dim3{threads, 1, 1};
    gridDim = dim3{grid[0], grid[1], grid[2]};
    if (l.error.empty() && threads > 0) {
        for (uint32_t z = 0; z < grid[2] && l.error.empty(); ++z)
            for (uint32_t y = 0; y < grid[1] && l.error.empty(); ++y)
                for (uint32_t x = 0; x < grid[0] && l.error.empty(); ++x) {
                    blockIdx = dim3{x, y, z};
                    if (!run_block(l)) break;
                }
    }
    L = outer;
    blockIdx = saved_block;
    blockDim = saved_dim;
    gridDim = saved_grid;
    for (auto& f : l.fibers)
        if (f.base) munmap(f.base, GUARD + STACK);
    if (l.error.empty()) return 0;
    if (error_len > 0) {
        const size_t n = l.error.size() < error_len - 1 ? l.error.size() : error_len - 1;
        memcpy(error, l.error.data(), n);
        error[n] = 0;
    }
    return 1;
}
