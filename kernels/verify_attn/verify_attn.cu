// Tree-verify attention for absorbed MLA (DeepSeek-V3 / Kimi K2.6 shapes), one layer, a whole batch.
//
// Per request b (budget N, Q = N + 1 tree tokens, H query heads):
//   q      [B, Q, H, 576] bf16   512 latent + 64 rope dims; row r = i * H + h is query (token i, head h)
//   kv     [B, T, 576]    bf16   one latent head shared by every query head: rows 0..S_b-1 the prefix, rows
//                                S_b..S_b+N the tree's tokens (node i at row S_b + i); V = the first 512 dims;
//                                rows from S_b + Q on are padding and are never read
//   prefix_lengths [B] int32     S_b
//   mask_bits [B, Q, W] uint32   W = ceil(Q / 32); bit (j % 32) of word j / 32 of row i: tree key j visible to
//                                tree query i (its ancestors and itself) -- the tree builder's packed output
//   out    [B, Q, H, 512] bf16
// Every query sees the whole prefix plus its visible tree keys. softmax(scale * q.k) with fp32 accumulation
// and an online softmax (log2 domain); P is rounded to bf16 for the P.V product, as flash attention does.
//
// Work decomposition: the Q*H query rows of a request form one [M = Q*H, 576] matrix against the request's
// keys (MLA's single KV head), so the block computes a 64-row x 32-key tile per step with tensor-core MMAs
// (mma.sync m16n8k16 bf16 -> fp32):
//   grid (ceil(M / 64), splits, B), 256 threads = 8 warps.
//   S = Q K^T: warp w takes rows 32*(w%2).., all 32 keys and a quarter of the 576 dims (9 k-steps of 16):
//     four independent partial sums per element (short MMA dependency chains, half the shared-memory
//     fragment traffic of a 16x16 warp tile), added by the softmax.
//   softmax: 4 threads per row add the partial sums, scale, apply the tree mask, update the running max /
//     sum and write P (bf16) and the rescale factor.
//   O += P V: warp w takes rows 16*(w%4).. and output dims 256*(w/4).. (32 n-tiles; 128 fp32 accumulators).
// (That is ddtree_verify_attn; ddtree_verify_attn_small is the same body at 32 rows x 16 keys, 87 KB of shared
// memory instead of 192 KB, for GPUs that allow a block less: va_attention_mma<BM, BN>.)
// The Q tile stays in shared memory; key tiles are double-buffered with cp.async (zero-filled past the
// request's S_b + Q keys, so padding -- NaN in the tests -- never enters the math). Warps whose 16 rows are
// all past M skip their MMAs. Splits divide a request's key tiles between blocks (split-KV / flash decoding)
// when there are too few row tiles to fill the GPU; each split then writes normalised partial outputs and
// its log-sum-exp (fp32 workspace), and `ddtree_verify_attn_combine` merges them into bf16 output -- or, on
// the Hopper path where the whole grid is resident at once and the splits are many, the attention kernel
// merges them itself (va_merge_splits, no second launch).
//
// No allocation, no host sync: a launch (or the pair of launches) is CUDA-graph capturable.

#include <cuda_bf16.h>
#include <stdint.h>

#define VA_DIM 576          // q/k head dim (512 latent + 64 rope)
#define VA_DV 512           // v head dim
#define VA_BM 64            // query rows per block
#define VA_BN 32            // keys per tile
#define VA_SMALL_BM 32      // the same kernel with smaller tiles, for GPUs that allow less shared memory a block
#define VA_SMALL_BN 16
#define VA_THREADS 256
#define VA_LDS (VA_DIM + 8) // shared row stride in bf16 elements (16-byte shift per row: conflict-free ldmatrix)

