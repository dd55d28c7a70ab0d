// Hopper (sm_90a) path with row tiles of 72 query rows. At 8 heads a request has 8 (N + 1) rows, a multiple of
// 64 plus 8 for every budget N = 8 j: 64-row tiles (ddtree_verify_attn_wgmma) need a last block for those 8
// rows that loads every key and computes a whole 64-row tile (at budget 8: two blocks a request, 1.8x the
// work); 72-row tiles cover the rows with ceil(M / 72) blocks instead. Included by verify_attn.cu after
// verify_attn_wgmma.cuh (whose helpers it uses); same arguments, split-KV workspace and combine kernel as
// ddtree_verify_attn, grid (ceil(M / 72), splits, B), 256 threads, key tiles of 64 keys.
//
// The products are transposed, so that the query rows are wgmma's N dimension (any multiple of 8) and the
// keys or output dims its M (64):
//   S^T [64 keys x 72 rows] = K Q^T: 36 k-steps of m64n72k16, the key tile (A) and Q (B) both K-major in
//     shared memory, the rope dims first (see the rope buffer below);
//   O^T [512 dims x 72 rows] += V^T P^T: per 64-dim block of O^T, 4 k-steps of m64n72k16, A = the key tile
//     read MN-major (transposed), B = P^T, bf16, K-major in shared memory.
// Warpgroup 0 computes S^T, the softmax and O^T's dims 0..191 (3 blocks of 64); warpgroup 1 loads the next key
// tile and computes O^T's dims 192..511 (5 blocks). The accumulators' columns are query rows: thread t holds
// columns 8 j + 2 (t % 4) + {0, 1} (j = 0..8) of every product, so a row's softmax statistics live in the 32
// threads with the same t % 4 (8 lanes of each of the four warps).
//
// Softmax: a row's maximum over a tile spans the four warps of warpgroup 0, so it is not computed every tile.
// The running maximum m stays as it is while every score of the tile is at most m + 8 (log2 domain: P =
// 2^(s - m) <= 256, exact in fp32 and bf16's relative precision); the warpgroup votes on that with one barrier
// reduction (bar.red.or). Only a tile that breaks it (the first, and where the scores climb) reduces the
// maxima across the warps through shared memory, rescales the accumulators and the row sums, and hands the
// factors to warpgroup 1. Row sums are kept per thread (its own keys) and added across threads at the end.
//
// Shared memory (227 KB, all of it: one block per SM; the base is 1024-byte aligned, checked):
//   Q 72 rows x 576 dims, 9 blocks of 72 x 64 dims (82944 B); the key tiles' 512 latent dims in two buffers
//   (2 x 65536 B); their 64 rope dims in ONE buffer (8192 B): S^T issues its rope k-steps first, and the next
//   tile's rope dims load once they are done, together with its latent dims (once the older tile's P V is
//   done: the same wait); P^T 72 x 64 keys (9216 B); 1024 B for the maxima exchange and the hand-over.
// Named barriers as ddtree_verify_attn_wgmma's (key tile ready, key buffers free, P ready, P taken), plus two
// of warpgroup 0 alone (the vote and the maxima exchange; P^T written) and two at the end.

