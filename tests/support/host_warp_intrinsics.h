// The CUDA intrinsics our tree-build kernels use, for the host emulators (tests/test_tree_build_emulator.py,
// tests/test_tree_build_block_emulator.py), after host_emulator.h. Every warp collective is a meeting of the
// warp's threads (emu_meet_warp): each publishes its value, all meet, each reads what it needs, all meet
// again; only full-warp masks are allowed (the kernels use no other). Shared-memory atomics are host atomics;
// float64 adds are plain (the programs are built with -ffp-contract=off, so nothing is fused).
// Before including, define the meeting kinds EMU_SYNCWARP, EMU_BALLOT, EMU_REDUX, EMU_SHFL and EMU_MATCH.
#pragma once

#include <algorithm>
#include <cmath>

#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__
#define __shared__ static
#define __align__(n) alignas(n)
#define __launch_bounds__(n)
#define DDT_HOST_EMULATOR 1
#define DDT_HOST_EMULATOR_SHARED emu_shared

struct uint4 {
    unsigned int x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
    return uint4{x, y, z, w};
}
using std::max;
using std::min;

static unsigned long long emu_values[1024];  // what each thread publishes at a collective

static void emu_check_mask(unsigned int mask) {
    if (mask != 0xffffffffu) {
        std::fprintf(stderr, "emulator: a partial warp mask\n");
        _exit(5);
    }
}
template <class T> static unsigned long long emu_bits(T v) {
    unsigned long long u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T> static T emu_from_bits(unsigned long long u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
static unsigned int emu_lane() { return threadIdx.x & 31; }
static unsigned int emu_warp_base() { return threadIdx.x & ~31u; }
static unsigned int emu_warp_size() { return std::min(32u, blockDim.x - emu_warp_base()); }

// publishes v, meets the warp, and returns what lane `source` published (own value if outside the warp)
template <class T> static T emu_exchange(T v, int source, int kind) {
    emu_values[threadIdx.x] = emu_bits(v);
    emu_meet_warp(kind);
    const bool inside = source >= 0 && source < static_cast<int>(emu_warp_size());
    const T got = inside ? emu_from_bits<T>(emu_values[emu_warp_base() + source]) : v;
    emu_meet_warp(kind);
    return got;
}

static void __syncwarp(unsigned int mask = 0xffffffffu) {
    emu_check_mask(mask);
    emu_meet_warp(EMU_SYNCWARP);
}
static unsigned int __ballot_sync(unsigned int mask, int predicate) {
    emu_check_mask(mask);
    emu_values[threadIdx.x] = predicate != 0;
    emu_meet_warp(EMU_BALLOT);
    unsigned int bits = 0;
    for (unsigned int i = 0; i < emu_warp_size(); ++i)
        bits |= static_cast<unsigned int>(emu_values[emu_warp_base() + i] & 1u) << i;
    emu_meet_warp(EMU_BALLOT);
    return bits;
}
static int __any_sync(unsigned int mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
static unsigned int __reduce_max_sync(unsigned int mask, unsigned int value) {
    emu_check_mask(mask);
    emu_values[threadIdx.x] = value;
    emu_meet_warp(EMU_REDUX);
    unsigned int best = 0;
    for (unsigned int i = 0; i < emu_warp_size(); ++i)
        best = std::max(best, static_cast<unsigned int>(emu_values[emu_warp_base() + i]));
    emu_meet_warp(EMU_REDUX);
    return best;
}
static unsigned int __match_any_sync(unsigned int mask, int value) {
    emu_check_mask(mask);
    emu_values[threadIdx.x] = static_cast<unsigned int>(value);
    emu_meet_warp(EMU_MATCH);
    unsigned int peers = 0;
    for (unsigned int i = 0; i < emu_warp_size(); ++i)
        if (emu_values[emu_warp_base() + i] == static_cast<unsigned int>(value)) peers |= 1u << i;
    emu_meet_warp(EMU_MATCH);
    return peers;
}
template <class T> static T __shfl_sync(unsigned int mask, T value, int lane) {
    emu_check_mask(mask);
    return emu_exchange(value, lane & 31, EMU_SHFL);
}
template <class T> static T __shfl_xor_sync(unsigned int mask, T value, int lane_mask) {
    emu_check_mask(mask);
    return emu_exchange(value, static_cast<int>(emu_lane()) ^ lane_mask, EMU_SHFL);
}
template <class T> static T __shfl_up_sync(unsigned int mask, T value, unsigned int delta) {
    emu_check_mask(mask);
    return emu_exchange(value, static_cast<int>(emu_lane()) - static_cast<int>(delta), EMU_SHFL);
}
template <class T> static T __shfl_down_sync(unsigned int mask, T value, unsigned int delta) {
    emu_check_mask(mask);
    return emu_exchange(value, static_cast<int>(emu_lane() + delta), EMU_SHFL);
}

static int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static unsigned int atomicOr(unsigned int* p, unsigned int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static int atomicMin(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static int __popc(unsigned int x) { return __builtin_popcount(x); }
static int __ffs(unsigned int x) { return __builtin_ffs(static_cast<int>(x)); }
static unsigned int __umulhi(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
static unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
static unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
    return static_cast<unsigned int>(((static_cast<unsigned long long>(hi) << 32) | lo) >> (shift & 31));
}
static double __dadd_rn(double a, double b) { return a + b; }
static double __dsub_rn(double a, double b) { return a - b; }
static long long __double_as_longlong(double x) { return emu_from_bits<long long>(emu_bits(x)); }
static double __longlong_as_double(long long x) { return emu_from_bits<double>(emu_bits(x)); }
static long long clock64() { return 0; }
static void cp_async(void* dst, const void* src, int bytes) { std::memcpy(dst, src, bytes); }
static void cp_async_commit() {}
static void cp_async_wait_all() {}