// The arguments of both attention kernels (ddtree_verify_attn and the Hopper path's ddtree_verify_attn_wgmma):
// the host launches either with the same list.
// split_counters: null, or (Hopper kernels, every block of the grid resident at once) two counters per
// (request, row tile) with which the splits merge their partial rows in the kernel (va_merge_splits); the
// mma.sync kernel ignores it and leaves the merge to ddtree_verify_attn_combine.
#define VA_KERNEL_PARAMS                                                                                  \
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kv,                           \
        const int* __restrict__ prefix_lengths, const unsigned* __restrict__ mask_bits,                  \
        __nv_bfloat16* __restrict__ out, float* __restrict__ partial_out, float* __restrict__ partial_lse, \
        unsigned* __restrict__ split_counters, int batch, int tokens, int heads, long long kv_rows,        \
        int mask_words, int splits, int tiles_per_split, float scale_log2, const void* __restrict__ kv_map
// The same arguments passed on (the 72-row kernels' bodies are a device function of them)
#define VA_KERNEL_ARGS                                                                                      \
    q, kv, prefix_lengths, mask_bits, out, partial_out, partial_lse, split_counters, batch, tokens, heads,   \
        kv_rows, mask_words, splits, tiles_per_split, scale_log2, kv_map

// BM query rows, key tiles of BN keys. P and the S partials have rows of BN + 8 (conflict-free float2 stores)
template <int BM, int BN>
struct VaShared {
    static constexpr int LDP = BN + 8;
    __nv_bfloat16 q[BM * VA_LDS];
    __nv_bfloat16 k[2][BN * VA_LDS];
    float s[4][BM * LDP];  // partial S of the four dim quarters
    __nv_bfloat16 p[BM * LDP];
    float alpha[BM];
    float row_max[BM];
    float row_sum[BM];
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Keys [key0, key0 + BN) of request b into a shared tile; keys at or past kv_len read as zeros.
template <int BN>
__device__ __forceinline__ void load_key_tile(__nv_bfloat16* dst, const __nv_bfloat16* kv_b, int key0,
                                              int kv_len) {
    // chunk c = threadIdx.x + i * VA_THREADS of the tile's 16-byte chunks: row c / 72, column (c % 72) * 8;
    // stepping by VA_THREADS = 3 rows + 40 chunks keeps the index arithmetic to adds
    static_assert(VA_THREADS == 3 * (VA_DIM / 8) + 40, "load_key_tile's stepping assumes 256 threads");
    int row = threadIdx.x / (VA_DIM / 8), col = (threadIdx.x % (VA_DIM / 8)) * 8;
    while (row < BN) {
        const int key = key0 + row;
        const bool valid = key < kv_len;
        const __nv_bfloat16* src = kv_b + (valid ? static_cast<long long>(key) * VA_DIM + col : 0);
        cp_async16(dst + row * VA_LDS + col, src, valid);
        row += 3;
        col += 40 * 8;
        if (col >= VA_DIM) {
            col -= VA_DIM;
            row += 1;
        }
    }
}

// The mma.sync kernel's body for BM query rows (64 or 32) and key tiles of BN keys (32 or 16); the warps'
// shares of each phase follow from them (64 x 32: as the header says; 32 x 16: S warps take 16 rows and 16
// keys, the softmax 4 keys a thread on the first 128 threads, P V 16 rows and a quarter of the dims).
template <int BM, int BN>
__device__ __forceinline__ void va_attention_mma(VA_KERNEL_PARAMS) {
    static_assert((BM == 64 || BM == 32) && (BN == 32 || BN == 16), "va_attention_mma: 64 or 32 rows, 32 or 16 keys");
    constexpr int LDP = VaShared<BM, BN>::LDP;
    constexpr int RW = BM / 2, MS = RW / 16;  // S phase: rows a warp (two row halves), its m16 tiles
    constexpr int NS = BN / 8;                // S phase: n8 tiles of keys
    constexpr int KPT = BN / 4;               // softmax: keys a thread (4 threads a row)
    constexpr int RG = BM / 16, DW = VA_DV * RG / 8, NT = DW / 8;  // P V: row groups, dims a warp, its n8 tiles
    extern __shared__ __align__(16) unsigned char va_smem_raw[];
    VaShared<BM, BN>& sm = *reinterpret_cast<VaShared<BM, BN>*>(va_smem_raw);

    const int b = blockIdx.z;
    const int split = blockIdx.y;
    const int rows = tokens * heads;  // M
    const int row0 = blockIdx.x * BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int prefix = prefix_lengths[b];
    const int kv_len = prefix + tokens;
    const int tiles = (kv_len + BN - 1) / BN;
    const int tile_begin = split * tiles_per_split;
    const int tile_end = min(tiles, tile_begin + tiles_per_split);

    const __nv_bfloat16* q_b = q + static_cast<long long>(b) * rows * VA_DIM;
    const __nv_bfloat16* kv_b = kv + static_cast<long long>(b) * kv_rows * VA_DIM;
    const unsigned* mask_b = mask_bits + static_cast<long long>(b) * tokens * mask_words;

    // Q tile (rows past M zero-filled), first key tile: one cp.async group
    {
        constexpr int chunks_per_row = VA_DIM / 8;
        for (int c = tid; c < BM * chunks_per_row; c += VA_THREADS) {
            int r = c / chunks_per_row, col = (c % chunks_per_row) * 8;
            bool valid = row0 + r < rows;
            const __nv_bfloat16* src = q_b + (valid ? static_cast<long long>(row0 + r) * VA_DIM + col : 0);
            cp_async16(sm.q + r * VA_LDS + col, src, valid);
        }
    }
    if (tile_begin < tile_end) load_key_tile<BN>(sm.k[0], kv_b, tile_begin * BN, kv_len);
    cp_async_commit();

    // roles
    const int rh = warp & 1, ks = warp >> 1;  // S phase: row half, quarter of the dims
    const bool a_live = row0 + rh * RW < rows;
    const int rg = warp % RG, dgrp = warp / RG;  // PV phase: 16-row group, output dims [DW dgrp, DW dgrp + DW)
    const bool rows_live = row0 + rg * 16 < rows;
    const int srow = tid >> 2, spart = tid & 3;  // softmax: row and quarter of the keys (rows < BM)
    float m_run = -INFINITY, l_run = 0.f;

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

    for (int t = tile_begin; t < tile_end; ++t) {
        const int buf = (t - tile_begin) & 1;
        __syncthreads();  // the previous tile's P.V is done: its key buffer and P may be overwritten
        if (t + 1 < tile_end) load_key_tile<BN>(sm.k[buf ^ 1], kv_b, (t + 1) * BN, kv_len);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const __nv_bfloat16* ktile = sm.k[buf];
        const int key0 = t * BN;

        // ---- S = Q K^T, split over the 576 dims: warp w takes rows RW*(w%2).., all BN keys, and dims
        // 144*(w/2)..; the four partial sums go to shared memory and the softmax adds them
        if (a_live) {
            float s[MS][NS][4];
#pragma unroll
            for (int m = 0; m < MS; ++m)
#pragma unroll
                for (int n = 0; n < NS; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.f;
            const __nv_bfloat16* a_base = sm.q + (rh * RW + (lane & 7) + ((lane >> 3) & 1) * 8) * VA_LDS +
                                          ks * (VA_DIM / 4) + (lane >> 4) * 8;
            const __nv_bfloat16* b_base =
                ktile + ((lane & 7) + (lane >> 4) * 8) * VA_LDS + ks * (VA_DIM / 4) + ((lane >> 3) & 1) * 8;
#pragma unroll 3
            for (int kb = 0; kb < VA_DIM / 64; ++kb) {
                unsigned a[MS][4], bk[NS / 2][4];  // A: 16 rows each; B: 16 keys each (two n8 tiles)
#pragma unroll
                for (int m = 0; m < MS; ++m) ldmatrix_x4(a[m], a_base + m * 16 * VA_LDS + kb * 16);
#pragma unroll
                for (int j = 0; j < NS / 2; ++j) ldmatrix_x4(bk[j], b_base + j * 16 * VA_LDS + kb * 16);
#pragma unroll
                for (int m = 0; m < MS; ++m)
#pragma unroll
                    for (int j = 0; j < NS / 2; ++j) {
                        mma_bf16(s[m][2 * j], a[m], bk[j][0], bk[j][1]);
                        mma_bf16(s[m][2 * j + 1], a[m], bk[j][2], bk[j][3]);
                    }
            }
            float* sp = &sm.s[ks][0];
#pragma unroll
            for (int m = 0; m < MS; ++m)
#pragma unroll
                for (int n = 0; n < NS; ++n)
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi)
                        *reinterpret_cast<float2*>(sp + (rh * RW + m * 16 + g + hi * 8) * LDP + n * 8 + tig * 2) =
                            make_float2(s[m][n][2 * hi], s[m][n][2 * hi + 1]);
        }
        __syncthreads();

        // ---- online softmax: 4 threads per row (the first 4 BM threads), KPT keys each: add the partial
        // sums, scale, mask
        if (BM == 64 || srow < BM) {  // whole warps
            float v[KPT];
            float tmax = -INFINITY;
            const bool live = row0 + (srow & ~15) < rows;
            const int row = row0 + srow;
            const int token = row < rows ? row / heads : 0;
            float sum4[KPT];
#pragma unroll
            for (int e = 0; e < KPT; ++e) sum4[e] = 0.f;
            if (live) {
#pragma unroll
                for (int part = 0; part < 4; ++part)
#pragma unroll
                    for (int c = 0; c < KPT / 4; ++c) {
                        const float4 x =
                            *reinterpret_cast<const float4*>(&sm.s[part][srow * LDP + spart * KPT + 4 * c]);
                        sum4[4 * c + 0] += x.x;
                        sum4[4 * c + 1] += x.y;
                        sum4[4 * c + 2] += x.z;
                        sum4[4 * c + 3] += x.w;
                    }
            }
#pragma unroll
            for (int e = 0; e < KPT; ++e) {
                const int kcol = spart * KPT + e;
                const int key = key0 + kcol;
                float x = -INFINITY;
                if (live && key < kv_len) {
                    x = sum4[e] * scale_log2;
                    if (key >= prefix) {
                        const int j = key - prefix;
                        const bool visible =
                            row < rows &&
                            ((mask_b[static_cast<long long>(token) * mask_words + (j >> 5)] >> (j & 31)) & 1u);
                        if (!visible) x = -INFINITY;
                    }
                }
                v[e] = x;
                tmax = fmaxf(tmax, v[e]);
            }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
            const float m_new = fmaxf(m_run, tmax);
            float alpha = 1.f, sum = 0.f;
            __align__(16) __nv_bfloat162 p2[KPT / 2];
            if (m_new == -INFINITY) {
#pragma unroll
                for (int e = 0; e < KPT / 2; ++e) p2[e] = __floats2bfloat162_rn(0.f, 0.f);
            } else {
                alpha = exp2f(m_run - m_new);
                float p[KPT];
#pragma unroll
                for (int e = 0; e < KPT; ++e) {
                    p[e] = exp2f(v[e] - m_new);
                    sum += p[e];
                }
#pragma unroll
                for (int e = 0; e < KPT / 2; ++e) p2[e] = __floats2bfloat162_rn(p[2 * e], p[2 * e + 1]);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l_run = l_run * alpha + sum;
            m_run = m_new;
            if constexpr (KPT == 8)
                *reinterpret_cast<uint4*>(sm.p + srow * LDP + spart * KPT) = *reinterpret_cast<uint4*>(p2);
            else
                *reinterpret_cast<uint2*>(sm.p + srow * LDP + spart * KPT) = *reinterpret_cast<uint2*>(p2);
            if (spart == 0) sm.alpha[srow] = alpha;
        }
        __syncthreads();

        // ---- O = O * alpha + P V for rows rg*16.., dims DW*dgrp..
        if (rows_live) {
            const float alpha_lo = sm.alpha[rg * 16 + g], alpha_hi = sm.alpha[rg * 16 + g + 8];
            // rescale only when a running max of the warp's rows moved (alpha is exactly 1 otherwise)
            if (__any_sync(0xffffffffu, alpha_lo != 1.f || alpha_hi != 1.f)) {
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    acc[n][0] *= alpha_lo;
                    acc[n][1] *= alpha_lo;
                    acc[n][2] *= alpha_hi;
                    acc[n][3] *= alpha_hi;
                }
            }
#pragma unroll
            for (int kb = 0; kb < BN / 16; ++kb) {
                unsigned a[4];
                ldmatrix_x4(a, sm.p + (rg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDP + kb * 16 +
                                   (lane >> 4) * 8);
                const __nv_bfloat16* v_base =
                    ktile + (kb * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * VA_LDS + dgrp * DW + (lane >> 4) * 8;
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    unsigned bb[4];
                    ldmatrix_x4_trans(bb, v_base + np * 16);
                    mma_bf16(acc[2 * np], a, bb[0], bb[1]);
                    mma_bf16(acc[2 * np + 1], a, bb[2], bb[3]);
                }
            }
        }
    }

    // ---- epilogue: row statistics to shared memory, then each warp writes its accumulators
    cp_async_wait<0>();
    __syncthreads();
    if (spart == 0 && (BM == 64 || srow < BM)) {
        sm.row_max[srow] = m_run;
        sm.row_sum[srow] = l_run;
    }
    __syncthreads();
    if (!rows_live) return;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int r = rg * 16 + g + hi * 8;
        const int row = row0 + r;
        if (row >= rows) continue;
        const float l = sm.row_sum[r];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        if (splits == 1) {
            __nv_bfloat16* o = out + (static_cast<long long>(b) * rows + row) * VA_DV + dgrp * DW + tig * 2;
#pragma unroll
            for (int n = 0; n < NT; ++n)
                *reinterpret_cast<__nv_bfloat162*>(o + n * 8) =
                    __floats2bfloat162_rn(acc[n][hi * 2] * inv, acc[n][hi * 2 + 1] * inv);
        } else {
            const long long prow = (static_cast<long long>(split) * batch + b) * rows + row;
            float* o = partial_out + prow * VA_DV + dgrp * DW + tig * 2;
#pragma unroll
            for (int n = 0; n < NT; ++n)
                *reinterpret_cast<float2*>(o + n * 8) = make_float2(acc[n][hi * 2] * inv, acc[n][hi * 2 + 1] * inv);
            if (dgrp == 0 && tig == 0) partial_lse[prow] = l > 0.f ? sm.row_max[r] + log2f(l) : -INFINITY;
        }
    }
}

extern "C" __global__ void __launch_bounds__(VA_THREADS, 1) ddtree_verify_attn(VA_KERNEL_PARAMS) {
    va_attention_mma<VA_BM, VA_BN>(VA_KERNEL_ARGS);
}

// The same with 32-row tiles and 16-key tiles: 87 KB of shared memory a block instead of 192 KB, for GPUs
// that allow less than the latter (sm_120 parts such as the RTX PRO 6000: 99 KB).
extern "C" __global__ void __launch_bounds__(VA_THREADS, 1) ddtree_verify_attn_small(VA_KERNEL_PARAMS) {
    va_attention_mma<VA_SMALL_BM, VA_SMALL_BN>(VA_KERNEL_ARGS);
}

// Merge the splits' partial outputs: out = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max).
// grid (ceil(M / rows_per_block), B), VA_COMBINE_THREADS threads; rows_per_block (1, 2, 4 or 8, the host's
// choice from the split count) rows a block, 8 / rows_per_block warps a row. Warp w of a row merges splits
// w, w + warps, ... (lane l holds the float4s l, l + 32, l + 64, l + 96 of the 512 dims), VA_COMBINE_UNROLL
// splits at a time: their log-sum-exps and partial rows are all loaded before any is used (one memory
// latency a group, not one a split), and folded into a running max, sum and weighted rows (online, as the
// attention's softmax). The warps of a row then meet through shared memory. Few splits and many rows (batch
// 8 to 64): one warp a row, eight rows a block; many splits and few rows (batch 1): eight warps a row.
#define VA_COMBINE_THREADS 256
#define VA_COMBINE_WARPS (VA_COMBINE_THREADS / 32)
#define VA_COMBINE_UNROLL 4
extern "C" __global__ void __launch_bounds__(VA_COMBINE_THREADS)
    ddtree_verify_attn_combine(const float* __restrict__ partial_out, const float* __restrict__ partial_lse,
                               __nv_bfloat16* __restrict__ out, int batch, int rows, int splits, int rows_per_block) {
    __shared__ float4 s_sum[VA_COMBINE_WARPS][VA_DV / 4];
    __shared__ float s_max[VA_COMBINE_WARPS], s_weight[VA_COMBINE_WARPS];
    const int warps = VA_COMBINE_WARPS / rows_per_block;  // a row's warps
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * rows_per_block + warp / warps, b = blockIdx.y, first = warp % warps;
    const long long stride = static_cast<long long>(batch) * rows;  // between splits, in rows
    const long long base = static_cast<long long>(b) * rows + row;
    float m = -INFINITY, weight = 0.f;
    float4 sum[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) sum[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = first; row < rows && s0 < splits; s0 += VA_COMBINE_UNROLL * warps) {
        float lse[VA_COMBINE_UNROLL];
        float4 o[VA_COMBINE_UNROLL][4];
#pragma unroll
        for (int u = 0; u < VA_COMBINE_UNROLL; ++u) {
            const int s = s0 + u * warps;
            lse[u] = s < splits ? partial_lse[s * stride + base] : -INFINITY;
            const float4* src = reinterpret_cast<const float4*>(partial_out + (s * stride + base) * VA_DV) + lane;
#pragma unroll
            for (int j = 0; j < 4; ++j) o[u][j] = s < splits ? src[32 * j] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float m_new = m;
#pragma unroll
        for (int u = 0; u < VA_COMBINE_UNROLL; ++u) m_new = fmaxf(m_new, lse[u]);
        if (m_new == -INFINITY) continue;  // only empty splits so far (sum 0, log-sum-exp -inf)
        const float f = exp2f(m - m_new);  // 0 while m is -inf
        weight *= f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            sum[j].x *= f;
            sum[j].y *= f;
            sum[j].z *= f;
            sum[j].w *= f;
        }
#pragma unroll
        for (int u = 0; u < VA_COMBINE_UNROLL; ++u) {
            if (lse[u] == -INFINITY) continue;  // an empty split's rows are never read into the sum
            const float w = exp2f(lse[u] - m_new);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                sum[j].x += w * o[u][j].x;
                sum[j].y += w * o[u][j].y;
                sum[j].z += w * o[u][j].z;
                sum[j].w += w * o[u][j].w;
            }
            weight += w;
        }
        m = m_new;
    }
    if (warps == 1) {  // the warp holds its row
        if (row >= rows) return;
        const float inv = weight > 0.f ? 1.f / weight : 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            __nv_bfloat16* o = out + base * VA_DV + (32 * j + lane) * 4;
            *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(sum[j].x * inv, sum[j].y * inv);
            *reinterpret_cast<__nv_bfloat162*>(o + 2) = __floats2bfloat162_rn(sum[j].z * inv, sum[j].w * inv);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) s_sum[warp][32 * j + lane] = sum[j];
    if (lane == 0) {
        s_max[warp] = m;
        s_weight[warp] = weight;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows_per_block * (VA_DV / 4); i += VA_COMBINE_THREADS) {
        const int r = i / (VA_DV / 4), c = i % (VA_DV / 4), w0 = r * warps;
        const int out_row = blockIdx.x * rows_per_block + r;
        if (out_row >= rows) continue;
        float mx = -INFINITY;
        for (int w = 0; w < warps; ++w) mx = fmaxf(mx, s_max[w0 + w]);
        float4 total = make_float4(0.f, 0.f, 0.f, 0.f);
        float wsum = 0.f;
        for (int w = 0; w < warps; ++w) {
            if (s_max[w0 + w] == -INFINITY) continue;  // a warp whose splits were all empty
            const float f = exp2f(s_max[w0 + w] - mx);
            const float4 x = s_sum[w0 + w][c];
            total.x += f * x.x;
            total.y += f * x.y;
            total.z += f * x.z;
            total.w += f * x.w;
            wsum += f * s_weight[w0 + w];
        }
        const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
        __nv_bfloat16* o = out + (static_cast<long long>(b) * rows + out_row) * VA_DV + c * 4;
        *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(total.x * inv, total.y * inv);
        *reinterpret_cast<__nv_bfloat162*>(o + 2) = __floats2bfloat162_rn(total.z * inv, total.w * inv);
    }
}