#define VX_ROWS 72
#define VX_J (VX_ROWS / 8)                               // 9 column groups of 8 a product
#define VX_Q_BLOCK_BYTES (VX_ROWS * 128)                 // Q: one 64-dim block of 72 rows, 9216
#define VX_Q_BYTES (VW_DIM_BLOCKS * VX_Q_BLOCK_BYTES)    // 82944
#define VX_NOPE_BYTES ((VW_DIM_BLOCKS - 1) * VW_K_BLOCK_BYTES)  // a key tile's 512 latent dims, 65536
#define VX_OFF_NOPE VX_Q_BYTES
#define VX_OFF_ROPE (VX_OFF_NOPE + 2 * VX_NOPE_BYTES)   // 214016
#define VX_OFF_P (VX_OFF_ROPE + VW_K_BLOCK_BYTES)        // 222208
#define VX_OFF_X (VX_OFF_P + VX_ROWS * 128)              // 231424: maxima exchange, factors, flag
#define VX_SMEM_BYTES (VX_OFF_X + 1024)                  // 232448 = 227 KB
#define VX_WG0_BLOCKS 3                                  // O^T 64-dim blocks of warpgroup 0 (dims 0..191)
#define VX_WG1_BLOCKS 5                                  // of warpgroup 1 (dims 192..511)
#define VX_STAGE_LD 516  // the output staged as [row][dim] floats at the end (conflict-free: 516 % 32 = 4)
#define VX_OFF_SUMS (146 * 1024)  // after the staged output (72 x 516 x 4 = 148608 B): [4][72] row sums, [72] maxima
#define VX_THRESHOLD 8.f          // a tile keeps the running maximum while its scores are at most m + 8
#define VX_M_FLOOR -3.0e38f   // the running maximum where it is still -inf (no finite score yet): 2^(s - m) stays finite

#define VX_BAR_WG0 6       // warpgroup 0 alone: the vote and the maxima exchange
#define VX_BAR_PWRITTEN 7  // warpgroup 0 alone: P^T written (its own P V reads every thread's part)
#define VX_BAR_END 8       // both: every MMA and load done, shared memory free
#define VX_BAR_SUMS 9      // both: row sums and maxima in shared memory

#if VW_ENABLED
// D[64 x 72] (+)= A[64 x 16] B[16 x 72], both from shared memory; B K-major, A K-major (TA = 0) or MN-major (1)
template <int TA>
__device__ __forceinline__ void wgmma_m64n72k16_ss(float (&d)[36], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, %36, %37, p, 1, 1, %39, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA));
}

template <int M, int N>
__device__ __forceinline__ void vx_fence_regs(float (&d)[M][N]) {
#pragma unroll
    for (int m = 0; m < M; ++m) wgmma_fence_regs(d[m]);
}

// named barriers with the id as an immediate (THREADS: 256 = both warpgroups, 128 = one)
template <int ID, int THREADS = VW_THREADS>
__device__ __forceinline__ void vx_bar_sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
template <int ID>
__device__ __forceinline__ void vx_bar_arrive() {
    asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(VW_THREADS) : "memory");
}
template <int ID>  // predicated, not branched around (see vw_bar_arrive_if)
__device__ __forceinline__ void vx_bar_arrive_if(bool cond) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p bar.arrive %1, %2;\n}\n" ::"r"(int(cond)), "n"(ID),
                 "n"(VW_THREADS)
                 : "memory");
}
// every thread of the warpgroup gets the OR of `cond` over the warpgroup (one barrier)
template <int ID>
__device__ __forceinline__ bool vx_bar_or128(bool cond) {
    unsigned r;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbar.red.or.pred q, %2, 128, p;\nselp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(r)
        : "r"(int(cond)), "n"(ID)
        : "memory");
    return r != 0;
}

// S^T of one key tile: the 4 rope k-steps (Q block 8 against the rope buffer) as one commit group, then the
// 32 latent ones as another. Issued, not waited for.
__device__ __forceinline__ void vx_issue_qk(float (&s)[36], unsigned sq_addr, unsigned nope_addr, unsigned rope_addr) {
#pragma unroll
    for (int step = 0; step < 4; ++step)
        wgmma_m64n72k16_ss<0>(s, wgmma_desc(rope_addr + step * 32, 16, 1024),
                              wgmma_desc(sq_addr + 8 * VX_Q_BLOCK_BYTES + step * 32, 16, 1024), step > 0);
    wgmma_commit();
#pragma unroll
    for (int step = 0; step < 32; ++step)
        wgmma_m64n72k16_ss<0>(s, wgmma_desc(nope_addr + (step >> 2) * VW_K_BLOCK_BYTES + (step & 3) * 32, 16, 1024),
                              wgmma_desc(sq_addr + (step >> 2) * VX_Q_BLOCK_BYTES + (step & 3) * 32, 16, 1024), 1);
    wgmma_commit();
}

