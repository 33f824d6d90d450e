// cuda_cpu.h: run CUDA C++ kernel source, unchanged, on the CPU, for tests (device side).
//
// A launcher translation unit (written by tests/cudacpu/__init__.py) includes this header, defines the storage of
// each `extern __shared__ T name[];` of the source, includes the .cu file, then the host side and the kernels to
// register (the same name expressions CuPy's RawModule gets):
//     #include "cuda_cpu.h"
//     CUDACPU_DYNAMIC_SHARED(double, sums, alignas(256))
//     #include "tiled.cu"
//     #include "cuda_cpu_host.h"
//     CUDACPU_KERNEL("tile_cluster_sums<float, true>", tile_cluster_sums<float, true>)
// built with g++ -std=c++14 -shared -fPIC -fno-extern-tls-init -fvisibility=hidden -fno-gnu-unique
// [-fsanitize=address,undefined | -fsanitize=thread].
//
// Model: the blocks of a launch run one after another; the threads of a block are user-level fibers (ucontext),
// switched only at __syncthreads and at warp intrinsics, in a forward, reverse or seeded random order. Shared
// memory (`__shared__`, `extern __shared__`) is thread_local storage of the OS thread that runs the block, filled
// with 0xff bytes (NaN, -1) before every block. This header holds what kernel code sees: keywords, indices,
// barriers, warp intrinsics, atomics, intrinsics; cuda_cpu_host.h the scheduler, the launch and the C API. The
// split keeps <dlfcn.h>, <link.h>, <pthread.h> and friends out of the kernel source's global namespace.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
// C++ headers the host side (cuda_cpu_host.h) needs, included before the keyword macros below: libstdc++ writes
// __attribute__((__noinline__)), which `#define __noinline__` would break (the clash CUDA 11 had with GCC 12)
#include <algorithm>
#include <cxxabi.h>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDACPU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define CUDACPU_TSAN 1
#endif

// The runtime's own bookkeeping is not the kernel's memory traffic: ThreadSanitizer must not see it (the fibers of
// a block would race on the scheduler's state), and it never inlines into kernel code.
#define CUDACPU_RUNTIME __attribute__((noinline, no_sanitize_thread))

// ---- what NVRTC defines: the module is compiled as CuPy compiles it (an sm_90 device, the stand-in's) ----------
#ifndef __CUDACC__
#define __CUDACC__ 1
#endif
#ifndef __CUDACC_RTC__
#define __CUDACC_RTC__ 1
#endif
#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 900
#endif

// ---- CUDA keywords ---------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __constant__
#define __managed__
#define __align__(n) alignas(n)
// `__shared__ T x[N];` in a kernel -> a static of the OS thread running the block, shared by the block's fibers;
// `extern __shared__ T x[];` -> the buffer that CUDACPU_DYNAMIC_SHARED defines before the source is included
#define __shared__ thread_local

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};

