// cuda_cpu_host.h: the host side of cuda_cpu.h (scheduler, launch, kernel registry, C API for ctypes).
// Included by the launcher after the CUDA source; see cuda_cpu.h for the model.
#pragma once
#include "cuda_cpu.h"

#include <dlfcn.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace cudacpu {

#if defined(CUDACPU_ASAN) || defined(CUDACPU_TSAN)
constexpr size_t kStack = 512 * 1024;  // instrumented frames are larger
#else
constexpr size_t kStack = 256 * 1024;
#endif
constexpr size_t kGuard = 4096;
constexpr unsigned long long kTsanMaxThreads = 7936;  // GCC 12's ThreadSanitizer: 8128 live threads, less a margin

// ---- the module's thread-local storage: where every __shared__ variable of the source lives -------------------
CUDACPU_RUNTIME inline void tls_anchor() {}

struct PhdrQuery { uintptr_t base; size_t tls_size; };
CUDACPU_RUNTIME inline int find_tls_segment(struct dl_phdr_info* info, size_t, void* data) {
    PhdrQuery* q = (PhdrQuery*)data;
    if (info->dlpi_addr != q->base) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i)
        if (info->dlpi_phdr[i].p_type == PT_TLS) q->tls_size = info->dlpi_phdr[i].p_memsz;
    return 1;
}

// This OS thread's block of the module's TLS segment: the static `__shared__` arrays of the source, the
// CUDACPU_DYNAMIC_SHARED buffers and rt_ptr. Static __shared__ arrays have no other handle: filling this block
// is how they start every block with garbage, as on the device.
CUDACPU_RUNTIME inline Range module_tls(const void** module_base) {
    Dl_info info;
    Range out = {nullptr, nullptr};
    if (!dladdr((void*)&tls_anchor, &info)) return out;
    *module_base = info.dli_fbase;
    PhdrQuery q = {(uintptr_t)info.dli_fbase, 0};
    dl_iterate_phdr(find_tls_segment, &q);
    void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    void* block = nullptr;
    if (handle) {
        (void)rt_ptr();  // the block is allocated at the thread's first access to the module's TLS
        if (dlinfo(handle, RTLD_DI_TLS_DATA, &block) != 0) block = nullptr;
        dlclose(handle);
    }
    if (block && q.tls_size) out = {(char*)block, (char*)block + q.tls_size};
    return out;
}

