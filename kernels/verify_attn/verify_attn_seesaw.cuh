// Hopper (sm_90a) verify attention with "seesaw" scheduling: ddtree_verify_attn_seesaw. Included by
// verify_attn.cu after verify_attn_wgmma.cuh (whose wgmma helpers it uses); same arguments, grid, split-KV
// workspace, combine and in-kernel split merge as ddtree_verify_attn_wgmma, key tiles of 64 keys, plus
// kv_map: a TMA tensor map of kv seen as [B * T rows, 576] bf16, boxes of 64 rows x 64 dims, 128-byte
// swizzle (ops/attention.py encodes it).
//
// Block: 64 query rows, 256 threads = two warpgroups that do the same kinds of work on alternate key tiles
// (the division of labour of FlashMLA's Hopper decode kernel, DeepSeek's "seesaw"):
//   - O = [64 x 512] is split by output dims: warpgroup 0 holds O[:, 0:256], warpgroup 1 O[:, 256:512].
//   - Tiles come in pairs (t0, t1) in two key buffers. Warpgroup 0 computes S of t0, warpgroup 1 S of t1
//     (36 k-steps each; P1 then goes to buffer 1's rope block, which S of t1 no longer needs).
//   - Warpgroup 0: softmax of t0 against the running row max m (shared memory), O_L += P0 V0_L (P0 from
//     registers). Warpgroup 1 then does the softmax of t1 against the m that t0 left, O_R += P1 V1_R.
//     Warpgroup 0 rescales P0 to t1's max and hands it over (shared memory): O_R += P0 V0_R by warpgroup 1;
//     warpgroup 1 hands P1 over: O_L += P1 V1_L by warpgroup 0. Each warpgroup's softmax runs while the other
//     one's MMAs keep the tensor cores busy.
//   - Loads: TMA, one thread a warpgroup, one 64 x 64 box (8 KB) and one mbarrier per 64-dim block of a
//     tile. A block is loaded again as soon as its last reader is done (dims 0-255 after O_L's MMA, the rest
//     after O_R's), and S waits for each block separately, so the next tile's S starts before all of it has
//     landed.
// The tree mask, the scale (log2 domain) and the split outputs are those of the other kernels. The running
// max starts at -1e30 (finite), so a row with no visible key in a tile never forms inf - inf. The last
// tile of a request may reach past its keys into padding (NaN in the tests): those rows of V are zeroed in
// shared memory before the P V that reads them (P is 0 there, but 0 * NaN is NaN).
// Key tiles that lie wholly in the tree and that no row of the block sees (the tree mask hides them from
// all its tokens) are skipped: the prologue ORs each token's mask window of every such tile into a bitmap,
// and the loop walks the kept tiles only (vs_tile maps the loop's tile index to the split's).
// Shared memory: Q 72 KB, two key tiles 2 x 72 KB (buffer 1's rope block holds P1), P0 8 KB, row state 1 KB,
// 36 mbarriers: 226 KB, one block per SM.
// ddtree_verify_attn_seesaw_multicast2 to 5: the same body (vs_attention<MC>) in clusters of a request's row
// tiles, each key tile copied once for all of them (vs_load). Measured 1.3-2.7x slower than the unclustered
// kernel on the same grids (H100; docs/verify_attention.md): no plan takes them.

#define VS_BM 64
#define VS_BN 64
#define VS_THREADS 256
#define VS_DIM_BLOCKS 9
#define VS_BLOCK_BYTES 8192                              // one 64-dim block of a 64-row tile
#define VS_TILE_BYTES (VS_DIM_BLOCKS * VS_BLOCK_BYTES)   // 73728: Q, or one key tile
#define VS_OFF_K (VS_TILE_BYTES)                         // two key tiles
#define VS_OFF_P0 (3 * VS_TILE_BYTES)                    // P0, 8 KB
#define VS_OFF_ROWS (VS_OFF_P0 + VS_BLOCK_BYTES)         // m[64], scale0[64], scale1[64], l[2][64] floats
#define VS_OFF_BARS (VS_OFF_ROWS + 5 * 64 * 4)           // mbarriers [2 buffers][9 blocks]: block landed
#define VS_EMPTY_DELTA (2 * VS_DIM_BLOCKS * 8)            // + this: [2][9] block released by every CTA (clusters)
#define VS_OFF_BLK (VS_OFF_BARS + 2 * VS_EMPTY_DELTA)      // VsBlock: the block's scalars
#define VS_OFF_TREE (VS_OFF_BLK + 128)                    // the kept tree tiles' indices, 64 bytes
#define VS_SMEM_BYTES (VS_OFF_TREE + 64)
#define VS_M_INIT (-1e30f)
#ifndef VS_SKIP_TREE
#define VS_SKIP_TREE 1  // skip the tree tiles no row of the block sees (0: every tile, for measurements)
#endif

// named barriers (0 is __syncthreads'): producer/consumer pairs between the warpgroups, and one a warpgroup
#define VS_BAR_SCALE0 1  // warpgroup 0: m and scale0 of t0 written
#define VS_BAR_SCALE1 2  // warpgroup 1: m and scale1 of t1 written
#define VS_BAR_P0 3      // warpgroup 0: P0 (rescaled to t1's max) in shared memory
#define VS_BAR_P1 4      // warpgroup 1: P1 in shared memory, O_R += P0 V0_R issued
#define VS_BAR_WG 5      // + warpgroup: its own threads (zeroed key rows)