// O^T blocks B0 .. B0 + NB - 1 (64 dims each) += V^T P^T for one key tile. Issued and committed, not waited for.
template <int B0, int NB>
__device__ __forceinline__ void vx_issue_pv(float (&acc)[NB][36], unsigned nope_addr, unsigned p_addr) {
#pragma unroll
    for (int kk = 0; kk < VW_BN / 16; ++kk)
#pragma unroll
        for (int blk = 0; blk < NB; ++blk)  // keys 16 kk .. (two 8-key groups 1024 bytes apart), dims 64 (B0 + blk) ..
            wgmma_m64n72k16_ss<1>(acc[blk],
                                  wgmma_desc(nope_addr + (B0 + blk) * VW_K_BLOCK_BYTES + kk * 16 * 128, VW_K_BLOCK_BYTES, 1024),
                                  wgmma_desc(p_addr + kk * 32, 16, 1024), 1);
    wgmma_commit();
}

template <int NB>
__device__ __forceinline__ void vx_rescale(float (&acc)[NB][36], const float (&alpha)[2 * VX_J]) {
#pragma unroll
    for (int blk = 0; blk < NB; ++blk)
#pragma unroll
        for (int j = 0; j < VX_J; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) acc[blk][4 * j + 2 * h + e] *= alpha[2 * j + e];
}

// O^T times 1 / (row sum) into the staged output [row][dim] (row sums: the four warps' parts in `sums`)
template <int B0, int NB>
__device__ __forceinline__ void vx_stage(float* stage, const float* sums, const float (&acc)[NB][36], int key_lo,
                                         int col0) {
#pragma unroll
    for (int j = 0; j < VX_J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = 8 * j + col0 + e;
            const float l = sums[col] + sums[VX_ROWS + col] + sums[2 * VX_ROWS + col] + sums[3 * VX_ROWS + col];
            const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
            for (int blk = 0; blk < NB; ++blk)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    stage[col * VX_STAGE_LD + 64 * (B0 + blk) + key_lo + 8 * h] = acc[blk][4 * j + 2 * h + e] * inv;
        }
}
#endif  // VW_ENABLED