namespace cudacpu {

enum State : unsigned char { RUNNABLE, WAIT_BLOCK, WAIT_WARP, DONE };

struct Fiber {
    ucontext_t ctx;   // the context when switched with ucontext
    void* sp;         // the saved stack pointer when switched with switch_stack (x86-64)
    uint3 tid;
    unsigned warp, lane;
    State state;
    bool started;     // has a context (a stack) of its own: not yet started threads get one as they start
    unsigned wmask;   // at a warp intrinsic: the mask it named
    unsigned winst;   // at a warp intrinsic: which rendezvous of its warp (an id; ThreadSanitizer sync object)
    char* stack;
    size_t stack_size;
    void* asan_fake;
    void* tsan;
};

constexpr unsigned kWarpSyncRing = 128;  // ThreadSanitizer sync objects per warp, one per rendezvous (a ring)
constexpr size_t kSharedMax = 227 * 1024;  // bytes of dynamic shared memory a launch may use (opt-in limit)
constexpr size_t kSharedBuffer = 228 * 1024;  // storage per extern __shared__ name: the opt-in maximum, rounded

struct TsanFiber { void* context; char* stack; };
struct Range { char* lo; char* hi; };

struct Runtime {  // one launch; plain arrays and fields only, so the scheduler calls no instrumented helpers
    dim3 grid, block;
    uint3 bidx;
    size_t shmem;
    unsigned n, warps;         // threads per block, warps per block
    Fiber* fib;                // n
    unsigned* order;           // n: the order in which runnable fibers are resumed in a round
    uint64_t* slots;           // n: values exchanged by warp intrinsics and __syncthreads_count
    unsigned* warp_inst;       // warps: rendezvous counter of each warp
    Fiber* cur;                // the running thread (nullptr in the scheduler)
    unsigned pos;              // the scheduler's position in order[] this round
    char** stacks;             // the launch's stacks, n_stacks of them (not under ThreadSanitizer)
    char** free_stacks;        // those no started, unfinished thread runs on
    unsigned n_stacks, n_free;
    Range tls;                 // this OS thread's block of the module's TLS (all __shared__ storage)
    ucontext_t sched;
    void* sched_sp;
    bool fast;                 // switch with switch_stack, not ucontext
    int (*swap)(ucontext_t*, const ucontext_t*);  // swapcontext (libc's own under AddressSanitizer)
    const void* sched_bottom;  // AddressSanitizer: the scheduler's stack
    size_t sched_size;
    void (*body)(void*);       // what every thread runs: the kernel with the launch's arguments
    void* body_ctx;
    unsigned live, arrived, bar_gen;  // threads not exited; waiting at the block barrier; barrier generation
    const void* barrier_site;  // return address of the __syncthreads the waiting threads called
    char error[640];           // the first device-side error, "" if none
    int schedule;              // 0 forward, 1 reverse, 2 random (reshuffled every round)
    uint64_t rng;
    bool strict;               // a thread that exits while others wait at __syncthreads is an error
    const void* module_base;   // for code addresses in messages (module offsets, symbolised by the caller)
    // ThreadSanitizer: sync objects of the current block: [0] start, [1] end, [2 + gen % 2] block barrier,
    // [4 + warp * kWarpSyncRing + rendezvous % kWarpSyncRing] warp intrinsics
    char* sync;
    void* tsan_sched;          // the scheduler's tsan context (the OS thread of the block)
    struct TsanFiber* tsan_fibers;  // ThreadSanitizer: a context and a stack per thread of the grid
    char launch_end;           // ThreadSanitizer: every block's end happens before the host reads the results
};
inline Runtime*& rt_ptr() { static thread_local Runtime* r = nullptr; return r; }

#ifdef CUDACPU_TSAN  // the scheduler writes these between switches: read them outside instrumentation
#define CUDACPU_ACCESSOR CUDACPU_RUNTIME inline
#else
#define CUDACPU_ACCESSOR inline
#endif
CUDACPU_ACCESSOR uint3 tid() { return rt_ptr()->cur->tid; }
CUDACPU_ACCESSOR uint3 bid() { return rt_ptr()->bidx; }
CUDACPU_ACCESSOR dim3 bdim() { return rt_ptr()->block; }
CUDACPU_ACCESSOR dim3 gdim() { return rt_ptr()->grid; }

// A code address as "@0x<offset in the module>@": the Python side turns it into file:line (addr2line).
CUDACPU_RUNTIME inline void site_text(char* out, size_t len, const void* site) {
    Runtime* r = rt_ptr();
    snprintf(out, len, "@0x%lx@", (unsigned long)((const char*)site - (const char*)r->module_base - 1));
}

// Records the first device-side error of the launch, naming the block and (when a fiber runs) the thread. The
// scheduler stops at the end of the current switch; the fibers of the block are abandoned where they are.
CUDACPU_RUNTIME inline void fail(const char* what) {
    Runtime* r = rt_ptr();
    if (r->error[0]) return;
    if (r->cur)
        snprintf(r->error, sizeof r->error, "block (%u,%u,%u) thread (%u,%u,%u): %s", r->bidx.x, r->bidx.y,
                 r->bidx.z, r->cur->tid.x, r->cur->tid.y, r->cur->tid.z, what);
    else
        snprintf(r->error, sizeof r->error, "block (%u,%u,%u): %s", r->bidx.x, r->bidx.y, r->bidx.z, what);
}

#if defined(__x86_64__)
// A context switch without a system call (glibc's swapcontext saves and restores the signal mask, one syscall per
// switch, which dominated barrier-heavy kernels): pushes the callee-saved registers, MXCSR and the x87 control
// word, saves the stack pointer in *save, loads `load`, pops the same from there and returns into that context.
// A fresh context is a stack prepared by start_fiber. Not usable under a CET shadow stack (the `ret` would land
// on another stack): fast_switch_usable() checks, and ucontext is used then and on other architectures.
extern "C" __attribute__((visibility("hidden"))) void cudacpu_switch_stack(void** save, void* load);
__asm__(".text\n"
        ".p2align 4\n"
        ".hidden cudacpu_switch_stack\n"
        ".type cudacpu_switch_stack,@function\n"
        "cudacpu_switch_stack:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size cudacpu_switch_stack, .-cudacpu_switch_stack\n");
#define CUDACPU_SWITCH_STACK 1
#endif

// fiber -> scheduler
CUDACPU_RUNTIME inline void yield(bool finished = false) {
    Runtime* r = rt_ptr();
    Fiber* f = r->cur;
#ifdef CUDACPU_ASAN
    __sanitizer_start_switch_fiber(finished ? nullptr : &f->asan_fake, r->sched_bottom, r->sched_size);
#endif
#ifdef CUDACPU_TSAN
    __tsan_switch_to_fiber(r->tsan_sched, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef CUDACPU_SWITCH_STACK
    if (r->fast)
        cudacpu_switch_stack(&f->sp, r->sched_sp);
    else
#endif
        r->swap(&f->ctx, &r->sched);
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, &r->sched_bottom, &r->sched_size);
#endif
    (void)finished;
}

// A fiber that must never run again (an error was recorded): hand back to the scheduler for good.
[[noreturn]] CUDACPU_RUNTIME inline void stop() {
    rt_ptr()->cur->state = DONE;
    yield(true);
    abort();  // unreachable: the scheduler resumes no finished fiber
}

CUDACPU_RUNTIME inline void release_block_barrier(Runtime* r) {
    for (unsigned i = 0; i < r->n; ++i)
        if (r->fib[i].state == WAIT_BLOCK) r->fib[i].state = RUNNABLE;
    r->arrived = 0;
    ++r->bar_gen;
}

CUDACPU_RUNTIME inline unsigned alive_lanes(Runtime* r, unsigned w) {  // lanes of warp w that exist, not exited
    unsigned bits = 0;
    for (unsigned l = 0; l < 32 && 32 * w + l < r->n; ++l)
        if (r->fib[32 * w + l].state != DONE) bits |= 1u << l;
    return bits;
}

// Releases the lanes waiting with `mask` when every existing, non-exited lane of the mask waits with it.
CUDACPU_RUNTIME inline void try_release_warp(Runtime* r, unsigned w, unsigned mask) {
    const unsigned need = mask & alive_lanes(r, w);
    if (!need) return;
    for (unsigned l = 0; l < 32; ++l)
        if (need >> l & 1u) {
            const Fiber& g = r->fib[32 * w + l];
            if (g.state != WAIT_WARP || g.wmask != mask) return;
        }
    for (unsigned l = 0; l < 32; ++l)
        if (need >> l & 1u) r->fib[32 * w + l].state = RUNNABLE;
}
// after a lane exits: it no longer holds back the rendezvous of its warp that named it
CUDACPU_RUNTIME inline void retry_warp(Runtime* r, unsigned w) {
    for (unsigned l = 0; l < 32 && 32 * w + l < r->n; ++l) {
        const Fiber& g = r->fib[32 * w + l];
        if (g.state == WAIT_WARP) try_release_warp(r, w, g.wmask);
    }
}

// Every thread of the block arrives, then all go on. `site` names the __syncthreads (its return address): threads
// at different ones are an error, as is a barrier that a thread of the block will never reach (it exited).
CUDACPU_RUNTIME inline void block_barrier(const void* site) {
    Runtime* r = rt_ptr();
    char a[40], b[40], msg[200];
    if (r->arrived == 0) {
        r->barrier_site = site;
    } else if (site != r->barrier_site) {
        site_text(a, sizeof a, site), site_text(b, sizeof b, r->barrier_site);
        snprintf(msg, sizeof msg, "reached __syncthreads at %s while %u threads of its block wait at the one at %s "
                 "(divergent barrier)", a, r->arrived, b);
        fail(msg);
    }
    if (r->strict && r->live < r->n) {
        site_text(a, sizeof a, site);
        snprintf(msg, sizeof msg, "reached __syncthreads at %s after %u threads of its block returned (divergent "
                 "barrier: the block's threads must all reach it)", a, r->n - r->live);
        fail(msg);
    }
    const unsigned gen = r->bar_gen;
    r->cur->state = WAIT_BLOCK;
    if (++r->arrived == r->live) release_block_barrier(r);
#ifdef CUDACPU_TSAN
    // One sync object per barrier generation (two alternate: a thread can be a generation ahead of one still to
    // resume, never two): a single cumulative one would let a thread that resumes late acquire what the early
    // ones wrote after the barrier, and hide exactly the races of a missing barrier.
    __tsan_release(r->sync + 2 + (gen & 1));
#endif
    yield();
#ifdef CUDACPU_TSAN
    __tsan_acquire(r->sync + 2 + (gen & 1));
#endif
    (void)gen;
}

// Every existing, non-exited lane of `mask` in this warp arrives, then they go on; returns the warp's slots.
CUDACPU_RUNTIME inline uint64_t* warp_barrier(unsigned mask) {
    Runtime* r = rt_ptr();
    Fiber* f = r->cur;
    const unsigned w = f->warp;
    char msg[160];
    if (!(mask >> f->lane & 1u)) {
        snprintf(msg, sizeof msg, "warp intrinsic called with mask 0x%08x, which excludes the calling lane %u", mask,
                 f->lane);
        fail(msg);
    }
    unsigned inst = 0;
    bool joined = false;
    for (unsigned l = 0; l < 32 && 32 * w + l < r->n; ++l) {  // a rendezvous of this warp already under way
        const Fiber& g = r->fib[32 * w + l];
        if (g.state != WAIT_WARP) continue;
        if (((mask >> l) & 1u) || ((g.wmask >> f->lane) & 1u)) {
            if (g.wmask != mask) {
                snprintf(msg, sizeof msg, "lanes of warp %u wait at warp intrinsics with overlapping masks 0x%08x "
                         "(lane %u) and 0x%08x (this lane)", w, g.wmask, l, mask);
                fail(msg);
            }
            inst = g.winst, joined = true;
        }
    }
    if (!joined) inst = ++r->warp_inst[w];
    f->wmask = mask, f->winst = inst, f->state = WAIT_WARP;
    try_release_warp(r, w, mask);
#ifdef CUDACPU_TSAN
    char* s = r->sync + 4 + w * kWarpSyncRing + inst % kWarpSyncRing;
    __tsan_release(s);
#endif
    yield();
#ifdef CUDACPU_TSAN
    __tsan_acquire(s);
#endif
    return r->slots + 32 * w;
}

template <class T> CUDACPU_RUNTIME T shuffle(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffle of a type wider than 8 bytes");
    Runtime* r = rt_ptr();
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    r->slots[32 * r->cur->warp + r->cur->lane] = bits;
    uint64_t* slots = warp_barrier(mask);
    if (src < 0 || src > 31 || !(((mask & alive_lanes(r, r->cur->warp)) >> src) & 1u)) {
        char msg[160];
        snprintf(msg, sizeof msg, "warp shuffle with mask 0x%08x reads lane %d, outside the mask, absent or exited "
                 "(undefined on the device)", mask, src);
        fail(msg);
    }
    bits = slots[src & 31];
    warp_barrier(mask);  // no lane overwrites its slot before every lane has read
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}
// the predicates of the participating lanes as a bit mask; *members: the participating lanes
CUDACPU_RUNTIME inline unsigned vote(unsigned mask, bool p, unsigned* members) {
    Runtime* r = rt_ptr();
    r->slots[32 * r->cur->warp + r->cur->lane] = p;
    uint64_t* slots = warp_barrier(mask);
    *members = mask & alive_lanes(r, r->cur->warp);
    unsigned out = 0;
    for (int l = 0; l < 32; ++l)
        if ((*members >> l & 1u) && slots[l]) out |= 1u << l;
    warp_barrier(mask);
    return out;
}
// __syncthreads_count / _and / _or: how many threads of the block passed a non-zero predicate
CUDACPU_RUNTIME inline int block_count(int p, const void* site, int* total) {
    Runtime* r = rt_ptr();
    r->slots[r->cur - r->fib] = p != 0;
    block_barrier(site);
    int count = 0;
    *total = 0;
    for (unsigned i = 0; i < r->n; ++i)
        if (r->fib[i].state != DONE) count += (int)r->slots[i], ++*total;
    block_barrier((const char*)site + 1);  // no thread overwrites its slot before every thread has counted
    return count;
}
CUDACPU_RUNTIME inline int lane_id() { return (int)rt_ptr()->cur->lane; }

[[noreturn]] CUDACPU_RUNTIME inline void assert_fail(const char* expr, const char* file, int line) {
    char msg[300];
    snprintf(msg, sizeof msg, "device-side assert(%s) failed at %s:%d", expr, file, line);
    fail(msg);
    stop();
}

}  // namespace cudacpu