// info[0]: the combine's threads a block; info[1]: the most rows a block it merges (rows_per_block: 1, 2, 4, 8)
extern "C" __global__ void ddtree_verify_attn_combine_threads(int* info) {
    info[0] = VA_COMBINE_THREADS;
    info[1] = VA_COMBINE_WARPS;
}

// Shared memory one block of ddtree_verify_attn needs (the loader sets the dynamic size from this).
// info[0..2]: ddtree_verify_attn's bytes, rows a block, keys a tile; info[3..5]: ddtree_verify_attn_small's
extern "C" __global__ void ddtree_verify_attn_smem_bytes(int* info) {
    info[0] = static_cast<int>(sizeof(VaShared<VA_BM, VA_BN>));
    info[1] = VA_BM;
    info[2] = VA_BN;
    info[3] = static_cast<int>(sizeof(VaShared<VA_SMALL_BM, VA_SMALL_BN>));
    info[4] = VA_SMALL_BM;
    info[5] = VA_SMALL_BN;
}

// ---- the split merge inside the attention kernel (Hopper kernels, split_counters not null)
//
// Where every block of the grid is resident at once (the host passes split_counters only for grids of at most
// one block per SM), the splits of a (request, row tile) need no combine launch: after a block has written its
// partial rows and log-sum-exps, it counts itself in at the tile's counter and waits until every split has
// (thread 0 spins on an acquire load; the writes before the count are released by a fence after the block's
// barrier), then merges its share of the tile's rows -- chunk range `split` of the valid rows' float4s, as
// ddtree_verify_attn_combine would, each chunk's sum over the splits in a fixed order -- into the bf16 output.
// The last block of the tile to finish resets both counters, so the next call (stream order) starts from
// zero with no memset. `scratch`: shared memory free by now, for the rows' weights and the threads' sums.
__device__ __forceinline__ unsigned va_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