#if VW_ENABLED
__device__ __forceinline__ void vs_mbar_init(unsigned bar, unsigned count = 1) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// the same wait, acquiring what other CTAs of the cluster released before they arrived
__device__ __forceinline__ void vs_mbar_wait_cluster(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nVS_WAIT_CL:\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n@!p bra VS_WAIT_CL;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void vs_mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nVS_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra VS_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// one 64-key x 64-dim box of kv (rows `row` .., dims `dim` ..) into shared memory; completes on `bar`
__device__ __forceinline__ void vs_tma_box(unsigned dst, const void* map, unsigned bar, int dim, int row) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "n"(VS_BLOCK_BYTES) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(map), "r"(dim), "r"(row), "r"(bar)
        : "memory");
}
// 64-dim blocks [FIRST, LAST) of the key tile whose first row of kv is `row` into buffer `tile`
template <int FIRST, int LAST>
__device__ __forceinline__ void vs_load_blocks(unsigned tile, unsigned bars, const void* map, int row) {
#pragma unroll
    for (int blk = FIRST; blk < LAST; ++blk) vs_tma_box(tile + blk * VS_BLOCK_BYTES, map, bars + 8 * blk, 64 * blk, row);
}
// The same in a cluster of MC blocks (the row tiles of one request and split: the same key tiles). Each
// block of a tile lands in every CTA's buffer by one multicast copy, issued by its owner (CTA blk % MC) once
// every CTA has released that block of the buffer (REUSE: not its first use; the owner's "released" mbarrier
// counts MC arrivals, phase `parity`). Each CTA arms its own "landed" mbarrier for every block, before it
// releases: no copy into it can start before that. Every CTA calls this at the same points of the loop, in
// the same order, with all arrivals of a call before its waits: no cycle of waits.
#ifndef VS_MC_ABLATION
#define VS_MC_ABLATION 0  // timing only (tools/attention_multicast.py --ablations): 1 copies without waiting for
                          // the other CTAs to release a block (a race), 2 has every CTA copy its own tiles
#endif
template <int FIRST, int LAST, int MC>
__device__ __forceinline__ void vs_load(unsigned tile, unsigned bars, const void* map, int row, unsigned parity, bool reuse) {
    if (VS_MC_ABLATION == 1) reuse = false;
    if constexpr (MC == 1 || VS_MC_ABLATION == 2) {
        vs_load_blocks<FIRST, LAST>(tile, bars, map, row);
    } else {
        const unsigned rank = vx_cluster_rank();
#pragma unroll
        for (int blk = FIRST; blk < LAST; ++blk) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bars + 8 * blk), "n"(VS_BLOCK_BYTES) : "memory");
            if (reuse)
                asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                                 vx_mapa(bars + 8 * blk + VS_EMPTY_DELTA, blk % MC))
                             : "memory");
        }
#pragma unroll
        for (int blk = FIRST; blk < LAST; ++blk) {
            if (blk % MC != static_cast<int>(rank)) continue;
            if (reuse) vs_mbar_wait_cluster(bars + 8 * blk + VS_EMPTY_DELTA, parity);
            asm volatile(
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(
                    tile + blk * VS_BLOCK_BYTES),
                "l"(map), "r"(64 * blk), "r"(row), "r"(bars + 8 * blk), "h"(static_cast<unsigned short>((1u << MC) - 1))
                : "memory");
        }
    }
}

