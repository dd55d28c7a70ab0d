// Hopper (sm_90a) path of the tree-verify attention: warpgroup MMAs (wgmma) straight from shared memory.
// Included by verify_attn.cu; same arguments, grid, split-KV workspace and combine kernel as
// ddtree_verify_attn (layouts in that file's header comment). Compiled only where the arch-specific sm_90a
// features exist (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the kernel body is empty and the loader never picks
// it (ddtree_verify_attn_wgmma_info says which).
//
// Block: 64 query rows, 256 threads = two warpgroups; key tiles of 32 keys in three buffers, loaded with
// cp.async into 128-byte-swizzled shared memory (the layout wgmma's descriptors read: 64 dims = 128 bytes a row,
// 16-byte chunk c of row r stored at chunk c ^ (r % 8), 8-row atoms 1024 bytes apart, one block of
// (rows x 64 dims) per 64 dims).
//   S = Q K^T: warpgroup g multiplies dims [288 g, 288 g + 288) (18 k-steps of m64n32k16, both operands from
//     shared memory; the k-steps alternate between two accumulators); the two partial S tiles are swapped through shared memory (thread t of one warpgroup
//     holds the same elements as thread t of the other) and added -- the same sum in both warpgroups, so both
//     run the identical online softmax on the full S tile in registers.
//   O += P V: warpgroup g owns output dims [256 g, 256 g + 256): P (bf16) stays in registers as wgmma's A
//     fragment, V is the key tile read transposed (MN-major) from the same shared memory: 2 k-steps of
//     m64n256k16 into 128 fp32 accumulators a thread.
//   Pipelined: S of tile t + 1 and its softmax run while P V of tile t is on the tensor cores (see the loop).
// The mask, the scale (log2 domain), the -inf handling and the split outputs are those of ddtree_verify_attn.
// 198 KB of shared memory, one block per SM, 231 registers a thread.

#define VW_BM 64
#define VW_BN 32
#define VW_THREADS 256
#define VW_DIM_BLOCKS (VA_DIM / 64)                 // 9 blocks of 64 dims (128 bytes) each
#define VW_Q_BYTES (VW_DIM_BLOCKS * VW_BM * 128)    // 73728
#define VW_K_BLOCK_BYTES (VW_BN * 128)              // one 64-dim block of a key tile: 4096
#define VW_K_BYTES (VW_DIM_BLOCKS * VW_K_BLOCK_BYTES)  // 36864
#define VW_X_FLOATS (16 * 128)                      // one warpgroup's partial S: 16 floats x 128 threads
#define VW_STAGES 3                                 // key-tile buffers
#define VW_SMEM_BYTES (VW_Q_BYTES + VW_STAGES * VW_K_BYTES + 2 * VW_X_FLOATS * 4 + 1024)  // + 1024: alignment slack

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VW_ENABLED 1
#else
#define VW_ENABLED 0
#endif

