// What the host emulators of our CUDA kernels share (tests/test_accept.py, tests/test_tree_build_emulator.py,
// tests/test_tree_build_block_emulator.py): the CUDA qualifiers as nothing, the thread and block indices (each
// emulated thread a host thread, started by emu_run_block_threads), and the meetings: every thread of a block
// attends at a barrier, every thread of a warp at a warp collective (host_warp_intrinsics.h). A thread that
// reaches a different meeting than the others (a collective or barrier inside divergent code) is an error.
//
// Before including, an emulator defines its meeting kinds as EMU_KIND_NAMES, a brace list of names indexed by
// kind. A thread arrives under the meeting's mutex (so every arrival's work is ordered before the last
// arrival's); the last one publishes the next generation with a release store and wakes the others, which
// wait on that word (a futex) and read it with an acquire load: ThreadSanitizer sees exactly the ordering a
// barrier gives, and no leaver re-locks anything (a condition variable's waiters would re-take the mutex one
// by one: with a block of 1024 host threads on a few cores that convoy was most of the tests' time).
// Consecutive meetings alternate between two meetings: no thread arrives at meeting k + 2 before every
// thread has left meeting k (they all had to arrive at k + 1).
#pragma once

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define __host__
#define __device__
#define __global__

struct EmuDim {
    unsigned int x = 0, y = 1, z = 1;
};
static thread_local EmuDim threadIdx, blockIdx;
static EmuDim blockDim, gridDim;
static unsigned char* emu_shared = nullptr;

static const char* const emu_kind_names[] = EMU_KIND_NAMES;
static constexpr int EMU_KINDS = sizeof(emu_kind_names) / sizeof(emu_kind_names[0]);
static int emu_held[EMU_KINDS] = {};  // meetings held, per kind (a warp's count each)

struct EmuMeeting {
    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    unsigned int arrived = 0;
    unsigned int generation = 0;  // the futex word the waiters sleep on: atomic accesses only
    int kind = -1;
};
static EmuMeeting emu_meetings[2];           // the block's
static EmuMeeting emu_warp_meetings[32][2];  // each warp's (warp collectives)
static thread_local unsigned long emu_attended = 0, emu_warp_attended = 0;

// every member of a group (the block, or one warp) meets here; all must come for the same reason
static void emu_meet_in(EmuMeeting (&pair)[2], unsigned long& attended, unsigned int members, int kind) {
    EmuMeeting& m = pair[attended++ & 1];
    pthread_mutex_lock(&m.mutex);
    if (m.arrived == 0) {
        m.kind = kind;
    } else if (m.kind != kind) {
        std::fprintf(stderr, "emulator: thread %u reached %s while others wait at %s\n", threadIdx.x,
                     emu_kind_names[kind], emu_kind_names[m.kind]);
        std::fflush(stderr);
        _exit(4);
    }
    const unsigned int generation = __atomic_load_n(&m.generation, __ATOMIC_RELAXED);
    if (++m.arrived == members) {
        m.arrived = 0;
        __atomic_fetch_add(&emu_held[kind], 1, __ATOMIC_RELAXED);
        __atomic_store_n(&m.generation, generation + 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&m.mutex);
        syscall(SYS_futex, &m.generation, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
        return;
    }
    pthread_mutex_unlock(&m.mutex);
    while (__atomic_load_n(&m.generation, __ATOMIC_ACQUIRE) == generation)
        syscall(SYS_futex, &m.generation, FUTEX_WAIT_PRIVATE, generation, nullptr, nullptr, 0);
}

// every thread of the block meets here
static void emu_meet(int kind) { emu_meet_in(emu_meetings, emu_attended, blockDim.x, kind); }

// every thread of the caller's warp meets here
static void emu_meet_warp(int kind) {
    const unsigned int warp = threadIdx.x >> 5, first = warp * 32;
    emu_meet_in(emu_warp_meetings[warp], emu_warp_attended, blockDim.x - first < 32 ? blockDim.x - first : 32,
                kind);
}

// n elements of T from f (an exact-size allocation, so AddressSanitizer sees any read past them)
template <class T> static T* read_array(FILE* f, long long n) {
    T* p = static_cast<T*>(std::malloc(n > 0 ? n * sizeof(T) : 1));
    if (n > 0 && std::fread(p, sizeof(T), n, f) != static_cast<size_t>(n)) std::exit(2);
    return p;
}

// The block's blockDim.x threads as host threads (1 MiB stacks), each running body with its thread index as
// the argument, joined before returning; false when one could not start (the caller exits: the others may
// wait at a meeting forever).
static bool emu_run_block_threads(void* (*body)(void*)) {
    pthread_t* threads = static_cast<pthread_t*>(std::malloc(blockDim.x * sizeof(pthread_t)));
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    for (unsigned int t = 0; t < blockDim.x; ++t)
        if (pthread_create(&threads[t], &attr, body, reinterpret_cast<void*>(static_cast<size_t>(t))) != 0)
            return false;
    for (unsigned int t = 0; t < blockDim.x; ++t) pthread_join(threads[t], nullptr);
    pthread_attr_destroy(&attr);
    std::free(threads);
    return true;
}