__device__ __forceinline__ void wgmma_m64n256k16_ss_tb(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

// The block's scalars, in shared memory (VS_OFF_BLK): read where needed rather than held in registers
struct VsBlock {
    const unsigned* mask_b;  // the request's tree mask rows
    const void* map;         // kv's tensor map
    int kv_row0;             // kv row (of the [B * T, 576] view) of the split's first key
    int key_begin, key_end, kv_len, prefix, mask_words, row0, heads, rows;
    float scale_log2;
    int n_pre;                     // the split's first n_pre tiles are all kept
    unsigned long long tree_tiles;  // bit i: the split's tile n_pre + i is kept (some row sees a key of it)
};
// the loop's tiles from n_pre on: the split's tile of each (VS_OFF_TREE, one byte a tile)
static_assert(sizeof(VsBlock) <= 128, "VsBlock: VS_SMEM_BYTES leaves 128 bytes");
extern __shared__ __align__(1024) unsigned char vs_smem[];
__device__ __forceinline__ VsBlock& vs_blk() { return *reinterpret_cast<VsBlock*>(vs_smem + VS_OFF_BLK); }
__device__ __forceinline__ float* vs_rowf(int which) { return reinterpret_cast<float*>(vs_smem + VS_OFF_ROWS) + 64 * which; }
// the split's tile index of the loop's tile t
__device__ __forceinline__ int vs_tile(int t) {
    if (!VS_SKIP_TREE) return t;
    const int n_pre = vs_blk().n_pre;
    return t < n_pre ? t : n_pre + vs_smem[VS_OFF_TREE + t - n_pre];
}
// the first kv row (of the [B * T, 576] view) of the loop's tile t
__device__ __forceinline__ int vs_tile_row(int t) { return vs_blk().kv_row0 + VS_BN * vs_tile(t); }
// opaque to the compiler: the wgmma descriptors built from it are not hoisted out of the tile loop (where
// holding them all would take more registers than there are)
__device__ __forceinline__ unsigned vs_base() {
    unsigned a;
    asm volatile("mov.u32 %0, %1;\n" : "=r"(a) : "r"(smem_addr(vs_smem)));
    return a;
}
// wgmma descriptors (128-byte swizzle, 1024-byte stride) as a base word plus a byte offset: the address
// field of the base (addr >> 4, 14 bits, addresses < 256 KB) takes the offset without a carry, so a step of
// a GEMM costs one add, not the descriptor's whole packing
__device__ __forceinline__ unsigned vs_desc_lo(unsigned addr, unsigned lead_bytes) {
    return ((addr & 0x3FFFF) >> 4) | ((lead_bytes >> 4) << 16);
}
__device__ __forceinline__ uint64_t vs_desc(unsigned lo, unsigned offset_bytes) {
    return (static_cast<uint64_t>((1024 >> 4) | (1u << 30)) << 32) | (lo + (offset_bytes >> 4));
}
// this thread's rows h = 0, 1 of the tile (wgmma's accumulator layout), and its first column of each 8
__device__ __forceinline__ int vs_row(int h) { return ((threadIdx.x & 127) >> 5) * 16 + ((threadIdx.x & 31) >> 2) + 8 * h; }
__device__ __forceinline__ int vs_col0() { return 2 * (threadIdx.x & 3); }
#define VS_M 0       // vs_rowf: running row max (log2 domain)
#define VS_SCALE0 1  // t0's rescale factor
#define VS_SCALE1 2  // t1's
#define VS_L 3       // [2][64] row sums of the two warpgroups, at the end
#define VS_K0 (VS_OFF_K)                   // tiles t0 (even) in buffer 0, t1 (odd) in buffer 1
#define VS_K1 (VS_OFF_K + VS_TILE_BYTES)
#define VS_P1 (VS_K1 + (VS_DIM_BLOCKS - 1) * VS_BLOCK_BYTES)  // P1: buffer 1's rope block, free once S of t1 is done
#define VS_BARS0 (VS_OFF_BARS)
#define VS_BARS1 (VS_OFF_BARS + 8 * VS_DIM_BLOCKS)

// S (+)= Q K^T over the 64-dim blocks [FIRST, LAST) of the key tile at `sk`, each issued once its block has
// landed (mbarriers from `bars`) and committed as its own group of 4 k-steps. ZERO: this range's first k-step
// starts the sum.
template <int FIRST, int LAST, bool ZERO>
__device__ __forceinline__ void vs_issue_qk(float (&s)[32], unsigned sk, unsigned bars, unsigned parity) {
    const unsigned q = vs_desc_lo(vs_base(), 16), kd = vs_desc_lo(sk, 16);
#pragma unroll
    for (int blk = FIRST; blk < LAST; ++blk) {
        vs_mbar_wait(bars + 8 * blk, parity);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k)
            wgmma_m64n64k16_ss(s, vs_desc(q, blk * VS_BLOCK_BYTES + k * 32), vs_desc(kd, blk * VS_BLOCK_BYTES + k * 32),
                               !(ZERO && blk == FIRST && k == 0));
        wgmma_commit();
    }
}

// O += P V with P [64 x 64] bf16 in shared memory (K-major, 128-byte swizzle), V = dims [256 half, +256)
// of the key tile read transposed. Issued and committed.
__device__ __forceinline__ void vs_issue_pv_shared(float (&acc)[128], unsigned sp, unsigned sk, int half) {
    const unsigned pd = vs_desc_lo(sp, 16), v = vs_desc_lo(sk + (4 * half) * VS_BLOCK_BYTES, VS_BLOCK_BYTES);
#pragma unroll
    for (int kk = 0; kk < VS_BN / 16; ++kk)  // keys 16 kk ..: two 8-key groups of 1024 bytes
        wgmma_m64n256k16_ss_tb(acc, vs_desc(pd, kk * 32), vs_desc(v, kk * 16 * 128));
    wgmma_commit();
}