#if VW_ENABLED
// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte offsets (>> 4).
__device__ __forceinline__ uint64_t wgmma_desc(unsigned addr, unsigned lead_bytes, unsigned stride_bytes) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lead_bytes >> 4) << 16) |
           (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma's async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// keep the compiler from moving accumulator reads/writes across the asynchronous MMAs
template <int N>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// registers an in-flight wgmma reads (its A fragments) kept alive, unmoved, until after the wait
template <int N>
__device__ __forceinline__ void wgmma_keep_regs(unsigned (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" ::"r"(r[i]) : "memory");
}

// D[64 x 32] (+)= A[64 x 16] B[16 x 32]: A and B in shared memory (descriptors), B K-major
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 256] += A[64 x 16] B[16 x 256]: A in registers (the m16n8k16 A fragment of the warp's 16 rows),
// B in shared memory MN-major (transposed)
__device__ __forceinline__ void wgmma_m64n256k16_rs_tb(float (&d)[128], const unsigned (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}


// 16-byte chunk `chunk` (0..71) of row `row` of a swizzled tile whose 64-dim blocks are `block_bytes` apart
__device__ __forceinline__ unsigned vw_swizzled(int row, int chunk, unsigned block_bytes) {
    return (chunk >> 3) * block_bytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

__device__ __forceinline__ void vw_load_key_tile(unsigned char* dst, const __nv_bfloat16* kv_b, int key0, int kv_len) {
#pragma unroll
    for (int i = 0; i < VW_BN * (VA_DIM / 8) / VW_THREADS; ++i) {  // 9 chunks a thread
        const int c = threadIdx.x + i * VW_THREADS;
        const int row = c / (VA_DIM / 8), chunk = c % (VA_DIM / 8);
        const int key = key0 + row;
        const bool valid = key < kv_len;
        const __nv_bfloat16* src = kv_b + (valid ? static_cast<long long>(key) * VA_DIM + chunk * 8 : 0);
        cp_async16(dst + vw_swizzled(row, chunk, VW_K_BLOCK_BYTES), src, valid);
    }
}

// Partial S of one key tile over this warpgroup's 288 dims (18 k-steps), issued and committed, not waited for.
// The k-steps alternate between VW_QK_CHAINS independent accumulators (added by vw_sum_chains): a chain of
// dependent small-N MMAs waits on each one's latency.
#ifndef VW_QK_CHAINS
#define VW_QK_CHAINS 2
#endif
__device__ __forceinline__ void vw_issue_qk(float (&s)[VW_QK_CHAINS][16], unsigned sq_addr, unsigned sk_addr, int wg) {
#pragma unroll
    for (int ks = 0; ks < 18; ++ks) {
        const int step = wg * 18 + ks;  // k-step of 16 dims: block step / 4, 32 bytes a step inside it
        const unsigned a = sq_addr + (step >> 2) * (VW_BM * 128) + (step & 3) * 32;
        const unsigned k = sk_addr + (step >> 2) * VW_K_BLOCK_BYTES + (step & 3) * 32;
        wgmma_m64n32k16_ss(s[ks % VW_QK_CHAINS], wgmma_desc(a, 16, 1024), wgmma_desc(k, 16, 1024),
                           ks >= VW_QK_CHAINS);
    }
    wgmma_commit();
}
__device__ __forceinline__ void vw_sum_chains(float (&s)[VW_QK_CHAINS][16]) {
#pragma unroll
    for (int c = 0; c < VW_QK_CHAINS; ++c) wgmma_fence_regs(s[c]);
#pragma unroll
    for (int c = 1; c < VW_QK_CHAINS; ++c)
#pragma unroll
        for (int i = 0; i < 16; ++i) s[0][i] += s[c][i];
}

// O += P V for one key tile: P (bf16 A fragments of the two k-steps) from registers, V = keys x this
// warpgroup's 256 dims, read transposed from the key tile. Issued and committed, not waited for.
__device__ __forceinline__ void vw_issue_pv(float (&acc)[128], const unsigned (&p)[8], unsigned sk_addr, int wg) {
#pragma unroll
    for (int kk = 0; kk < VW_BN / 16; ++kk) {
        const unsigned a_frag[4] = {p[4 * kk + 0], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        // keys 16 kk .. (two 8-key groups 1024 bytes apart), dims 256 wg .. (four 64-dim blocks apart)
        const unsigned v = sk_addr + (4 * wg) * VW_K_BLOCK_BYTES + kk * 16 * 128;
        wgmma_m64n256k16_rs_tb(acc, a_frag, wgmma_desc(v, VW_K_BLOCK_BYTES, 1024));
    }
    wgmma_commit();
}
#endif  // VW_ENABLED

extern "C" __global__ void __launch_bounds__(VW_THREADS, 1) ddtree_verify_attn_wgmma(VA_KERNEL_PARAMS) {
#if VW_ENABLED
    extern __shared__ __align__(1024) unsigned char vw_smem_raw[];
    // 1024-byte alignment of the swizzle atoms (the dynamic window's start is not guaranteed to have it)
    unsigned char* smem = vw_smem_raw + ((1024 - (smem_addr(vw_smem_raw) & 1023)) & 1023);
    unsigned char* sq = smem;
    unsigned char* sk0 = smem + VW_Q_BYTES;  // key tiles: VW_STAGES buffers of VW_K_BYTES
    float* sx = reinterpret_cast<float*>(smem + VW_Q_BYTES + VW_STAGES * VW_K_BYTES);  // [2][16][128]

    const int b = blockIdx.z;
    const int split = blockIdx.y;
    const int rows = tokens * heads;
    const int row0 = blockIdx.x * VW_BM;
    const int tid = threadIdx.x;
    const int wg = tid >> 7, wtid = tid & 127;  // warpgroup, thread within it
    const int warp_in_wg = wtid >> 5, lane = tid & 31;
    const int prefix = prefix_lengths[b];
    const int kv_len = prefix + tokens;
    const int tiles = (kv_len + VW_BN - 1) / VW_BN;
    const int tile_begin = split * tiles_per_split;
    const int tile_end = min(tiles, tile_begin + tiles_per_split);
    const int key_end = min(kv_len, tile_end * VW_BN);  // this split's keys end here (the next split's begin)

    const __nv_bfloat16* q_b = q + static_cast<long long>(b) * rows * VA_DIM;
    const __nv_bfloat16* kv_b = kv + static_cast<long long>(b) * kv_rows * VA_DIM;
    const unsigned* mask_b = mask_bits + static_cast<long long>(b) * tokens * mask_words;
    const unsigned sq_addr = smem_addr(sq), sk_addr0 = smem_addr(sk0);

    // this thread's two rows of the 64-row tile (the m16n8 accumulator layout, warp w of the warpgroup owns
    // rows 16 w ..): r_lo and r_lo + 8; columns 8 j + 2 (lane % 4) + {0, 1} of n-tile j
    const int r_lo = warp_in_wg * 16 + (lane >> 2);
    const int col0 = 2 * (lane & 3);
    int row_tok[2];
    bool row_ok[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + r_lo + 8 * h;
        row_ok[h] = row < rows;
        row_tok[h] = row_ok[h] ? row / heads : 0;
    }
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // l_run: this thread's columns only
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;

    // The full S of a tile from this warpgroup's partial sums and the other's (swapped through shared
    // memory), then scale, tree mask and online softmax (log2 domain; 4 threads share a row): P as bf16
    // A fragments {row lo keys +0, row hi keys +0, row lo keys +8, row hi keys +8} of the two k-steps, and the
    // factor alpha that takes the accumulators to the new running max.
    auto softmax = [&](float (&s)[16], int key0, unsigned (&p)[8], float (&alpha)[2]) {
#pragma unroll
        for (int i = 0; i < 16; ++i) sx[(wg * 16 + i) * 128 + wtid] = s[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 16; ++i) s[i] += sx[((wg ^ 1) * 16 + i) * 128 + wtid];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float v[8];
            float tmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = key0 + 8 * j + col0 + e;
                    float x = -INFINITY;
                    if (row_ok[h] && key < key_end) {
                        x = s[4 * j + 2 * h + e] * scale_log2;
                        if (key >= prefix) {
                            const int jj = key - prefix;
                            if (!((mask_b[static_cast<long long>(row_tok[h]) * mask_words + (jj >> 5)] >> (jj & 31)) &
                                  1u))
                                x = -INFINITY;
                        }
                    }
                    v[2 * j + e] = x;
                    tmax = fmaxf(tmax, x);
                }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
            const float m_new = fmaxf(m_run[h], tmax);
            float pr[8];
            if (m_new == -INFINITY) {
                alpha[h] = 1.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) pr[e] = 0.f;
            } else {
                alpha[h] = exp2f(m_run[h] - m_new);
                float sum = 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    pr[e] = exp2f(v[e] - m_new);
                    sum += pr[e];
                }
                l_run[h] = l_run[h] * alpha[h] + sum;
            }
            m_run[h] = m_new;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                __nv_bfloat162 pair = __floats2bfloat162_rn(pr[2 * j], pr[2 * j + 1]);
                p[(j >> 1) * 4 + (j & 1) * 2 + h] = *reinterpret_cast<unsigned*>(&pair);
            }
        }
    };

    // Q tile (rows past M zero-filled) with the first key tile: one cp.async group; the second tile: another
    for (int c = tid; c < VW_BM * (VA_DIM / 8); c += VW_THREADS) {
        const int r = c / (VA_DIM / 8), chunk = c % (VA_DIM / 8);
        const bool valid = row0 + r < rows;
        const __nv_bfloat16* src = q_b + (valid ? static_cast<long long>(row0 + r) * VA_DIM + chunk * 8 : 0);
        cp_async16(sq + vw_swizzled(r, chunk, VW_BM * 128), src, valid);
    }
    if (tile_begin < tile_end) vw_load_key_tile(sk0, kv_b, tile_begin * VW_BN, kv_len);
    cp_async_commit();
    if (tile_begin + 1 < tile_end) vw_load_key_tile(sk0 + VW_K_BYTES, kv_b, (tile_begin + 1) * VW_BN, kv_len);
    cp_async_commit();

    // Software pipeline (in each warpgroup, FA3-style): while P V of tile t runs on the tensor cores, the
    // softmax of tile t + 1 runs on the other units. Per iteration t: S(t + 1) issued, then P(t) V(t);
    // wait for S(t + 1); swap and softmax -> P(t + 1); wait for P(t) V(t); rescale O. Three key buffers:
    // tile t (P V), tile t + 1 (Q K^T), tile t + 2 (loading). The last iteration's S(t + 1) is issued and
    // softmaxed too (on a stale buffer, every key masked as past the split's end: P = 0, alpha = 1) --
    // branch-free, so ptxas keeps the MMAs asynchronous (with the branches it serialises them).
    unsigned p[8];
    if (tile_begin < tile_end) {
        float s[VW_QK_CHAINS][16];
        float alpha[2];
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
        wgmma_fence();
        vw_issue_qk(s, sq_addr, sk_addr0, wg);
        wgmma_wait<0>();
        vw_sum_chains(s);
        softmax(s[0], tile_begin * VW_BN, p, alpha);  // O is still zero: alpha is not needed
    }
    for (int t = tile_begin; t < tile_end; ++t) {
        const int i = t - tile_begin;
        cp_async_wait<0>();  // tile t + 1 (this thread's part)
        fence_proxy_async();
        __syncthreads();  // tile t + 1 landed; everyone is done with tile t - 1: its buffer takes tile t + 2
        if (t + 2 < tile_end) vw_load_key_tile(sk0 + ((i + 2) % VW_STAGES) * VW_K_BYTES, kv_b, (t + 2) * VW_BN, kv_len);
        cp_async_commit();
        float s[VW_QK_CHAINS][16];
        float alpha[2] = {1.f, 1.f};
        unsigned p_next[8];
        wgmma_fence();
        vw_issue_qk(s, sq_addr, sk_addr0 + ((i + 1) % VW_STAGES) * VW_K_BYTES, wg);
        vw_issue_pv(acc, p, sk_addr0 + (i % VW_STAGES) * VW_K_BYTES, wg);
        wgmma_wait<1>();  // S(t + 1) done; P(t) V(t) may still run
        vw_sum_chains(s);
        softmax(s[0], (t + 1) * VW_BN, p_next, alpha);
        wgmma_wait<0>();
        wgmma_fence_regs(acc);
        wgmma_keep_regs(p);  // P(t) stays in its registers until its MMAs are done
        if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
            for (int n = 0; n < 32; ++n) {
                acc[4 * n + 0] *= alpha[0];
                acc[4 * n + 1] *= alpha[0];
                acc[4 * n + 2] *= alpha[1];
                acc[4 * n + 3] *= alpha[1];
            }
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) p[k] = p_next[k];
    }
    cp_async_wait<0>();

    // ---- epilogue: each warpgroup writes its 256 dims of the rows it holds
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row0 + r_lo + 8 * h;
        if (!row_ok[h]) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        if (splits == 1) {
            __nv_bfloat16* o = out + (static_cast<long long>(b) * rows + row) * VA_DV + wg * 256 + col0;
#pragma unroll
            for (int n = 0; n < 32; ++n)
                *reinterpret_cast<__nv_bfloat162*>(o + n * 8) =
                    __floats2bfloat162_rn(acc[4 * n + 2 * h] * inv, acc[4 * n + 2 * h + 1] * inv);
        } else {
            const long long prow = (static_cast<long long>(split) * batch + b) * rows + row;
            float* o = partial_out + prow * VA_DV + wg * 256 + col0;
#pragma unroll
            for (int n = 0; n < 32; ++n)
                *reinterpret_cast<float2*>(o + n * 8) =
                    make_float2(acc[4 * n + 2 * h] * inv, acc[4 * n + 2 * h + 1] * inv);
            if (wg == 0 && (lane & 3) == 0) partial_lse[prow] = l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
        }
    }
#endif  // VW_ENABLED
}

// info[0]: shared memory one block of ddtree_verify_attn_wgmma needs; info[1]: 1 where the wgmma kernel is
// compiled in for the running device (sm_90a code), else 0.
extern "C" __global__ void ddtree_verify_attn_wgmma_info(int* info) {
    info[0] = VW_SMEM_BYTES;
    info[1] = VW_ENABLED;
}