// Fills [r.lo, r.hi) with 0xff bytes (NaN, -1) except the ranges in `skip`.
CUDACPU_RUNTIME inline void fill_except(Range r, std::vector<Range>& skip) {
    std::sort(skip.begin(), skip.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
    char* at = r.lo;
    for (const Range& s : skip) {
        char* lo = std::max(s.lo, r.lo), *hi = std::min(s.hi, r.hi);
        if (lo >= hi) continue;
        if (at < lo) memset(at, 0xff, lo - at);
        at = std::max(at, hi);
    }
    if (at < r.hi) memset(at, 0xff, r.hi - at);
}

// Before every block: shared memory starts as garbage (0xff), except the bytes of the extern __shared__ buffers
// past the launch's dynamic size (poisoned under AddressSanitizer: untouched) and the runtime's own pointer.
CUDACPU_RUNTIME inline void fresh_shared_memory(Runtime* r, Range tls) {
    std::vector<Range> skip;
    skip.push_back({(char*)&rt_ptr(), (char*)&rt_ptr() + sizeof(Runtime*)});
    SharedBuffers& sb = shared_buffers();
    for (int s = 0; s < sb.n; ++s) {
        char* base = (char*)sb.items[s].addr();
        skip.push_back({base + r->shmem, base + sb.items[s].bytes});
        if (!tls.lo) memset(base, 0xff, r->shmem);  // no TLS segment found: at least the dynamic part
    }
    if (tls.lo) fill_except(tls, skip);
}

// AddressSanitizer's swapcontext interceptor clears the shadow of the whole target stack at every switch: 64 KiB of
// shadow per switch, and it wipes the redzones of the frames live on that stack. The fiber-switch annotations
// (__sanitizer_start/finish_switch_fiber) are what AddressSanitizer needs: call libc's own swapcontext. A fiber's
// frames unpoison themselves as they return; only an abandoned fiber (an error, which ends the launch) leaves
// poison behind, cleared before its stack is unmapped.
CUDACPU_RUNTIME inline int (*context_switch())(ucontext_t*, const ucontext_t*) {
#ifdef CUDACPU_ASAN
    static int (*real)(ucontext_t*, const ucontext_t*) = nullptr;
    if (!real) {
        void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
        if (libc) real = (int (*)(ucontext_t*, const ucontext_t*))dlsym(libc, "swapcontext");
        if (!real) real = &swapcontext;
    }
    return real;
#else
    return &swapcontext;
#endif
}

// Whether cudacpu_switch_stack may be used: x86-64 without a CET shadow stack in this process.
CUDACPU_RUNTIME inline bool fast_switch_usable() {
#ifdef CUDACPU_SWITCH_STACK
    static int usable = -1;
    if (usable < 0) {
        unsigned long features = 0;
        // ARCH_SHSTK_STATUS (0x5005, Linux 6.6+; older kernels have no user shadow stacks and say EINVAL)
        usable = !(syscall(SYS_arch_prctl, 0x5005, &features) == 0 && (features & 1));
    }
    return usable != 0;
#else
    return false;
#endif
}

// ---- scheduler ---------------------------------------------------------------------------------------------------
// (out of fiber_main: its frame must hold no arrays, whose AddressSanitizer redzones would stay poisoned on a stack
// that the next thread reuses, fiber_main never returning)
CUDACPU_RUNTIME inline void returned_while_others_wait(Runtime* r) {
    char a[40], msg[200];
    site_text(a, sizeof a, r->barrier_site);
    snprintf(msg, sizeof msg, "returned while %u threads of its block wait at __syncthreads at %s (divergent "
             "barrier: the block's threads must all reach it)", r->arrived, a);
    fail(msg);
}

// A fiber runs threads' bodies. When one returns, the fiber goes straight on with the next thread of the round if
// that one has not started yet (the scheduler would switch to it next anyway), on the same stack: a block whose
// threads never reach a barrier costs one context switch, not one per thread (each switch is a system call,
// sigprocmask). Not under ThreadSanitizer, where every thread has a context and a stack of its own.
CUDACPU_RUNTIME inline void fiber_main() {
    Runtime* r = rt_ptr();
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &r->sched_bottom, &r->sched_size);
#endif
    for (;;) {
        Fiber* f = r->cur;
#ifdef CUDACPU_TSAN
        __tsan_acquire(r->sync + 0);  // what the host wrote before the launch, and the block's fresh shared memory
#endif
        r->body(r->body_ctx);
#ifdef CUDACPU_TSAN
        __tsan_release(r->sync + 1);
#endif
        f->state = DONE;
        --r->live;
        if (r->arrived > 0) {
            if (r->strict) returned_while_others_wait(r);
            else if (r->arrived == r->live) release_block_barrier(r);
        }
        retry_warp(r, f->warp);  // an exited lane no longer holds back a warp intrinsic
#ifndef CUDACPU_TSAN
        Fiber* next = nullptr;
        for (unsigned p = r->pos + 1; p < r->n && !r->error[0]; ++p) {
            Fiber* g = &r->fib[r->order[p]];
            if (g->state != RUNNABLE) continue;
            if (!g->started) next = g, r->pos = p;
            break;
        }
        if (next) {
            next->started = true, next->stack = f->stack, next->stack_size = f->stack_size;
            r->cur = next;
            continue;
        }
#endif
        yield(true);
    }
}

// A stack with a guard page below it (a stack overflow faults instead of running into the next stack).
CUDACPU_RUNTIME inline char* map_stack() {
    char* m = (char*)mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, kGuard, PROT_NONE);
    return m + kGuard;
}