// The same with P (this thread's A fragments of the four k-steps) from registers
__device__ __forceinline__ void vs_issue_pv_regs(float (&acc)[128], const unsigned (&p)[16], unsigned sk, int half) {
    const unsigned v = vs_desc_lo(sk + (4 * half) * VS_BLOCK_BYTES, VS_BLOCK_BYTES);
#pragma unroll
    for (int kk = 0; kk < VS_BN / 16; ++kk) {
        const unsigned a[4] = {p[4 * kk + 0], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        wgmma_m64n256k16_rs_tb(acc, a, vs_desc(v, kk * 16 * 128));
    }
    wgmma_commit();
}

// word w of a mask row, 0 past its words
__device__ __forceinline__ unsigned vs_word(const unsigned* row, int w, int words) { return w < words ? row[w] : 0u; }
// bits [rel, rel + 64) of a mask row (tree keys rel ..), rel >= 0
__device__ __forceinline__ uint64_t vs_tree_window(const unsigned* row, int rel, int words) {
    const int w = rel >> 5, sh = rel & 31;
    uint64_t vis = (vs_word(row, w, words) | static_cast<uint64_t>(vs_word(row, w + 1, words)) << 32) >> sh;
    if (sh) vis |= static_cast<uint64_t>(vs_word(row, w + 2, words)) << (64 - sh);
    return vis;
}
// keys [0, lim) of a 64-key tile
__device__ __forceinline__ uint64_t vs_first_keys(int lim) { return lim >= VS_BN ? ~0ull : lim <= 0 ? 0ull : (1ull << lim) - 1; }

// The scores of tile `t` with keys outside the split or hidden by the tree mask at -inf. A row's visible
// keys in the tile form one 64-bit word (bit k: key key0 + k), from at most three words of its mask row.
__device__ __forceinline__ void vs_mask(float (&s)[32], int t) {
    const VsBlock& k = vs_blk();
    // all visible prefix keys (tested before the tile's index is looked up: it is on the softmax's path)
    if (t < k.n_pre && k.key_begin + (t + 1) * VS_BN <= min(k.prefix, k.key_end)) return;
    const int key0 = k.key_begin + vs_tile(t) * VS_BN;
    const int rel = key0 - k.prefix;                        // tree index of the tile's first key
    const int lim = k.key_end - key0;                       // keys of the tile inside the split
    const uint64_t in_split = vs_first_keys(lim);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = k.row0 + vs_row(h);
        const unsigned* mrow = k.mask_b + static_cast<long long>(row < k.rows ? row / k.heads : 0) * k.mask_words;
        uint64_t vis;
        if (rel <= -VS_BN) {
            vis = ~0ull;  // all prefix (the split ends inside the tile)
        } else if (rel < 0) {  // -rel prefix keys, then tree keys 0 ..
            const uint64_t tree = vs_word(mrow, 0, k.mask_words) | static_cast<uint64_t>(vs_word(mrow, 1, k.mask_words)) << 32;
            vis = (tree << -rel) | ((1ull << -rel) - 1);
        } else {
            vis = vs_tree_window(mrow, rel, k.mask_words);
        }
        vis = (vis & in_split) >> vs_col0();
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                if (!((vis >> (8 * j + e)) & 1)) s[4 * j + 2 * h + e] = -INFINITY;
    }
}

// row maxima of raw scores (4 threads a row), in the log2 domain
__device__ __forceinline__ void vs_row_max(const float (&s)[32], float scale_log2, float (&mx)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float x = s[2 * h];
#pragma unroll
        for (int j = 0; j < 8; ++j) x = fmaxf(x, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
        mx[h] = x * scale_log2;
    }
}

// s <- 2^(s * scale - m_new) in fp32 (kept: warpgroup 0 rescales it), p <- bf16 A fragments; returns the sums
__device__ __forceinline__ void vs_exp(float (&s)[32], unsigned (&p)[16], float scale_log2, const float (&m_new)[2],
                                       float (&sum)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        sum[h] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float a = vw_exp2(fmaf(s[4 * j + 2 * h], scale_log2, -m_new[h]));
            const float b = vw_exp2(fmaf(s[4 * j + 2 * h + 1], scale_log2, -m_new[h]));
            s[4 * j + 2 * h] = a;
            s[4 * j + 2 * h + 1] = b;
            sum[h] += a + b;
            __nv_bfloat162 pair = __floats2bfloat162_rn(a, b);
            p[(j >> 1) * 4 + (j & 1) * 2 + h] = *reinterpret_cast<unsigned*>(&pair);
        }
    }
}

// P (this thread's A fragments) into a 64 x 64 K-major, 128-byte-swizzled tile at byte offset `off` of the
// shared memory (conflict-free: the 8 rows of a store land in 8 different 16-byte chunks)
__device__ __forceinline__ void vs_store_p(int off, const unsigned (&p)[16]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = vs_row(h);
            *reinterpret_cast<unsigned*>(vs_smem + off + r * 128 + ((j ^ (r & 7)) << 4) + vs_col0() * 2) =
                p[(j >> 1) * 4 + (j & 1) * 2 + h];
        }
}

// O's rows times their factors; skipped where no row of the warp changes (a factor of exactly 1 is the
// identity: the result is the same bits), as in most tiles once the running max has settled
__device__ __forceinline__ bool vs_any_rescale(const float (&f)[2]) {
    return __any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f);
}
__device__ __forceinline__ void vs_scale_acc(float (&acc)[128], const float (&f)[2]) {
    if (!vs_any_rescale(f)) return;
#pragma unroll
    for (int n = 0; n < 32; ++n) {
        acc[4 * n + 0] *= f[0];
        acc[4 * n + 1] *= f[0];
        acc[4 * n + 2] *= f[1];
        acc[4 * n + 3] *= f[1];
    }
}

