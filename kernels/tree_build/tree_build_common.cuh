// Shared by the tree-build kernels (tree_build.cu) and their host emulators (tests): path codes, the
// order-preserving 64-bit key of a double, 16 bits to 16 bool bytes, and the kernels' parameter list.
#pragma once

#define DDT_STAT_FAST 0
#define DDT_STAT_HEAP_ANOMALY 1
#define DDT_STAT_HEAP_OVERFLOW 2
#define DDT_STAT_HEAP_FORCED 3
#define DDT_STAT_WARP_HEAP 4

// An unsigned integer key with the order of the doubles (every non-NaN double above 0).
__device__ __forceinline__ unsigned long long ordered_key(double x) {
    unsigned long long u = static_cast<unsigned long long>(__double_as_longlong(x));
    return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

__device__ __forceinline__ double key_to_double(unsigned long long k) {
    unsigned long long u = (k >> 63) ? (k & 0x7fffffffffffffffull) : ~k;
    return __longlong_as_double(static_cast<long long>(u));
}

// 16 mask bits as 16 bool bytes (bit j -> byte j, 0 or 1), one 16-byte store.
__device__ __forceinline__ uint4 bool_bytes16(unsigned int v) {
    uint4 o;
    o.x = ((v & 0xfu) * 0x00204081u) & 0x01010101u;
    o.y = (((v >> 4) & 0xfu) * 0x00204081u) & 0x01010101u;
    o.z = (((v >> 8) & 0xfu) * 0x00204081u) & 0x01010101u;
    o.w = (((v >> 12) & 0xfu) * 0x00204081u) & 0x01010101u;
    return o;
}

#define DDT_BUILD_PARAMS                                                                              \
    const float* __restrict__ top_log_probs,       /* [B, L, K] */                                      \
    const long long* __restrict__ top_token_ids,   /* [B, L, K] */                                      \
    int batch, int L, int K, int budget, int cap, int flags,                                            \
    int* __restrict__ node_count,                  /* [B] */                                            \
    long long* __restrict__ node_token_ids,        /* [B, N] */                                         \
    long long* __restrict__ node_depths,           /* [B, N] */                                         \
    int* __restrict__ parents,                     /* [B, N+1] */                                       \
    unsigned int* __restrict__ visibility_bits,    /* [B, N+1, W], W = ceil((N+1)/32) */                \
    long long* __restrict__ retrieve_next_token,   /* [B, N+1] */                                       \
    long long* __restrict__ retrieve_next_sibling, /* [B, N+1] */                                       \
    int* __restrict__ stats,                       /* [B] path taken, or null */                        \
    long long* __restrict__ profile                /* [B, 8] clock64 stamps per phase, or null */

#define DDT_BUILD_ARGS                                                                                  \
    top_log_probs, top_token_ids, batch, L, K, budget, cap, flags, node_count, node_token_ids,          \
    node_depths, parents, visibility_bits, retrieve_next_token, retrieve_next_sibling, stats, profile