// Uninstrumented: AddressSanitizer would call __asan_handle_no_return here, before fiber_main has finished the
// switch to this stack, i.e. with the scheduler's stack bounds.
[[noreturn]] CUDACPU_RUNTIME __attribute__((no_sanitize_address)) inline void fiber_entry() {
    fiber_main();
    abort();  // unreachable: fiber_main never returns
}

CUDACPU_RUNTIME inline bool start_fiber(Runtime* r, Fiber* f) {
#ifndef CUDACPU_TSAN  // (under ThreadSanitizer: the thread's own, see run_block)
    if (r->n_free == 0) {  // stacks are mapped as threads need them: one for a block that never waits
        char* st = map_stack();
        if (!st) {
            fail("out of memory for the thread's stack");
            return false;
        }
        r->stacks[r->n_stacks++] = st;
        r->free_stacks[r->n_free++] = st;
    }
    f->stack = r->free_stacks[--r->n_free];
    f->stack_size = kStack;
#endif
#ifdef CUDACPU_SWITCH_STACK
    if (r->fast) {
        // what cudacpu_switch_stack pops, from the saved stack pointer up: MXCSR and the x87 control word, r15,
        // r14, r13, r12, rbx, rbp, the return address (fiber_entry). 72 bytes below the 16-aligned top, so that
        // fiber_entry starts as after a call (rsp % 16 == 8).
        uint64_t* sp = (uint64_t*)(f->stack + f->stack_size - 72);
        uint32_t mxcsr = 0x1f80;
        uint16_t fpucw = 0x037f;
        __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));  // the scheduler's floating-point settings
        __asm__ volatile("fnstcw %0" : "=m"(fpucw));
        sp[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
        for (int i = 1; i <= 6; ++i) sp[i] = 0;  // rbp = 0 ends the frame-pointer chain for unwinders
        sp[7] = (uint64_t)(void*)&fiber_entry;
        f->sp = sp;
        f->started = true;
        return true;
    }
#endif
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = f->stack_size;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, (void (*)())fiber_main, 0);
    f->started = true;
    return true;
}