#define VA_MERGE_CHUNKS 4  // chunks a thread merges at once where a block has more chunks than threads
__device__ __noinline__ void va_merge_splits(const float* __restrict__ partial_out,
                                             const float* __restrict__ partial_lse, __nv_bfloat16* __restrict__ out,
                                             unsigned* __restrict__ split_counters, float* scratch, int batch,
                                             int rows, int splits, int row0, int valid_rows, int b, int split,
                                             int tid, int nthreads) {
    unsigned* arrived = split_counters + 2 * (static_cast<long long>(b) * gridDim.x + blockIdx.x);
    __syncthreads();  // every thread's partial rows are written
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(arrived, 1u) + 1 < static_cast<unsigned>(splits))  // the last to arrive need not wait
            while (va_ld_acquire(arrived) < static_cast<unsigned>(splits)) __nanosleep(64);
        __threadfence();
    }
    __syncthreads();

    constexpr int CPR = VA_DV / 4;  // float4 chunks a row
    const int chunks = valid_rows * CPR, per = (chunks + splits - 1) / splits;
    const int begin = min(chunks, split * per), end = min(chunks, begin + per), n = end - begin;
    const long long stride = static_cast<long long>(batch) * rows;  // between splits, in rows
    const long long base = static_cast<long long>(b) * rows + row0;
    if (n > 0) {
        const int r_first = begin / CPR, n_rows = (end - 1) / CPR - r_first + 1;
        // the weights of this block's rows: w[i][s] = 2^(lse_s - max) / sum over the splits
        float* w = scratch;
        for (int x = tid; x < n_rows * splits; x += nthreads)
            w[x] = __ldcg(partial_lse + (x % splits) * stride + base + r_first + x / splits);
        __syncthreads();
        const int warp = tid >> 5, lane = tid & 31;
        for (int i = warp; i < n_rows; i += nthreads >> 5) {
            float* row_w = w + i * splits;
            float top = -INFINITY;
            for (int s = lane; s < splits; s += 32) top = fmaxf(top, row_w[s]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
            float total = 0.f;
            for (int s = lane; s < splits; s += 32) {
                const float e = row_w[s] == -INFINITY ? 0.f : exp2f(row_w[s] - top);
                row_w[s] = e;
                total += e;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
            const float inv = total > 0.f ? 1.f / total : 0.f;
            __syncwarp();
            for (int s = lane; s < splits; s += 32) row_w[s] *= inv;
        }
        __syncthreads();
        // k threads a chunk where there are fewer chunks than threads, each over every k-th split (their sums
        // added in order after); else every thread takes up to VA_MERGE_CHUNKS chunks at a time, nthreads
        // apart, over every split: either way each step has several independent loads in flight
        const int k = max(1, nthreads / n);
        float4* sums = reinterpret_cast<float4*>(w + ((n_rows * splits + 3) & ~3));
        auto store = [&](int c, const float4& acc) {
            __nv_bfloat162 v[2] = {__floats2bfloat162_rn(acc.x, acc.y), __floats2bfloat162_rn(acc.z, acc.w)};
            *reinterpret_cast<uint2*>(out + (base + c / CPR) * VA_DV + (c % CPR) * 4) =
                *reinterpret_cast<const uint2*>(v);
        };
        if (k > 1) {
            if (tid < n * k) {
                const int c = begin + tid % n, j = tid / n, r = c / CPR;
                const float* row_w = w + (r - r_first) * splits;
                const float4* src = reinterpret_cast<const float4*>(partial_out + (base + r) * VA_DV) + c % CPR;
                float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
                for (int s = j; s < splits; s += k) {
                    const float ws = row_w[s];
                    const float4 x = __ldcg(src + s * stride * CPR);
                    acc.x += ws * x.x;
                    acc.y += ws * x.y;
                    acc.z += ws * x.z;
                    acc.w += ws * x.w;
                }
                sums[tid] = acc;  // [j][chunk]
            }
            __syncthreads();
            for (int t = tid; t < n; t += nthreads) {
                float4 acc = sums[t];
                for (int j = 1; j < k; ++j) {
                    const float4 x = sums[j * n + t];
                    acc.x += x.x;
                    acc.y += x.y;
                    acc.z += x.z;
                    acc.w += x.w;
                }
                store(begin + t, acc);
            }
        } else {
            for (int t0 = 0; t0 < n; t0 += VA_MERGE_CHUNKS * nthreads) {
                float4 acc[VA_MERGE_CHUNKS];
                const float4* src[VA_MERGE_CHUNKS];
                const float* row_w[VA_MERGE_CHUNKS];
#pragma unroll
                for (int i = 0; i < VA_MERGE_CHUNKS; ++i) {
                    const int t = min(n - 1, t0 + tid + i * nthreads), c = begin + t, r = c / CPR;
                    acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
                    src[i] = reinterpret_cast<const float4*>(partial_out + (base + r) * VA_DV) + c % CPR;
                    row_w[i] = w + (r - r_first) * splits;
                }
#pragma unroll 2
                for (int s = 0; s < splits; ++s) {
#pragma unroll
                    for (int i = 0; i < VA_MERGE_CHUNKS; ++i) {
                        const float ws = row_w[i][s];
                        const float4 x = __ldcg(src[i] + s * stride * CPR);
                        acc[i].x += ws * x.x;
                        acc[i].y += ws * x.y;
                        acc[i].z += ws * x.z;
                        acc[i].w += ws * x.w;
                    }
                }
#pragma unroll
                for (int i = 0; i < VA_MERGE_CHUNKS; ++i)
                    if (t0 + tid + i * nthreads < n) store(begin + t0 + tid + i * nthreads, acc[i]);
            }
        }
    }
    __syncthreads();  // every read of the tile's partial rows by this block is done
    if (tid == 0 && atomicAdd(arrived + 1, 1u) == static_cast<unsigned>(splits) - 1) {
        atomicExch(arrived, 0u);  // every block of the tile has passed its wait: ready for the next call
        atomicExch(arrived + 1, 0u);
    }
}

// The Hopper path (wgmma, sm_90a): same arguments, grid and workspace as ddtree_verify_attn; and its kernel
// with row tiles of 72 (grid (ceil(M / 72), splits, B)), which the plan takes where that is estimated faster.
#include "verify_attn_wgmma.cuh"
#include "verify_attn_wgmma72.cuh"
#include "verify_attn_seesaw.cuh"