#if VW_ENABLED
// Distributed shared memory of a thread block cluster: `addr` (this block's shared window) in block `rank`
__device__ __forceinline__ unsigned vx_mapa(unsigned addr, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ float vx_ld_cluster(unsigned addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ float4 vx_ld_cluster4(unsigned addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
// every thread of every block of the cluster; shared-memory stores before it are visible to loads after it
__device__ __forceinline__ void vx_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned vx_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
#endif  // VW_ENABLED

// One block: row tile blockIdx.x (query rows [72 x, 72 x + 72)) of request blockIdx.z, key split blockIdx.y.
// CLUSTER > 1: the blocks of a cluster (1 x CLUSTER x 1: CLUSTER consecutive splits) merge their normalised
// outputs through distributed shared memory (each block CLUSTER-th of the dims), so one partial row leaves
// the cluster instead of CLUSTER, or, where the cluster holds all of the splits, the bf16 output itself.
template <int CLUSTER>
__device__ __forceinline__ void vx_attention(VA_KERNEL_PARAMS) {
#if VW_ENABLED
    extern __shared__ __align__(1024) unsigned char vx_smem[];
    VX_MARK(0);
    if (smem_addr(vx_smem) & 1023) __trap();  // the swizzle atoms need it, and there is no room to realign
    unsigned char* sq = vx_smem;
    unsigned char* snope = vx_smem + VX_OFF_NOPE;
    unsigned char* srope = vx_smem + VX_OFF_ROPE;
    unsigned char* sp = vx_smem + VX_OFF_P;
    float* sx = reinterpret_cast<float*>(vx_smem + VX_OFF_X);  // [3][72] maxima of warps 1..3; then [0] the new
                                                               // maxima, [1] the factors for warpgroup 1
    volatile unsigned* sflag = reinterpret_cast<unsigned*>(sx + 3 * VX_ROWS);  // 1: this tile moved the maxima

    const int b = blockIdx.z;
    const int split = blockIdx.y;
    const int rows = tokens * heads;
    const int row0 = blockIdx.x * VX_ROWS;
    const int tid = threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wtid = tid & 127;
    const int warp_in_wg = wtid >> 5, lane = tid & 31;
    const int prefix = prefix_lengths[b];
    const VwSplitKeys keys = vw_split_keys(prefix, tokens, split, tiles_per_split);
    const int kv_len = keys.kv_len, n_tiles = keys.n_tiles, key_begin = keys.key_begin, key_end = keys.key_end;

    const __nv_bfloat16* q_b = q + static_cast<long long>(b) * rows * VA_DIM;
    const __nv_bfloat16* kv_b = kv + static_cast<long long>(b) * kv_rows * VA_DIM;
    const unsigned* mask_b = mask_bits + static_cast<long long>(b) * tokens * mask_words;
    const unsigned sq_addr = smem_addr(sq), nope_addr = smem_addr(snope), rope_addr = smem_addr(srope),
                   p_addr = smem_addr(sp);

    // this thread's M indices (keys of S^T, dims of an O^T block): key_lo and key_lo + 8; its columns (query
    // rows of the block): 8 j + col0 + {0, 1}
    const int key_lo = warp_in_wg * 16 + (lane >> 2);
    const int col0 = 2 * (lane & 3);

    // Q (rows past M zero-filled: they compute like a row of token 0 and are never written), key tile 0
    for (int c = tid; c < VX_ROWS * (VA_DIM / 8); c += VW_THREADS) {
        const int r = c / (VA_DIM / 8), chunk = c % (VA_DIM / 8);
        const bool valid = row0 + r < rows;
        const __nv_bfloat16* src = q_b + (valid ? static_cast<long long>(row0 + r) * VA_DIM + chunk * 8 : 0);
        cp_async16(sq + vw_swizzled(r, chunk, VX_Q_BLOCK_BYTES), src, valid);
    }
    if (n_tiles > 0) vw_load_key_tile<VW_THREADS>(snope, srope, kv_b, key_begin, kv_len, tid);
    cp_async_commit();
    if (n_tiles > 1)  // tile 1's latent dims too (its rope dims once tile 0's are used), not waited for here
        vw_load_key_tile<VW_THREADS, true, false>(snope + VX_NOPE_BYTES, srope, kv_b, key_begin + VW_BN, kv_len, tid);
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();
    VX_MARK(1);

    float* stage = reinterpret_cast<float*>(vx_smem);               // at the end: the output, [72][516] floats
    float* sums = reinterpret_cast<float*>(vx_smem + VX_OFF_SUMS);  // at the end: [4][72] row sums, [72] maxima

    if (wg == 0) {
        float acc[VX_WG0_BLOCKS][36];
#pragma unroll
        for (int blk = 0; blk < VX_WG0_BLOCKS; ++blk)
#pragma unroll
            for (int i = 0; i < 36; ++i) acc[blk][i] = 0.f;
        float m_run[2 * VX_J], l_part[2 * VX_J];  // per column: running maximum (log2 domain), this thread's sum
#pragma unroll
        for (int k = 0; k < 2 * VX_J; ++k) m_run[k] = -INFINITY, l_part[k] = 0.f;

        // S^T of tile i in s: tree mask, the vote, (rarely) new maxima, P^T into shared memory, handed over
        auto softmax = [&](float (&s)[36], int i) {
            const int key0 = key_begin + i * VW_BN;
            if (key0 + VW_BN > min(prefix, key_end)) {  // tree keys or the split's end in this tile
#pragma unroll
                for (int j = 0; j < VX_J; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = key0 + key_lo + 8 * h;
                            float x = -INFINITY;
                            if (key < key_end) {
                                x = s[4 * j + 2 * h + e];
                                if (key >= prefix) {
                                    const int tok = min(row0 + 8 * j + col0 + e, rows - 1) / heads;
                                    const int jj = key - prefix;
                                    if (!((mask_b[static_cast<long long>(tok) * mask_words + (jj >> 5)] >> (jj & 31)) &
                                          1u))
                                        x = -INFINITY;
                                }
                            }
                            s[4 * j + 2 * h + e] = x;
                        }
            }
            bool need = false;  // a score above m + 8 (or a first finite score: m = -inf)
#pragma unroll
            for (int j = 0; j < VX_J; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float mu = fmaxf(m_run[2 * j + e], VX_M_FLOOR);
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        need |= !(fmaf(s[4 * j + 2 * h + e], scale_log2, -mu) <= VX_THRESHOLD);
                }
            const bool rare = vx_bar_or128<VX_BAR_WG0>(need);
            if (rare) {
                float t[2 * VX_J];  // this warp's maxima over its 16 keys, then the new maxima, then the factors
#pragma unroll
                for (int j = 0; j < VX_J; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float x = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
                        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
                        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
                        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
                        t[2 * j + e] = x;
                    }
                if (warp_in_wg > 0 && lane < 4)
#pragma unroll
                    for (int j = 0; j < VX_J; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) sx[(warp_in_wg - 1) * VX_ROWS + 8 * j + col0 + e] = t[2 * j + e];
                vx_bar_sync<VX_BAR_WG0, 128>();
                if (warp_in_wg == 0) {
#pragma unroll
                    for (int j = 0; j < VX_J; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int col = 8 * j + col0 + e;
                            const float x = fmaxf(fmaxf(t[2 * j + e], sx[col]),
                                                  fmaxf(sx[VX_ROWS + col], sx[2 * VX_ROWS + col]));
                            t[2 * j + e] = fmaxf(m_run[2 * j + e], x * scale_log2);
                        }
                    __syncwarp();
                    if (lane < 4)
#pragma unroll
                        for (int j = 0; j < VX_J; ++j)
#pragma unroll
                            for (int e = 0; e < 2; ++e) sx[8 * j + col0 + e] = t[2 * j + e];
                }
                vx_bar_sync<VX_BAR_WG0, 128>();
#pragma unroll
                for (int j = 0; j < VX_J; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float m_new = sx[8 * j + col0 + e];
                        const float alpha = m_new == -INFINITY ? 1.f : vw_exp2(m_run[2 * j + e] - m_new);
                        m_run[2 * j + e] = m_new;
                        l_part[2 * j + e] *= alpha;
                        t[2 * j + e] = alpha;
                    }
                vx_rescale(acc, t);
                if (warp_in_wg == 0 && lane < 4)
#pragma unroll
                    for (int j = 0; j < VX_J; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) sx[VX_ROWS + 8 * j + col0 + e] = t[2 * j + e];
            }
            if (wtid == 0) *sflag = rare ? 1u : 0u;
            // P = 2^(scale s - m) (masked scores are -inf: 0), bf16, into P^T [row][key] (128-byte swizzle)
#pragma unroll
            for (int j = 0; j < VX_J; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = 8 * j + col0 + e;
                    const float mu = fmaxf(m_run[2 * j + e], VX_M_FLOOR);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float pr = vw_exp2(fmaf(s[4 * j + 2 * h + e], scale_log2, -mu));
                        l_part[2 * j + e] += pr;
                        const int key = key_lo + 8 * h;
                        *reinterpret_cast<__nv_bfloat16*>(sp + col * 128 + (((key >> 3) ^ (col & 7)) << 4) +
                                                          (key & 7) * 2) = __float2bfloat16_rn(pr);
                    }
                }
            fence_proxy_async();
            vx_bar_sync<VX_BAR_PWRITTEN, 128>();
            vx_bar_arrive<VW_BAR_PREADY>();
        };

        if (n_tiles > 0) {  // tile 0: S^T (the rope buffer is free for tile 1 once its k-steps are done)
            float s[36];
            wgmma_fence();
            vx_issue_qk(s, sq_addr, nope_addr, rope_addr);
            wgmma_wait<1>();
            vx_bar_arrive_if<VW_BAR_KFREE>(n_tiles > 1);
            wgmma_wait<0>();
            wgmma_fence_regs(s);
            softmax(s, 0);
        }
        // Tile i: P V of tile i - 1, then S^T of tile i (rope k-steps first); once both of the first two groups
        // are done (wait<1>), tile i - 1's latent buffer and the rope buffer are free for tile i + 1.
        for (int i = 1; i < n_tiles; ++i) {
            const int buf = i & 1;
            float s[36];
            wgmma_fence();
            vx_issue_pv<0, VX_WG0_BLOCKS>(acc, nope_addr + (buf ^ 1) * VX_NOPE_BYTES, p_addr);
            cp_async_wait<0>();  // this thread's share of tile 1's latent dims (the prologue's); later: nothing
            fence_proxy_async();
            vw_bar_sync(VW_BAR_KREADY + buf);
            vx_issue_qk(s, sq_addr, nope_addr + buf * VX_NOPE_BYTES, rope_addr);
            wgmma_wait<1>();  // P V of tile i - 1 and the rope k-steps of tile i
            vx_bar_arrive_if<VW_BAR_KFREE>(i + 1 < n_tiles);
            wgmma_wait<0>();
            wgmma_fence_regs(s);
            vx_fence_regs(acc);
            vx_bar_sync<VW_BAR_PFREE>();  // warpgroup 1's P V of tile i - 1 is done: P^T and the factors free
            softmax(s, i);
        }
        if (n_tiles > 0) {
            wgmma_fence();
            vx_issue_pv<0, VX_WG0_BLOCKS>(acc, nope_addr + ((n_tiles - 1) & 1) * VX_NOPE_BYTES, p_addr);
        }
        wgmma_wait<0>();
        vx_fence_regs(acc);
#pragma unroll
        for (int k = 0; k < 2 * VX_J; ++k) {  // this warp's part of each row sum (lanes with the same lane % 4)
            float l = l_part[k];
            l += __shfl_xor_sync(0xffffffffu, l, 4);
            l += __shfl_xor_sync(0xffffffffu, l, 8);
            l += __shfl_xor_sync(0xffffffffu, l, 16);
            l_part[k] = l;
        }
        VX_MARK(2);
        vx_bar_sync<VX_BAR_END>();
        if (lane < 4)
#pragma unroll
            for (int j = 0; j < VX_J; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    sums[warp_in_wg * VX_ROWS + 8 * j + col0 + e] = l_part[2 * j + e];
                    if (warp_in_wg == 0) sums[4 * VX_ROWS + 8 * j + col0 + e] = m_run[2 * j + e];
                }
        vx_bar_sync<VX_BAR_SUMS>();
        vx_stage<0, VX_WG0_BLOCKS>(stage, sums, acc, key_lo, col0);
    } else {
        float acc[VX_WG1_BLOCKS][36];
#pragma unroll
        for (int blk = 0; blk < VX_WG1_BLOCKS; ++blk)
#pragma unroll
            for (int i = 0; i < 36; ++i) acc[blk][i] = 0.f;
        for (int i = 0; i < n_tiles; ++i) {
            const int buf = i & 1;
            wgmma_wait<0>();  // P V of tile i - 1
            vx_fence_regs(acc);
            vx_bar_arrive_if<VW_BAR_PFREE>(i > 0);
            const bool load = i + 1 < n_tiles;
            if (load) {  // tile i + 1: latent dims into tile i - 1's buffer (tile 1's came with tile 0), rope
                vx_bar_sync<VW_BAR_KFREE>();  // dims into the rope buffer
                unsigned char* latent = snope + (buf ^ 1) * VX_NOPE_BYTES;
                const int key0 = key_begin + (i + 1) * VW_BN;
                if (i > 0)
                    vw_load_key_tile<128>(latent, srope, kv_b, key0, kv_len, wtid);
                else
                    vw_load_key_tile<128, false, true>(latent, srope, kv_b, key0, kv_len, wtid);
                cp_async_commit();
            }
            vx_bar_sync<VW_BAR_PREADY>();
            if (*sflag) {
                float alpha[2 * VX_J];
#pragma unroll
                for (int j = 0; j < VX_J; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) alpha[2 * j + e] = sx[VX_ROWS + 8 * j + col0 + e];
                vx_rescale(acc, alpha);
            }
            wgmma_fence();
            vx_issue_pv<VX_WG0_BLOCKS, VX_WG1_BLOCKS>(acc, nope_addr + buf * VX_NOPE_BYTES, p_addr);
            if (load) {
                cp_async_wait<0>();
                fence_proxy_async();
                vw_bar_arrive(VW_BAR_KREADY + (buf ^ 1));
            }
        }
        wgmma_wait<0>();
        vx_fence_regs(acc);
        vx_bar_sync<VX_BAR_END>();
        vx_bar_sync<VX_BAR_SUMS>();
        vx_stage<VX_WG0_BLOCKS, VX_WG1_BLOCKS>(stage, sums, acc, key_lo, col0);
    }
    __syncthreads();
    VX_MARK(3);

    // ---- the staged rows out, coalesced: bf16 output, or the split's fp32 partial output and log-sum-exp
    const int valid_rows = min(VX_ROWS, rows - row0);
    if constexpr (CLUSTER > 1) {
        // each block's log-sum-exp per row next to its staged rows, then block `rank` merges dims
        // [rank * DIMS, rank * DIMS + DIMS) of every row over the cluster: partial (split / CLUSTER) of
        // splits / CLUSTER, or the output where that is one
        constexpr int DIMS = VA_DV / CLUSTER, CHUNKS = DIMS / 4;
        float* lse = sums + 5 * VX_ROWS;
        for (int r = tid; r < VX_ROWS; r += VW_THREADS) {
            const float l = sums[r] + sums[VX_ROWS + r] + sums[2 * VX_ROWS + r] + sums[3 * VX_ROWS + r];
            lse[r] = l > 0.f ? sums[4 * VX_ROWS + r] + log2f(l) : -INFINITY;
        }
        vx_cluster_sync();
        const unsigned rank = vx_cluster_rank();
        const unsigned stage_addr = smem_addr(stage), lse_addr = smem_addr(lse);
        const int partials = splits / CLUSTER;
        const long long prow0 = (static_cast<long long>(split / CLUSTER) * batch + b) * rows + row0;
        for (int c = tid; c < valid_rows * CHUNKS; c += VW_THREADS) {
            const int r = c / CHUNKS, d = rank * DIMS + (c % CHUNKS) * 4;
            float part_lse[CLUSTER], top = -INFINITY;
#pragma unroll
            for (int i = 0; i < CLUSTER; ++i) {
                part_lse[i] = vx_ld_cluster(vx_mapa(lse_addr + r * 4, i));
                top = fmaxf(top, part_lse[i]);
            }
            float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
            float weight = 0.f;
#pragma unroll
            for (int i = 0; i < CLUSTER; ++i) {
                const float w = part_lse[i] == -INFINITY ? 0.f : exp2f(part_lse[i] - top);
                const float4 x = vx_ld_cluster4(vx_mapa(stage_addr + (r * VX_STAGE_LD + d) * 4, i));
                sum.x += w * x.x;
                sum.y += w * x.y;
                sum.z += w * x.z;
                sum.w += w * x.w;
                weight += w;
            }
            const float inv = weight > 0.f ? 1.f / weight : 0.f;
            if (partials == 1) {
                __nv_bfloat162 v[2] = {__floats2bfloat162_rn(sum.x * inv, sum.y * inv),
                                       __floats2bfloat162_rn(sum.z * inv, sum.w * inv)};
                *reinterpret_cast<uint2*>(out + (static_cast<long long>(b) * rows + row0 + r) * VA_DV + d) =
                    *reinterpret_cast<const uint2*>(v);
            } else {
                *reinterpret_cast<float4*>(partial_out + (prow0 + r) * VA_DV + d) =
                    make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv);
                if (d == 0) partial_lse[prow0 + r] = weight > 0.f ? top + log2f(weight) : -INFINITY;
            }
        }
        vx_cluster_sync();  // no block leaves while the others read its shared memory
    } else if (splits == 1) {
        for (int c = tid; c < valid_rows * (VA_DV / 8); c += VW_THREADS) {
            const int r = c / (VA_DV / 8), d = (c % (VA_DV / 8)) * 8;
            const float4 lo = *reinterpret_cast<const float4*>(stage + r * VX_STAGE_LD + d);
            const float4 hi = *reinterpret_cast<const float4*>(stage + r * VX_STAGE_LD + d + 4);
            __nv_bfloat162 v[4] = {__floats2bfloat162_rn(lo.x, lo.y), __floats2bfloat162_rn(lo.z, lo.w),
                                   __floats2bfloat162_rn(hi.x, hi.y), __floats2bfloat162_rn(hi.z, hi.w)};
            *reinterpret_cast<uint4*>(out + (static_cast<long long>(b) * rows + row0 + r) * VA_DV + d) =
                *reinterpret_cast<const uint4*>(v);
        }
    } else {
        const long long prow0 = (static_cast<long long>(split) * batch + b) * rows + row0;
        for (int c = tid; c < valid_rows * (VA_DV / 4); c += VW_THREADS) {
            const int r = c / (VA_DV / 4), d = (c % (VA_DV / 4)) * 4;
            *reinterpret_cast<float4*>(partial_out + (prow0 + r) * VA_DV + d) =
                *reinterpret_cast<const float4*>(stage + r * VX_STAGE_LD + d);
        }
        for (int r = tid; r < valid_rows; r += VW_THREADS) {
            const float l = sums[r] + sums[VX_ROWS + r] + sums[2 * VX_ROWS + r] + sums[3 * VX_ROWS + r];
            partial_lse[prow0 + r] = l > 0.f ? sums[4 * VX_ROWS + r] + log2f(l) : -INFINITY;
        }
        if (split_counters != nullptr)  // the splits merge here, no combine launch
            va_merge_splits(partial_out, partial_lse, out, split_counters, stage, batch, rows, splits, row0,
                            valid_rows, b, split, tid, VW_THREADS);
    }
    VX_MARK(4);
#endif  // VW_ENABLED
}

// Grid (ceil(M / 72), splits, B). Every block runs the same code: a grid that mixed these blocks with
// ddtree_verify_attn_wgmma's (a 72-row last tile after 64-row ones) ran up to 1.45x slower than either kind
// alone on the H200 (two large bodies of code on neighbouring SMs).
extern "C" __global__ void __launch_bounds__(VW_THREADS, 1) ddtree_verify_attn_wgmma72(VA_KERNEL_PARAMS) {
    vx_attention<1>(VA_KERNEL_ARGS);
}

// The same with clusters of 2 consecutive splits merged on chip (splits even): at 2 splits (the plan's choice at
// budget 8 from batch 64, or 8 row tiles at batch 8) no partial rows and no combine launch. Clusters of 4 or
// 8 blocks of 227 KB did not fit 128 blocks in one wave on the H200 (about twice the time). Clusters need
// sm_90 (this kernel only runs on sm_90a).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define VX_SPLIT_CLUSTER(n) __cluster_dims__(1, n, 1)
#else
#define VX_SPLIT_CLUSTER(n)
#endif
extern "C" __global__ void VX_SPLIT_CLUSTER(2) __launch_bounds__(VW_THREADS, 1)
    ddtree_verify_attn_wgmma72_cluster2(VA_KERNEL_PARAMS) {
    vx_attention<2>(VA_KERNEL_ARGS);
}

// info[0]: shared memory one block of ddtree_verify_attn_wgmma72 needs; info[1]: 1 where it is compiled in for
// the running device (sm_90a code), else 0; info[2]: query rows a block takes.
extern "C" __global__ void ddtree_verify_attn_wgmma72_info(int* info) {
    info[0] = VX_SMEM_BYTES;
    info[1] = VW_ENABLED;
    info[2] = VX_ROWS;
}