#define threadIdx (::cudacpu::tid())
#define blockIdx (::cudacpu::bid())
#define blockDim (::cudacpu::bdim())
#define gridDim (::cudacpu::gdim())
#define warpSize 32

// device-side assert (NVRTC has it without an include): a CudaCpuError naming block, thread, file and line
#include <assert.h>
#undef assert
#define assert(e) ((e) ? (void)0 : ::cudacpu::assert_fail(#e, __FILE__, __LINE__))

// ---- barriers and warp intrinsics ------------------------------------------------------------------------------
// noinline (CUDACPU_RUNTIME): the return address identifies the call site, i.e. which barrier of the kernel
CUDACPU_RUNTIME inline void __syncthreads() { cudacpu::block_barrier(__builtin_return_address(0)); }
CUDACPU_RUNTIME inline int __syncthreads_count(int p) {
    int total;
    return cudacpu::block_count(p, __builtin_return_address(0), &total);
}
CUDACPU_RUNTIME inline int __syncthreads_and(int p) {
    int total;
    return cudacpu::block_count(p, __builtin_return_address(0), &total) == total;
}
CUDACPU_RUNTIME inline int __syncthreads_or(int p) {
    int total;
    return cudacpu::block_count(p, __builtin_return_address(0), &total) != 0;
}