CUDACPU_RUNTIME inline void switch_to(Runtime* r, Fiber* f) {
    r->cur = f;
#ifdef CUDACPU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, f->stack_size);
#endif
#ifdef CUDACPU_TSAN
    __tsan_switch_to_fiber(f->tsan, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef CUDACPU_SWITCH_STACK
    if (r->fast)
        cudacpu_switch_stack(&r->sched_sp, f->sp);
    else
#endif
        r->swap(&r->sched, &f->ctx);
#ifdef CUDACPU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
#ifndef CUDACPU_TSAN
    if (r->cur->state == DONE) r->free_stacks[r->n_free++] = r->cur->stack;  // r->cur: the thread that yielded
#endif
    r->cur = nullptr;
}

CUDACPU_RUNTIME inline void deadlock(Runtime* r) {
    unsigned at_block = 0, at_warp = 0;
    const Fiber* first = nullptr;
    for (unsigned i = 0; i < r->n; ++i) {
        at_block += r->fib[i].state == WAIT_BLOCK, at_warp += r->fib[i].state == WAIT_WARP;
        if (!first && r->fib[i].state == WAIT_WARP) first = &r->fib[i];
    }
    char site[40] = "", msg[300];
    if (at_block) site_text(site, sizeof site, r->barrier_site);
    snprintf(msg, sizeof msg, "deadlock: %u threads wait at __syncthreads%s%s, %u at a warp intrinsic%s, %u exited",
             at_block, at_block ? " at " : "", site, at_warp, first ? " (a lane of the mask never arrives)" : "",
             r->n - r->live);
    fail(msg);
}

// Runs the block r->bidx to its end (true) or to its first error (false, message in r->error).
CUDACPU_RUNTIME inline bool run_block(Runtime* r) {
    const unsigned n = r->n;
#ifdef CUDACPU_TSAN
    // This OS thread exists for this block alone (see launch_blocks_tsan): its TLS, i.e. the block's shared
    // memory, and the sync objects are fresh, so nothing links two blocks but the kernel's own atomics, as on
    // the device.
    r->tsan_sched = __tsan_get_current_fiber();
    r->sync = (char*)malloc(4 + r->warps * kWarpSyncRing);
    const unsigned long long block_no = r->bidx.x + (unsigned long long)r->grid.x * (r->bidx.y + r->grid.y * r->bidx.z);
    for (unsigned i = 0; i < n; ++i) {
        const TsanFiber& t = r->tsan_fibers[block_no * n + i];
        r->fib[i].tsan = t.context, r->fib[i].stack = t.stack, r->fib[i].stack_size = kStack;
    }
#else
    for (unsigned i = 0; i < r->n_stacks; ++i) r->free_stacks[i] = r->stacks[i];  // all free again
    r->n_free = r->n_stacks;
#endif
    fresh_shared_memory(r, r->tls);
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = r->fib[i];
        f.state = RUNNABLE;
        f.started = false;
        f.asan_fake = nullptr;
        r->order[i] = r->schedule == 1 ? n - 1 - i : i;
    }
    for (unsigned w = 0; w < r->warps; ++w) r->warp_inst[w] = 0;
    r->live = n;
    r->arrived = 0;
    r->bar_gen = 0;
    r->cur = nullptr;
#ifdef CUDACPU_TSAN
    __tsan_release(r->sync + 0);
#endif
    while (r->live > 0 && !r->error[0]) {
        if (r->schedule == 2)
            for (unsigned i = n - 1; i > 0; --i) {  // Fisher-Yates with xorshift64
                r->rng ^= r->rng << 13, r->rng ^= r->rng >> 7, r->rng ^= r->rng << 17;
                unsigned j = (unsigned)(r->rng % (i + 1)), t = r->order[i];
                r->order[i] = r->order[j], r->order[j] = t;
            }
        bool ran = false;
        for (r->pos = 0; r->pos < n && !r->error[0]; ++r->pos) {
            Fiber* f = &r->fib[r->order[r->pos]];
            if (f->state != RUNNABLE) continue;
            ran = true;
            if (!f->started && !start_fiber(r, f)) break;
            switch_to(r, f);
        }
        if (!ran && !r->error[0]) deadlock(r);
    }
    const bool ok = !r->error[0];
#ifdef CUDACPU_TSAN
    __tsan_acquire(r->sync + 1);
    free(r->sync);
    __tsan_release(&r->launch_end);
#endif
    return ok;
}

#ifdef CUDACPU_TSAN
// ThreadSanitizer: every block runs on an OS thread of its own, created after the previous block finished and
// never joined. pthread_create orders the host's writes before the block (as a launch does); the handoff back to
// the host is a raw futex, invisible to ThreadSanitizer, so that block b does not happen before block b + 1 through
// the host: their unsynchronised accesses to one address are reported, as they race on the device. The host
// acquires every block's end (launch_end) after the last one. A fresh thread also means fresh TLS, i.e. fresh
// shared memory: one thread's TLS reused by the next block would be a race the scheduler made.
struct BlockJob { Runtime* r; uint3 bidx; int done; bool ok; };