// Where tile t reaches past the request's keys (into padding: NaN in the tests), its rows from the last key
// on are zeroed in dim blocks [blk0, blk0 + 4) of its buffer (P is 0 there, but 0 * NaN is NaN), then made
// visible to the async proxy and to the warpgroup's other threads. Warpgroup-uniform.
__device__ __forceinline__ void vs_zero_tail(int t, int blk0, int wg) {
    const VsBlock& k = vs_blk();
    if (t < k.n_pre && k.key_begin + (t + 1) * VS_BN <= k.kv_len) return;
    const int valid = k.kv_len - (k.key_begin + vs_tile(t) * VS_BN);
    if (valid >= VS_BN) return;
    unsigned char* tile = vs_smem + VS_OFF_K + (t & 1) * VS_TILE_BYTES + blk0 * VS_BLOCK_BYTES;
    const int chunks = (VS_BN - valid) * 8;  // 16-byte chunks a block
    for (int i = threadIdx.x & 127; i < 4 * chunks; i += 128) {
        const int blk = i / chunks, r = valid + (i % chunks) / 8, ch = i % 8;
        *reinterpret_cast<uint4*>(tile + blk * VS_BLOCK_BYTES + r * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async();
    asm volatile("bar.sync %0, 128;\n" ::"r"(VS_BAR_WG + wg) : "memory");
}

// the running max m against a tile's row maxima: new max and the factor that takes the old terms to it
// (written back for the other warpgroup, with the factor in vs_rowf(which))
__device__ __forceinline__ void vs_update_max(const float (&mx)[2], float (&m_new)[2], float (&f)[2], int which) {
    float* m = vs_rowf(VS_M);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float m_old = m[vs_row(h)];
        m_new[h] = fmaxf(m_old, mx[h]);
        f[h] = vw_exp2(m_old - m_new[h]);
    }
    __syncwarp();
    if ((threadIdx.x & 3) == 0)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            vs_rowf(which)[vs_row(h)] = f[h];
            m[vs_row(h)] = m_new[h];
        }
}

// Warpgroup 0's part of the pair (t0, t0 + 1), t0 even (buffer 0; t0 + 1 in buffer 1). On entry s holds S of
// t0 (raw, complete); on exit S of t0 + 2 if NEXT0. HAS1: tile t0 + 1 exists; NEXT0 / NEXT1: t0 + 2 / t0 + 3.
template <int MC, bool HAS1, bool NEXT0, bool NEXT1>
__device__ __forceinline__ void vs_pair_wg0(int t0, float (&s)[32], float (&acc)[128], float (&l)[2]) {
    static_assert(HAS1 || !NEXT0, "vs_pair_wg0: a next pair needs this pair's second tile");
    unsigned p[16];
    const unsigned k0 = vs_base() + VS_K0, k1 = vs_base() + VS_K1;
    const unsigned parity_next = ((t0 + 2) >> 1) & 1;
    // the next tiles' kv rows, looked up here, off the loads' path
    const int row2 = NEXT0 ? vs_tile_row(t0 + 2) : 0, row3 = NEXT1 ? vs_tile_row(t0 + 3) : 0;
    // softmax of t0 against the running max
    vs_mask(s, t0);
    float mx[2], m_new[2], f0[2], sum[2];
    vs_row_max(s, vs_blk().scale_log2, mx);
    vs_update_max(mx, m_new, f0, VS_SCALE0);
    vs_scale_acc(acc, f0);
    vs_exp(s, p, vs_blk().scale_log2, m_new, sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * f0[h] + sum[h];
    vw_bar_arrive(VS_BAR_SCALE0);
    vs_zero_tail(t0, 0, 0);
    wgmma_fence();
    vs_issue_pv_regs(acc, p, k0, 0);  // O_L += P0 V0_L
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    wgmma_keep_regs(p);
    vw_bar_sync(VS_BAR_SCALE1);                  // warpgroup 1: t1's max is in
    if (NEXT0 && (threadIdx.x & 127) == 0)  // dims 0-255 of buffer 0: nobody reads them now
        vs_load<0, 4, MC>(k0, vs_base() + VS_BARS0, vs_blk().map, row2, parity_next ^ 1, true);
    float f1[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) f1[h] = vs_rowf(VS_SCALE1)[vs_row(h)];
    // P0 at t1's max, for warpgroup 1 (where t1 moved no max of the warp's rows, P0 as it is)
    if (vs_any_rescale(f1))
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                __nv_bfloat162 pair = __floats2bfloat162_rn(s[4 * j + 2 * h] * f1[h], s[4 * j + 2 * h + 1] * f1[h]);
                p[(j >> 1) * 4 + (j & 1) * 2 + h] = *reinterpret_cast<unsigned*>(&pair);
            }
    vs_store_p(VS_OFF_P0, p);
    fence_proxy_async();
    vw_bar_arrive(VS_BAR_P0);
    if (HAS1) {
        vw_bar_sync(VS_BAR_P1);  // P1 is in (warpgroup 1 is done with S of t1)
        vs_zero_tail(t0 + 1, 0, 0);
        vs_scale_acc(acc, f1);
#pragma unroll
        for (int h = 0; h < 2; ++h) l[h] *= f1[h];
        wgmma_fence();
        vs_issue_pv_shared(acc, vs_base() + VS_P1, k1, 0);  // O_L += P1 V1_L
    }
    if (NEXT0) vs_issue_qk<0, 4, true>(s, k0, vs_base() + VS_BARS0, parity_next);
    if (NEXT1) {
        wgmma_wait<NEXT0 ? 4 : 0>();  // O_L += P1 V1_L done: buffer 1's dims 0-255 and P1 (its rope block) free
        if ((threadIdx.x & 127) == 0) {
            vs_load<0, 4, MC>(k1, vs_base() + VS_BARS1, vs_blk().map, row3, parity_next ^ 1, true);
            vs_load<VS_DIM_BLOCKS - 1, VS_DIM_BLOCKS, MC>(k1, vs_base() + VS_BARS1, vs_blk().map, row3, parity_next ^ 1, true);
        }
    }
    if (NEXT0) vs_issue_qk<4, VS_DIM_BLOCKS, false>(s, k0, vs_base() + VS_BARS0, parity_next);
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    wgmma_fence_regs(s);
}