inline void __syncwarp(unsigned mask = 0xffffffffu) { cudacpu::warp_barrier(mask); }
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    int lane = cudacpu::lane_id();
    return cudacpu::shuffle(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = cudacpu::lane_id();
    return cudacpu::shuffle(mask, v, (lane & (width - 1)) < (int)d ? lane : lane - (int)d);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = cudacpu::lane_id();
    return cudacpu::shuffle(mask, v, (lane & (width - 1)) + (int)d >= width ? lane : lane + (int)d);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    int lane = cudacpu::lane_id(), src = lane ^ m;
    // a lane of a later group of `width` lanes is out of reach: the caller keeps its own value
    return cudacpu::shuffle(mask, v, src >= (lane & ~(width - 1)) + width ? lane : src);
}
inline unsigned __ballot_sync(unsigned mask, int p) { unsigned m; return cudacpu::vote(mask, p != 0, &m); }
inline int __any_sync(unsigned mask, int p) { unsigned m; return cudacpu::vote(mask, p != 0, &m) != 0; }
inline int __all_sync(unsigned mask, int p) { unsigned m; unsigned v = cudacpu::vote(mask, p != 0, &m); return v == m; }
// the lanes of the warp that have not exited (lanes run in lockstep only at the intrinsics, so this is an
// upper bound of what the device reports)
CUDACPU_RUNTIME inline unsigned __activemask() {
    cudacpu::Runtime* r = cudacpu::rt_ptr();
    return cudacpu::alive_lanes(r, r->cur->warp);
}