// The fibers' tsan contexts, each with a stack of its own for good: one per CUDA thread of the grid, distinct
// within a launch. A context must not die within a launch: ThreadSanitizer hands a dead context's thread id, with
// its clock, to the next one created, which would hide every race between a block's threads and the next
// block's; and a stack used by two contexts would be a race the scheduler made, unless its shadow were reset
// (a munmap per stack per block). Across launches a context and its stack are reused as they are: what the context
// knows from an earlier launch happened before this one anyway (the host acquired every block's end). Pooled
// because creating a context costs about a millisecond; grown on the host thread, never shrunk.
// One pool per process, shared by every loaded module (cudacpu_tsan_pool / cudacpu_use_tsan_pool: the Python side
// hands the first module's pool to the others), and one ThreadSanitizer launch at a time: a context serves one
// CUDA thread of one launch.
struct TsanPool {
    pthread_mutex_t lock;
    TsanFiber* fibers;
    unsigned long long size;
};
inline TsanPool*& tsan_pool() {
    static TsanPool own = {PTHREAD_MUTEX_INITIALIZER, nullptr, 0};
    static TsanPool* pool = &own;
    return pool;
}
CUDACPU_RUNTIME inline TsanFiber* tsan_fibers(TsanPool* pool, unsigned long long count) {
    if (count > pool->size) {
        TsanFiber* grown = (TsanFiber*)realloc(pool->fibers, count * sizeof(TsanFiber));
        if (!grown) return nullptr;
        pool->fibers = grown;
        for (; pool->size < count; ++pool->size) {
            char* st = map_stack();
            if (!st) return nullptr;
            pool->fibers[pool->size].stack = st;
            pool->fibers[pool->size].context = __tsan_create_fiber(0);
        }
    }
    return pool->fibers;
}

CUDACPU_RUNTIME inline void* block_thread(void* p) {
    BlockJob* job = (BlockJob*)p;
    rt_ptr() = job->r;
    job->r->bidx = job->bidx;
    const void* base = nullptr;
    job->r->tls = module_tls(&base);  // this thread's copy of the module's TLS
    job->ok = run_block(job->r);
    rt_ptr() = nullptr;
    __atomic_store_n(&job->done, 1, __ATOMIC_RELEASE);  // uninstrumented (CUDACPU_RUNTIME): no sync for tsan
    syscall(SYS_futex, &job->done, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    return nullptr;
}

CUDACPU_RUNTIME inline bool launch_blocks_tsan(Runtime* r) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    bool ok = true;
    for (unsigned z = 0; z < r->grid.z && ok; ++z)
        for (unsigned y = 0; y < r->grid.y && ok; ++y)
            for (unsigned x = 0; x < r->grid.x && ok; ++x) {
                BlockJob job = {r, uint3{x, y, z}, 0, false};
                pthread_t th;
                if (pthread_create(&th, &attr, block_thread, &job) != 0) {
                    snprintf(r->error, sizeof r->error, "could not start a thread for block (%u,%u,%u)", x, y, z);
                    ok = false;
                    break;
                }
                while (!__atomic_load_n(&job.done, __ATOMIC_ACQUIRE))
                    syscall(SYS_futex, &job.done, FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);
                ok = job.ok;
            }
    pthread_attr_destroy(&attr);
    __tsan_acquire(&r->launch_end);
    return ok;
}
#endif