// Warpgroup 1's part of the pair. On entry s holds S of t0 + 1 if HAS1; on exit S of t0 + 3 if NEXT1.
template <int MC, bool HAS1, bool NEXT0, bool NEXT1>
__device__ __forceinline__ void vs_pair_wg1(int t0, float (&s)[32], float (&acc)[128], float (&l)[2]) {
    static_assert(HAS1 || !NEXT0, "vs_pair_wg1: a next pair needs this pair's second tile");
    unsigned p[16];
    const unsigned k0 = vs_base() + VS_K0, k1 = vs_base() + VS_K1;
    const unsigned parity_next = ((t0 + 2) >> 1) & 1;
    const int row2 = NEXT0 ? vs_tile_row(t0 + 2) : 0, row3 = NEXT1 ? vs_tile_row(t0 + 3) : 0;
    vw_bar_sync(VS_BAR_SCALE0);  // t0's max and factor are in; warpgroup 0 is done with S of t0
    vs_zero_tail(t0, 4, 1);
    if (HAS1) vs_zero_tail(t0 + 1, 4, 1);
    float f0[2], f1[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) f0[h] = vs_rowf(VS_SCALE0)[vs_row(h)];
    if (HAS1) {
        vs_mask(s, t0 + 1);
        float mx[2], m_new[2];
        vs_row_max(s, vs_blk().scale_log2, mx);
        vs_update_max(mx, m_new, f1, VS_SCALE1);
        vs_exp(s, p, vs_blk().scale_log2, m_new, sum);
    } else {
        f1[0] = f1[1] = 1.f;
        if ((threadIdx.x & 3) == 0)
#pragma unroll
            for (int h = 0; h < 2; ++h) vs_rowf(VS_SCALE1)[vs_row(h)] = 1.f;
    }
    float fo[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        fo[h] = f0[h] * f1[h];
        l[h] = l[h] * fo[h] + sum[h];
    }
    vs_scale_acc(acc, fo);
    vw_bar_arrive(VS_BAR_SCALE1);
    if (HAS1) {
        vs_store_p(VS_P1, p);  // for warpgroup 0
        fence_proxy_async();
        wgmma_fence();
        vs_issue_pv_regs(acc, p, k1, 1);  // O_R += P1 V1_R
    }
    vw_bar_sync(VS_BAR_P0);
    wgmma_fence();
    vs_issue_pv_shared(acc, vs_base() + VS_OFF_P0, k0, 1);  // O_R += P0 V0_R
    if (HAS1) vw_bar_arrive(VS_BAR_P1);
    if (NEXT1) {
        wgmma_wait<1>();  // O_R += P1 V1_R done: buffer 1's dims 256-511 free
        if ((threadIdx.x & 127) == 0)
            vs_load<4, VS_DIM_BLOCKS - 1, MC>(k1, vs_base() + VS_BARS1, vs_blk().map, row3, parity_next ^ 1, true);
    }
    if (NEXT0) {
        wgmma_wait<0>();  // O_R += P0 V0_R done: buffer 0's dims 256-575 free
        if ((threadIdx.x & 127) == 0)
            vs_load<4, VS_DIM_BLOCKS, MC>(k0, vs_base() + VS_BARS0, vs_blk().map, row2, parity_next ^ 1, true);
    }
    if (NEXT1) {  // S of t0 + 3, in the order its blocks are loaded
        vs_issue_qk<4, VS_DIM_BLOCKS - 1, true>(s, k1, vs_base() + VS_BARS1, parity_next);
        vs_issue_qk<0, 4, false>(s, k1, vs_base() + VS_BARS1, parity_next);
        vs_issue_qk<VS_DIM_BLOCKS - 1, VS_DIM_BLOCKS, false>(s, k1, vs_base() + VS_BARS1, parity_next);
    }
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    wgmma_fence_regs(s);
    wgmma_keep_regs(p);
}
#endif  // VW_ENABLED

