// Benchmark utilities, launched around the kernels under test (never part of a timed result):
//   ddtree_empty_kernel  -- the launch floor, measured in the same run as the kernels;
//   ddtree_spin_kernel   -- keeps the GPU busy for `ns` nanoseconds so that the launches queued behind it
//                           are timed by their CUDA events without the host's launch overhead;
//   ddtree_flush_l2      -- writes a buffer larger than L2 so that the next kernel starts cold;
//   ddtree_stream_read   -- reads a buffer once and does nothing else: the time a kernel needs just to move
//                           as many bytes as a call under test must move (its bandwidth bound, measured).

extern "C" __global__ void ddtree_empty_kernel() {}

extern "C" __global__ void ddtree_spin_kernel(long long ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (true) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start >= static_cast<unsigned long long>(ns)) break;
        __nanosleep(1000);
    }
}

extern "C" __global__ void ddtree_flush_l2(unsigned int* buffer, long long words, unsigned int value) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < words;
         i += static_cast<long long>(gridDim.x) * blockDim.x)
        buffer[i] = value + static_cast<unsigned int>(i);
}

// Each thread reads 16-byte words `STREAM_UNROLL` at a time, `stride` = all threads apart (consecutive threads
// read consecutive words), and folds them into one value that is stored only if it equals `never` (so the
// loads cannot be dropped, and nothing is written in practice).
#ifndef STREAM_UNROLL
#define STREAM_UNROLL 4
#endif
extern "C" __global__ void ddtree_stream_read(const uint4* __restrict__ words, long long count,
                                              unsigned int never, unsigned int* __restrict__ sink) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned int fold = 0;
    for (; i + (STREAM_UNROLL - 1) * stride < count; i += STREAM_UNROLL * stride) {
        uint4 v[STREAM_UNROLL];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; ++u) v[u] = __ldcs(words + i + u * stride);
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; ++u) fold ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < count; i += stride) {
        const uint4 v = __ldcs(words + i);
        fold ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (fold == never) *sink = fold;
}