// ---- kernels ---------------------------------------------------------------------------------------------------
// A parameter as the Python side checks it: "P|C|dtype|C++ spelling" (pointer?, const pointee?, NumPy dtype name
// of the scalar or the pointee, "?" for a type NumPy has no name for).
template <class T> struct TypeName { static const char* dtype() { return "?"; } static const char* cxx() { return nullptr; } };
#define CUDACPU_TYPENAME(T, d)                                  \
    template <> struct TypeName<T> {                            \
        static const char* dtype() { return d; }                \
        static const char* cxx() { return #T; }                 \
    };
CUDACPU_TYPENAME(float, "float32") CUDACPU_TYPENAME(double, "float64") CUDACPU_TYPENAME(bool, "bool")
CUDACPU_TYPENAME(signed char, "int8") CUDACPU_TYPENAME(unsigned char, "uint8")
CUDACPU_TYPENAME(char, std::is_signed<char>::value ? "int8" : "uint8")
CUDACPU_TYPENAME(short, "int16") CUDACPU_TYPENAME(unsigned short, "uint16")
CUDACPU_TYPENAME(int, "int32") CUDACPU_TYPENAME(unsigned int, "uint32")
CUDACPU_TYPENAME(long, "int64") CUDACPU_TYPENAME(unsigned long, "uint64")
CUDACPU_TYPENAME(long long, "int64") CUDACPU_TYPENAME(unsigned long long, "uint64")
CUDACPU_TYPENAME(void, "void")
#undef CUDACPU_TYPENAME

// the C++ spelling of a type NumPy has no name for (messages only)
CUDACPU_RUNTIME inline void demangled(const std::type_info& t, char* out, size_t len) {
    int status = 0;
    char* s = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
    snprintf(out, len, "%s", status == 0 && s ? s : t.name());
    free(s);
}
// Appends the description of parameter type A to out (';'-separated): plain snprintf, little code per type, so
// that registering many kernels stays cheap to compile.
CUDACPU_RUNTIME inline void describe(char* out, size_t len, bool pointer, bool is_const, const char* dtype,
                                     const char* cxx, const std::type_info& t) {
    char name[200];
    if (cxx) snprintf(name, sizeof name, "%s", cxx);
    else demangled(t, name, sizeof name);
    const size_t used = strlen(out);
    snprintf(out + used, len - used, "%s%d|%d|%s|%s%s%s", used ? ";" : "", pointer, is_const, dtype,
             is_const ? "const " : "", name, pointer ? "*" : "");
}
template <class A> struct Param {
    static void add(char* out, size_t len) {  // a scalar
        using T = typename std::remove_cv<A>::type;
        describe(out, len, false, false, TypeName<T>::dtype(), TypeName<T>::cxx(), typeid(T));
    }
};
template <class P> struct Param<P*> {
    static void add(char* out, size_t len) {
        using T = typename std::remove_cv<P>::type;
        describe(out, len, true, std::is_const<P>::value, std::is_pointer<T>::value ? "?" : TypeName<T>::dtype(),
                 TypeName<T>::cxx(), typeid(T));
    }
};

struct Kernel {
    const char* name;                 // the name expression, exactly as the Python side wrote it
    char params[2048];                // each parameter's "pointer|const|dtype|C++ type", joined by ';'
    size_t nparams;
    void* fn;                         // the kernel (one instantiation)
    void* (*bind)(void* fn, void** args);  // kernel arguments -> a copy of their values, what every thread is passed
    void (*invoke)(void* bound);      // runs the kernel on such a copy
    void (*release)(void* bound);
};
constexpr int kMaxKernels = 512;
struct Registry {
    Kernel kernels[kMaxKernels];
    int n;
};
inline Registry& registry() { static Registry r; return r; }

template <class... A> struct Bound {
    void (*k)(A...);
    std::tuple<typename std::decay<A>::type...> values;
};
template <class... A> struct Signature {
    template <size_t... I> static void* bind_i(void* k, void** args, std::index_sequence<I...>) {
        return new Bound<A...>{(void (*)(A...))k, std::tuple<typename std::decay<A>::type...>(
                                                      *static_cast<typename std::decay<A>::type*>(args[I])...)};
    }
    template <size_t... I> static void invoke_i(void* p, std::index_sequence<I...>) {
        Bound<A...>* b = (Bound<A...>*)p;
        b->k(std::get<I>(b->values)...);  // by value: every thread gets its own copies, as kernel parameters
    }
    static void* bind(void* k, void** args) { return bind_i(k, args, std::index_sequence_for<A...>()); }
    static void invoke(void* p) { invoke_i(p, std::index_sequence_for<A...>()); }
    static void release(void* p) { delete (Bound<A...>*)p; }
};

struct Registrar {
    template <class... A> Registrar(const char* name, void (*k)(A...)) {
        Registry& reg = registry();
        if (reg.n == kMaxKernels) abort();  // more kernels than any source here has
        Kernel& kern = reg.kernels[reg.n++];
        kern.name = name;
        kern.params[0] = 0;
        using expand = int[];
        (void)expand{0, (Param<A>::add(kern.params, sizeof kern.params), 0)...};
        kern.nparams = sizeof...(A);
        kern.fn = (void*)k;
        kern.bind = &Signature<A...>::bind;
        kern.invoke = &Signature<A...>::invoke;
        kern.release = &Signature<A...>::release;
    }
};

}  // namespace cudacpu