// ---- atomics: relaxed, as on the device; real atomics, so that ThreadSanitizer sees them as such ---------------
namespace cudacpu {
template <class T, class Op> inline T atomic_rmw(T* p, T v, Op op) {
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        want = op(old, v);
    } while (!__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
}  // namespace cudacpu
#define CUDACPU_ATOMIC_INT(T)                                                                                       \
    inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }                           \
    inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }                           \
    inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }                         \
    inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }                           \
    inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }                             \
    inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }                           \
    inline T atomicMin(T* p, T v) { return cudacpu::atomic_rmw(p, v, [](T a, T b) { return b < a ? b : a; }); }   \
    inline T atomicMax(T* p, T v) { return cudacpu::atomic_rmw(p, v, [](T a, T b) { return a < b ? b : a; }); }   \
    inline T atomicCAS(T* p, T cmp, T v) {                                                                         \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);                       \
        return cmp;                                                                                                \
    }
CUDACPU_ATOMIC_INT(int)
CUDACPU_ATOMIC_INT(unsigned int)
CUDACPU_ATOMIC_INT(unsigned long long)
CUDACPU_ATOMIC_INT(long long)
#undef CUDACPU_ATOMIC_INT
inline float atomicAdd(float* p, float v) { return cudacpu::atomic_rmw(p, v, [](float a, float b) { return a + b; }); }
inline double atomicAdd(double* p, double v) {
    return cudacpu::atomic_rmw(p, v, [](double a, double b) { return a + b; });
}
inline float atomicSub(float* p, float v) { return atomicAdd(p, -v); }
inline double atomicSub(double* p, double v) { return atomicAdd(p, -v); }
inline float atomicExch(float* p, float v) { float o; __atomic_exchange(p, &v, &o, __ATOMIC_RELAXED); return o; }
inline unsigned atomicInc(unsigned* p, unsigned lim) {
    return cudacpu::atomic_rmw(p, lim, [](unsigned a, unsigned l) { return a >= l ? 0u : a + 1; });
}
inline unsigned atomicDec(unsigned* p, unsigned lim) {
    return cudacpu::atomic_rmw(p, lim, [](unsigned a, unsigned l) { return (a == 0 || a > l) ? l : a - 1; });
}
inline unsigned short atomicCAS(unsigned short* p, unsigned short cmp, unsigned short v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
// the _block and _system scopes are the same operation here: every block runs in one address space
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- intrinsics and device math that <math.h> lacks ---------------------------------------------------------
namespace cudacpu {
template <class To, class From> inline To bits(From f) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between types of different widths");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}
}  // namespace cudacpu
inline double __longlong_as_double(long long x) { return cudacpu::bits<double>(x); }
inline long long __double_as_longlong(double x) { return cudacpu::bits<long long>(x); }
inline float __int_as_float(int x) { return cudacpu::bits<float>(x); }
inline int __float_as_int(float x) { return cudacpu::bits<int>(x); }
inline float __uint_as_float(unsigned x) { return cudacpu::bits<float>(x); }
inline unsigned __float_as_uint(float x) { return cudacpu::bits<unsigned>(x); }
inline int __double2hiint(double x) { return (int)(cudacpu::bits<unsigned long long>(x) >> 32); }
inline int __double2loint(double x) { return (int)(cudacpu::bits<unsigned long long>(x) & 0xffffffffu); }
inline double __hiloint2double(int hi, int lo) {
    return cudacpu::bits<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __mul24(int a, int b) { return (int)((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <class T> inline T __ldg(const T* p) { return *p; }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rcbrt(double x) { return 1.0 / cbrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline double exp10(double x) { return pow(10.0, x); }
inline float exp10f(float x) { return powf(10.0f, x); }
inline void sincos(double x, double* s, double* c) { *s = sin(x), *c = cos(x); }
inline void sincosf(float x, float* s, float* c) { *s = sinf(x), *c = cosf(x); }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x > 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }  // NaN -> 0
// the CPU rounds to nearest even by default: the _rn intrinsics are the plain operations
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline double __dsqrt_rn(double x) { return sqrt(x); }
inline double __drcp_rn(double x) { return 1.0 / x; }
// float16 bits -> float: a source that widens them with the hardware conversion (inline PTX cvt.f32.f16, which g++
// cannot take) uses CUDACPU_HALF_TO_FLOAT where it is defined; the compiler's _Float16 converts exactly, as the
// instruction does
#ifndef __FLT16_MAX__
#error "cudacpu needs a C++ compiler with _Float16 (GCC 12 or Clang 15 on x86-64 or AArch64)"
#endif
namespace cudacpu {
inline float half_to_float(unsigned short h) {
    _Float16 x;
    memcpy(&x, &h, sizeof x);
    return (float)x;
}
}  // namespace cudacpu
#define CUDACPU_HALF_TO_FLOAT(h) ::cudacpu::half_to_float(h)
template <class A, class B> inline typename std::common_type<A, B>::type min(A a, B b) { return b < a ? b : a; }
template <class A, class B> inline typename std::common_type<A, B>::type max(A a, B b) { return a < b ? b : a; }
inline long long clock64() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
inline void __nanosleep(unsigned) {}
[[noreturn]] CUDACPU_RUNTIME inline void __trap() {
    cudacpu::fail("__trap() called");
    cudacpu::stop();
}

// ---- extern __shared__ storage -----------------------------------------------------------------------------------
namespace cudacpu {
struct SharedBuffer {
    void* (*addr)();  // this OS thread's copy (thread_local: its address differs from thread to thread)
    size_t bytes;
};
struct SharedBuffers {
    SharedBuffer items[16];
    int n;
};
inline SharedBuffers& shared_buffers() { static SharedBuffers s; return s; }
inline int register_shared(void* (*addr)(), size_t bytes) {
    SharedBuffers& s = shared_buffers();
    if (s.n == 16) abort();  // more than 16 distinct extern __shared__ names in one source
    s.items[s.n++] = {addr, bytes};
    return 0;
}
}  // namespace cudacpu

#define CUDACPU_CAT2(a, b) a##b
#define CUDACPU_CAT(a, b) CUDACPU_CAT2(a, b)
// The storage of `extern __shared__ T name[];` (defined before the source is included: the source's declaration
// then refers to it). `align` is `alignas(n)`: the declaration's __align__(n) when it has one (C++ wants the
// definition to say the same), else 256 bytes, at least what the device guarantees.
#define CUDACPU_DYNAMIC_SHARED(T, name, align) CUDACPU_DYNAMIC_SHARED_I(T, name, align, __COUNTER__)
#define CUDACPU_DYNAMIC_SHARED_I(T, name, align, id) CUDACPU_DYNAMIC_SHARED_II(T, name, align, id)
#define CUDACPU_DYNAMIC_SHARED_II(T, name, align, id)                                                      \
    align thread_local T name[::cudacpu::kSharedBuffer / sizeof(T)];                                        \
    static void* cudacpu_shared_addr_##id() { return (void*)name; }                                         \
    static int cudacpu_shared_reg_##id = ::cudacpu::register_shared(&cudacpu_shared_addr_##id, sizeof(name));