// The kernel's body. MC > 1: a cluster of MC blocks, the row tiles of one request (grid x = MC), that share
// each key tile by multicast (vs_load): every tile leaves L2 once a request instead of once a row tile. No
// tree tiles are skipped there (every CTA of a cluster walks the same tiles).
template <int MC>
__device__ __forceinline__ void vs_attention(VA_KERNEL_PARAMS) {
#if VW_ENABLED
    VX_MARK(0);
    if (smem_addr(vs_smem) & 1023) __trap();  // the swizzle atoms need it; there is no room to realign
    const int b = blockIdx.z, split = blockIdx.y;
    const int rows = tokens * heads;
    const int row0 = blockIdx.x * VS_BM;
    const int tid = threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    const int prefix = prefix_lengths[b];
    const VwSplitKeys keys = vw_split_keys(prefix, tokens, split, tiles_per_split);
    static_assert(VS_BN == VW_BN, "the split plan counts 64-key tiles");
    const int kv_row0 = static_cast<int>(b * kv_rows) + keys.key_begin;
    // the split's tiles wholly in the tree (from first_tree on) may be skipped; the bitmap covers the last 64
    const int first_tree = min(keys.n_tiles, max(0, (prefix - keys.key_begin + VS_BN - 1) / VS_BN));
    const int n_pre = VS_SKIP_TREE && MC == 1 ? max(first_tree, keys.n_tiles - 64) : keys.n_tiles;

    if (tid == 0) {
        VsBlock& k = vs_blk();
        k.mask_b = mask_bits + static_cast<long long>(b) * tokens * mask_words;
        k.map = kv_map;
        k.kv_row0 = kv_row0;
        k.key_begin = keys.key_begin;
        k.key_end = keys.key_end;
        k.kv_len = keys.kv_len;
        k.prefix = prefix;
        k.mask_words = mask_words;
        k.row0 = row0;
        k.heads = heads;
        k.rows = rows;
        k.scale_log2 = scale_log2;
        k.n_pre = n_pre;
        k.tree_tiles = 0;
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(kv_map) : "memory");
        for (int i = 0; i < 2 * VS_DIM_BLOCKS; ++i) vs_mbar_init(vs_base() + VS_OFF_BARS + 8 * i);
        if (MC > 1)
            for (int i = 0; i < 2 * VS_DIM_BLOCKS; ++i) vs_mbar_init(vs_base() + VS_OFF_BARS + VS_EMPTY_DELTA + 8 * i, MC);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (MC > 1)
        vx_cluster_sync();  // every CTA's mbarriers are initialised before any copy signals them
    else
        __syncthreads();
    if (tid == 0) {  // the first two key tiles, where they are kept whatever the mask
        if (n_pre > 0) vs_load<0, VS_DIM_BLOCKS, MC>(vs_base() + VS_K0, vs_base() + VS_BARS0, kv_map, kv_row0, 0, false);
        if (n_pre > 1) vs_load<0, VS_DIM_BLOCKS, MC>(vs_base() + VS_K1, vs_base() + VS_BARS1, kv_map, kv_row0 + VS_BN, 0, false);
    }
    // Q (rows past M zero-filled) by every thread; the row state
    const __nv_bfloat16* q_b = q + static_cast<long long>(b) * rows * VA_DIM;
    for (int i = tid; i < VS_BM * (VA_DIM / 8); i += VS_THREADS) {
        const int r = i / (VA_DIM / 8), chunk = i % (VA_DIM / 8);
        const bool valid = row0 + r < rows;
        const __nv_bfloat16* src = q_b + (valid ? static_cast<long long>(row0 + r) * VA_DIM + chunk * 8 : 0);
        cp_async16(vs_smem + vw_swizzled(r, chunk, VS_BLOCK_BYTES), src, valid);
    }
    cp_async_commit();
    if (tid < VS_BM) vs_rowf(VS_M)[tid] = VS_M_INIT;
    // the kept tree tiles: a tile is kept where a token of the block's rows sees one of its keys
    if (n_pre < keys.n_tiles) {
        const int tok0 = row0 / heads, toks = (min(row0 + VS_BM, rows) - 1) / heads - tok0 + 1;
        const int cands = keys.n_tiles - n_pre;
        const unsigned* mask_b = mask_bits + static_cast<long long>(b) * tokens * mask_words;
        uint64_t kept = 0;
        for (int i = tid; i < toks * cands; i += VS_THREADS) {
            const int tok = tok0 + i / cands, c = i % cands;
            const int key0 = keys.key_begin + (n_pre + c) * VS_BN;
            const uint64_t vis = vs_tree_window(mask_b + static_cast<long long>(tok) * mask_words, key0 - prefix, mask_words) &
                                 vs_first_keys(keys.key_end - key0);
            if (vis) kept |= 1ull << c;
        }
        const unsigned lo = __reduce_or_sync(0xffffffffu, static_cast<unsigned>(kept));
        const unsigned hi = __reduce_or_sync(0xffffffffu, static_cast<unsigned>(kept >> 32));
        if ((tid & 31) == 0 && (lo | hi))
            atomicOr(&vs_blk().tree_tiles, static_cast<unsigned long long>(hi) << 32 | lo);
    }
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    VX_MARK(1);
    const uint64_t tree_tiles = vs_blk().tree_tiles;
    const int n = n_pre + __popcll(tree_tiles);
    if (tid < 64 && ((tree_tiles >> tid) & 1))  // the kept tree tiles in order
        vs_smem[VS_OFF_TREE + __popcll(tree_tiles & ((1ull << tid) - 1))] = static_cast<unsigned char>(tid);
    if (n > n_pre) __syncthreads();  // block-uniform
    if (tid == 0) {  // the first two key tiles where they are tree tiles
        if (n_pre == 0 && n > 0) vs_load_blocks<0, VS_DIM_BLOCKS>(vs_base() + VS_K0, vs_base() + VS_BARS0, kv_map, vs_tile_row(0));
        if (n_pre <= 1 && n > 1) vs_load_blocks<0, VS_DIM_BLOCKS>(vs_base() + VS_K1, vs_base() + VS_BARS1, kv_map, vs_tile_row(1));
    }

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    float l[2] = {0.f, 0.f};
    float s[32];
    if (wg == 0) {
        if (n > 0) {
            vs_issue_qk<0, VS_DIM_BLOCKS, true>(s, vs_base() + VS_K0, vs_base() + VS_BARS0, 0);
            wgmma_wait<0>();
            wgmma_fence_regs(s);
            int t0 = 0;
            for (; t0 + 3 < n; t0 += 2) vs_pair_wg0<MC, true, true, true>(t0, s, acc, l);
            if (n - t0 == 3) {
                vs_pair_wg0<MC, true, true, false>(t0, s, acc, l);
                vs_pair_wg0<MC, false, false, false>(t0 + 2, s, acc, l);
            } else if (n - t0 == 2) {
                vs_pair_wg0<MC, true, false, false>(t0, s, acc, l);
            } else {
                vs_pair_wg0<MC, false, false, false>(t0, s, acc, l);
            }
        }
    } else if (n > 0) {
        if (n > 1) {
            vs_issue_qk<0, VS_DIM_BLOCKS, true>(s, vs_base() + VS_K1, vs_base() + VS_BARS1, 0);
            wgmma_wait<0>();
            wgmma_fence_regs(s);
        }
        int t0 = 0;
        for (; t0 + 3 < n; t0 += 2) vs_pair_wg1<MC, true, true, true>(t0, s, acc, l);
        if (n - t0 == 3) {
            vs_pair_wg1<MC, true, true, false>(t0, s, acc, l);
            vs_pair_wg1<MC, false, false, false>(t0 + 2, s, acc, l);
        } else if (n - t0 == 2) {
            vs_pair_wg1<MC, true, false, false>(t0, s, acc, l);
        } else {
            vs_pair_wg1<MC, false, false, false>(t0, s, acc, l);
        }
    }

    VX_MARK(2);
    // ---- epilogue: the row sums of both warpgroups; each warpgroup writes its 256 dims of its rows
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float x = l[h];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        if ((tid & 3) == 0) vs_rowf(VS_L + wg)[vs_row(h)] = x;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = vs_row(h), row = row0 + r;
        if (row >= rows) continue;
        const float lt = vs_rowf(VS_L)[r] + vs_rowf(VS_L + 1)[r];
        const float inv = lt > 0.f ? 1.f / lt : 0.f;
        if (splits == 1) {
            __nv_bfloat16* o = out + (static_cast<long long>(b) * rows + row) * VA_DV + wg * 256 + vs_col0();
#pragma unroll
            for (int j = 0; j < 32; ++j)
                *reinterpret_cast<__nv_bfloat162*>(o + j * 8) =
                    __floats2bfloat162_rn(acc[4 * j + 2 * h] * inv, acc[4 * j + 2 * h + 1] * inv);
        } else {
            const long long prow = (static_cast<long long>(split) * batch + b) * rows + row;
            float* o = partial_out + prow * VA_DV + wg * 256 + vs_col0();
#pragma unroll
            for (int j = 0; j < 32; ++j)
                *reinterpret_cast<float2*>(o + j * 8) = make_float2(acc[4 * j + 2 * h] * inv, acc[4 * j + 2 * h + 1] * inv);
            if (wg == 0 && (tid & 3) == 0) partial_lse[prow] = lt > 0.f ? vs_rowf(VS_M)[r] + log2f(lt) : -INFINITY;
        }
    }
    VX_MARK(3);
    if (splits > 1 && split_counters != nullptr)  // the splits merge here, no combine launch
        va_merge_splits(partial_out, partial_lse, out, split_counters, reinterpret_cast<float*>(vs_smem), batch, rows,
                        splits, row0, min(VS_BM, rows - row0), b, split, tid, VS_THREADS);
    VX_MARK(4);
    if constexpr (MC > 1) vx_cluster_sync();  // no CTA leaves while another may still signal its mbarriers