#define CUDACPU_KERNEL(name, ...) \
    static ::cudacpu::Registrar CUDACPU_CAT(cudacpu_kernel_, __COUNTER__)(name, &__VA_ARGS__);

// ---- C API (ctypes) ----------------------------------------------------------------------------------------------
#define CUDACPU_API extern "C" __attribute__((used, visibility("default")))
CUDACPU_API int cudacpu_kernel_count() { return cudacpu::registry().n; }
CUDACPU_API const char* cudacpu_kernel_name(int i) { return cudacpu::registry().kernels[i].name; }
CUDACPU_API const char* cudacpu_kernel_params(int i) { return cudacpu::registry().kernels[i].params; }
// what this library was built with: 1 AddressSanitizer, 2 ThreadSanitizer
CUDACPU_API int cudacpu_sanitizers() {
    int s = 0;
#ifdef CUDACPU_ASAN
    s |= 1;
#endif
#ifdef CUDACPU_TSAN
    s |= 2;
#endif
    return s;
}

// ThreadSanitizer builds: this module's pool of contexts, and adopting another module's (one pool per process)
CUDACPU_API void* cudacpu_tsan_pool() {
#ifdef CUDACPU_TSAN
    return cudacpu::tsan_pool();
#else
    return nullptr;
#endif
}
CUDACPU_API void cudacpu_use_tsan_pool(void* pool) {
#ifdef CUDACPU_TSAN
    if (pool) cudacpu::tsan_pool() = (cudacpu::TsanPool*)pool;
#else
    (void)pool;
#endif
}

// 0: ran; 1: refused (nothing ran); 2: a device-side error (message in err, code addresses as @0x<offset>@)
CUDACPU_API CUDACPU_RUNTIME int cudacpu_launch(int kernel, const unsigned* grid, const unsigned* block,
                                               unsigned long long shmem, unsigned long long max_shmem, void** args,
                                               int nargs, int schedule, unsigned long long seed, int strict,
                                               char* err, unsigned long long errlen) {
    using namespace cudacpu;
    if (kernel < 0 || kernel >= registry().n) {
        snprintf(err, errlen, "no kernel %d in this module", kernel);
        return 1;
    }
    const Kernel& kern = registry().kernels[kernel];
    if ((int)kern.nparams != nargs) {
        snprintf(err, errlen, "%s takes %zu arguments, got %d", kern.name, kern.nparams, nargs);
        return 1;
    }
    const unsigned long long n = (unsigned long long)block[0] * block[1] * block[2];
    if (!grid[0] || !grid[1] || !grid[2] || !n || n > 1024 || block[0] > 1024 || block[1] > 1024 || block[2] > 64 ||
        grid[1] > 65535 || grid[2] > 65535 || grid[0] > 2147483647u) {
        snprintf(err, errlen, "invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u): at most 1024 threads "
                 "per block (1024, 1024, 64), grid up to (2^31-1, 65535, 65535) (cudaErrorInvalidConfiguration)",
                 grid[0], grid[1], grid[2], block[0], block[1], block[2]);
        return 1;
    }
    if (shmem > max_shmem || shmem > kSharedMax) {
        snprintf(err, errlen, "%llu bytes of dynamic shared memory exceed the kernel's limit of %llu "
                 "(max_dynamic_shared_size_bytes; %zu at most) (cudaErrorInvalidValue)", shmem,
                 std::min<unsigned long long>(max_shmem, kSharedMax), kSharedMax);
        return 1;
    }
#ifdef CUDACPU_TSAN
    // one tsan context per CUDA thread of the grid, alive for the whole launch (see run_block); GCC 12's runtime
    // dies past 8128 live threads, so refuse before that
    const unsigned long long grid_threads = n * grid[0] * (unsigned long long)grid[1] * grid[2];
    if (grid_threads > kTsanMaxThreads) {
        snprintf(err, errlen, "grid (%u,%u,%u) x block (%u,%u,%u) = %llu threads: ThreadSanitizer runs take at most "
                 "%llu threads per launch (one tsan context each, alive for the launch); use a smaller problem",
                 grid[0], grid[1], grid[2], block[0], block[1], block[2], grid_threads, kTsanMaxThreads);
        return 1;
    }
#endif
    const unsigned warps = (unsigned)((n + 31) / 32);
    std::vector<Fiber> fibers(n);
    std::vector<unsigned> order(n), warp_inst(warps);
    std::vector<uint64_t> slots(n);
    void* bound = kern.bind(kern.fn, args);
    Runtime r = {};
    r.grid = dim3(grid[0], grid[1], grid[2]);
    r.block = dim3(block[0], block[1], block[2]);
    r.shmem = shmem;
    r.n = (unsigned)n, r.warps = warps;
    r.fib = fibers.data(), r.order = order.data(), r.slots = slots.data(), r.warp_inst = warp_inst.data();
    r.body = kern.invoke, r.body_ctx = bound;
    r.schedule = schedule;
    r.rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    r.strict = strict != 0;
    r.swap = context_switch();
    r.fast = fast_switch_usable();
#ifdef CUDACPU_TSAN
    TsanPool* pool = tsan_pool();
    pthread_mutex_lock(&pool->lock);
    r.tsan_fibers = tsan_fibers(pool, grid_threads);
    if (!r.tsan_fibers) {
        pthread_mutex_unlock(&pool->lock);
        kern.release(bound);
        snprintf(err, errlen, "out of memory for the stacks of %llu threads", grid_threads);
        return 1;
    }
#endif
#ifndef CUDACPU_TSAN
    std::vector<char*> stacks(n), free_stacks(n);  // mapped as threads start (start_fiber), n at most
    r.stacks = stacks.data(), r.free_stacks = free_stacks.data(), r.n_stacks = 0;
#endif
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = fibers[i];
        f.tid = uint3{i % block[0], (i / block[0]) % block[1], (unsigned)(i / ((unsigned long long)block[0] * block[1]))};
        f.warp = i / 32, f.lane = i % 32;
    }
    Runtime*& slot = rt_ptr();
    Runtime* saved = slot;  // a launch from inside a launch (a host callback) is not supported, but harmless here
    slot = &r;
    r.tls = module_tls(&r.module_base);