#endif  // VW_ENABLED
}

extern "C" __global__ void __launch_bounds__(VS_THREADS, 1) ddtree_verify_attn_seesaw(VA_KERNEL_PARAMS) {
    vs_attention<1>(VA_KERNEL_ARGS);
}

// Clusters of the row tiles of a request, key tiles multicast (grid (MC, splits, B); no in-kernel split
// merge: a grid of clusters need not be resident at once)
#define VS_MULTICAST(n)                                                                           \
    extern "C" __global__ void VX_SPLIT_CLUSTER_X(n) __launch_bounds__(VS_THREADS, 1)             \
        ddtree_verify_attn_seesaw_multicast##n(VA_KERNEL_PARAMS) {                                \
        vs_attention<n>(VA_KERNEL_ARGS);                                                          \
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define VX_SPLIT_CLUSTER_X(n) __cluster_dims__(n, 1, 1)
#else
#define VX_SPLIT_CLUSTER_X(n)
#endif
VS_MULTICAST(2)
VS_MULTICAST(3)
VS_MULTICAST(4)
VS_MULTICAST(5)

// info[0]: shared memory one block of ddtree_verify_attn_seesaw needs; info[1]: 1 where it is compiled in for
// the running device (sm_90a code), else 0; info[2]: keys per key tile.
extern "C" __global__ void ddtree_verify_attn_seesaw_info(int* info) {
    info[0] = VS_SMEM_BYTES;
    info[1] = VW_ENABLED;
    info[2] = VS_BN;
}