#ifdef CUDACPU_ASAN
    SharedBuffers& sb = shared_buffers();
    for (int s = 0; s < sb.n; ++s)  // bytes past the launch's shared_mem are out of bounds
        __asan_poison_memory_region((char*)sb.items[s].addr() + shmem, sb.items[s].bytes - shmem);
#endif
    bool ok = true;
#ifdef CUDACPU_TSAN
    ok = launch_blocks_tsan(&r);
    pthread_mutex_unlock(&pool->lock);
#else
    for (unsigned z = 0; z < grid[2] && ok; ++z)
        for (unsigned y = 0; y < grid[1] && ok; ++y)
            for (unsigned x = 0; x < grid[0] && ok; ++x) {
                r.bidx = uint3{x, y, z};
                ok = run_block(&r);
            }
#endif
    slot = saved;
#ifdef CUDACPU_ASAN
    for (int s = 0; s < sb.n; ++s) __asan_unpoison_memory_region(sb.items[s].addr(), sb.items[s].bytes);
#endif
#ifndef CUDACPU_TSAN
    for (unsigned i = 0; i < r.n_stacks; ++i) {
        char* st = stacks[i];
#ifdef CUDACPU_ASAN
        __asan_unpoison_memory_region(st, kStack);  // abandoned frames stay poisoned past munmap
#endif
        munmap(st - kGuard, kGuard + kStack);
    }
#endif
#ifdef CUDACPU_TSAN
    // after an error the abandoned fibers' reads of the arguments are not ordered before a free, which
    // ThreadSanitizer would report: a failing launch leaks its argument copy instead
    if (ok) kern.release(bound);
#else
    kern.release(bound);
#endif
    if (!ok) {
        snprintf(err, errlen, "%s", r.error);
        return 2;
    }
    return 0;
}
