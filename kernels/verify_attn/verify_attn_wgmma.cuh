// Hopper (sm_90a) path of the tree-verify attention: warpgroup MMAs (wgmma) straight from shared memory.
// Included by verify_attn.cu; same arguments, split-KV workspace and combine kernel as ddtree_verify_attn
// (layouts in that file's header comment), but key tiles of 64 keys: the split plan counts them in
// VW_BN-key tiles (ddtree_verify_attn_wgmma_info reports VW_BN). Compiled only where the arch-specific
// sm_90a features exist (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the kernel body is empty and the loader never
// picks it (ddtree_verify_attn_wgmma_info says which).
//
// Block: 64 query rows, 256 threads = two warpgroups with different jobs (as FlashMLA does), key tiles of
// 64 keys in two buffers, 128-byte-swizzled shared memory (the layout wgmma's descriptors read: 64 dims =
// 128 bytes a row, 16-byte chunk c of row r stored at chunk c ^ (r % 8), 8-row atoms 1024 bytes apart, one
// block of (rows x 64 dims) per 64 dims).
//   Warpgroup 0 (softmax): S = Q K^T over all 576 dims (36 k-steps of m64n64k16, both operands from shared
//     memory), scale, tree mask and online softmax in registers, then hands P (bf16, in wgmma's A-fragment
//     layout) and the rescale factor to warpgroup 1 through shared memory (thread t of one warpgroup holds
//     the same rows as thread t of the other), and O[:, 0:256] += P V (4 k-steps of m64n256k16, P from
//     registers, V the key tile read transposed).
//   Warpgroup 1 (loads, second half of O): loads key tile t + 1 with cp.async while warpgroup 0 works on tile
//     t, takes P and the rescale factor of each tile and adds O[:, 256:512] += P V.
// The warpgroups meet only at named barriers (producer/consumer pairs: key tile ready, key buffer free, P
// ready, P taken), never at a block-wide barrier inside the loop: warpgroup 1's P V of tile t and its loads run
// while warpgroup 0 computes S of tile t + 1.
// The mask, the scale (log2 domain), the -inf handling and the split outputs are those of ddtree_verify_attn.
// 226 KB of shared memory, one block per SM.

// Timeline (timing only, tools/attention_timeline.py builds it with -DVX_TIMELINE): thread 0 of each block
// records %globaltimer at five points of the Hopper kernels (VX_MARK(0..4): start, prologue done, warpgroup
// 0's loop done, rows written (the 72-row kernel: staged in shared memory), end), block (x, y, z) at
// vx_timeline[5 * linear block index]. Compiled out by default.
#ifdef VX_TIMELINE
__device__ unsigned long long vx_timeline[16384 * 5];
#define VX_MARK(i)                                                                                         \
    if (threadIdx.x == 0) {                                                                                \
        unsigned long long t;                                                                              \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                                              \
        vx_timeline[((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * 5 + (i)] = t;        \
    }
#else
#define VX_MARK(i)
#endif

#define VW_BM 64
#define VW_BN 64
#define VW_THREADS 256
#define VW_DIM_BLOCKS (VA_DIM / 64)                    // 9 blocks of 64 dims (128 bytes) each
#define VW_Q_BYTES (VW_DIM_BLOCKS * VW_BM * 128)       // 73728
#define VW_K_BLOCK_BYTES (VW_BN * 128)                 // one 64-dim block of a key tile: 8192
#define VW_K_BYTES (VW_DIM_BLOCKS * VW_K_BLOCK_BYTES)  // 73728
#define VW_STAGES 2                                    // key-tile buffers
#define VW_X_WORDS (16 * 128 + 2 * 128)                // hand-over: P (16 words a thread), 2 floats a thread
#define VW_SMEM_BYTES (VW_Q_BYTES + VW_STAGES * VW_K_BYTES + VW_X_WORDS * 4 + 1024)  // + 1024: alignment slack

// named barriers (0 is __syncthreads'); each is arrived at by one warpgroup and waited on by the other
#define VW_BAR_KREADY 1  // + buffer: key tile landed (warpgroup 1 -> 0)
#define VW_BAR_KFREE 3   // warpgroup 0 is done with the older key buffer (0 -> 1)
#define VW_BAR_PREADY 4  // P and the rescale factor (or, at the end, the row sums) handed over (0 -> 1)
#define VW_BAR_PFREE 5   // warpgroup 1 has taken them (1 -> 0)

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

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]: A and B in shared memory (descriptors), B K-major
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
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


__device__ __forceinline__ void vw_bar_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(VW_THREADS) : "memory"); }
__device__ __forceinline__ void vw_bar_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(VW_THREADS) : "memory");
}
// predicated, not branched around: a branch between a wgmma and its wait makes ptxas serialise the MMAs
__device__ __forceinline__ void vw_bar_sync_if(bool cond, int id) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p bar.sync %1, %2;\n}\n" ::"r"(int(cond)), "r"(id),
                 "n"(VW_THREADS)
                 : "memory");
}
__device__ __forceinline__ void vw_bar_arrive_if(bool cond, int id) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p bar.arrive %1, %2;\n}\n" ::"r"(int(cond)), "r"(id),
                 "n"(VW_THREADS)
                 : "memory");
}

// 16-byte chunk `chunk` (0..71) of row `row` of a swizzled tile whose 64-dim blocks are `block_bytes` apart
__device__ __forceinline__ unsigned vw_swizzled(int row, int chunk, unsigned block_bytes) {
    return (chunk >> 3) * block_bytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// Keys [key0, key0 + VW_BN) into a swizzled key tile by `NT` threads (t = 0 .. NT-1); keys at or past kv_len
// read as zeros. The first eight 64-dim blocks (V, the latent dims) go to `dst` (VW_K_BLOCK_BYTES apart), the
// ninth (the rope dims) to `rope_dst` (LATENT / ROPE: load those parts). Chunk i * NT + t of the tile (in 64-dim blocks of 64 rows x 8 chunks)
// is row ((i * NT) % 512) / 8 + t / 8, chunk t % 8 of block (i * NT) / 512: every offset is the thread's base
// plus a constant, and the swizzle (chunk ^ row % 8) is the thread's own.
template <int NT, bool LATENT = true, bool ROPE = true>
__device__ __forceinline__ void vw_load_key_tile(unsigned char* dst, unsigned char* rope_dst,
                                                 const __nv_bfloat16* kv_b, int key0, int kv_len, int t) {
    static_assert(NT % 64 == 0 && 512 % NT == 0, "vw_load_key_tile: NT threads must tile a 64-dim block");
    const int trow = t >> 3, tch = t & 7;
    unsigned char* d = dst + trow * 128 + ((tch ^ (trow & 7)) << 4);
    unsigned char* d_rope = rope_dst + trow * 128 + ((tch ^ (trow & 7)) << 4);
    const __nv_bfloat16* src = kv_b + static_cast<long long>(key0 + trow) * VA_DIM + tch * 8;
    const int rows_left = kv_len - key0 - trow;  // row offset r is a key when r < rows_left
#pragma unroll
    for (int i = 0; i < VW_BN * (VA_DIM / 8) / NT; ++i) {
        const int blk = (i * NT) / 512, r = ((i * NT) % 512) / 8;
        if (!(blk < VW_DIM_BLOCKS - 1 ? LATENT : ROPE)) continue;  // a constant: only the parts asked for
        const bool valid = r < rows_left;
        unsigned char* block = blk < VW_DIM_BLOCKS - 1 ? d + blk * VW_K_BLOCK_BYTES : d_rope;  // blk: a constant
        cp_async16(block + r * 128, valid ? src + r * VA_DIM + blk * 64 : kv_b, valid);
    }
}

// 2^x (MUFU.EX2; results below 2^-126 flush to zero: negligible next to the row's largest term, which is 1)
__device__ __forceinline__ float vw_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// S of one key tile over all 576 dims (36 k-steps), issued and committed, not waited for.
__device__ __forceinline__ void vw_issue_qk(float (&s)[32], unsigned sq_addr, unsigned sk_addr) {
#pragma unroll
    for (int step = 0; step < 36; ++step) {  // k-step of 16 dims: block step / 4, 32 bytes a step inside it
        const unsigned a = sq_addr + (step >> 2) * (VW_BM * 128) + (step & 3) * 32;
        const unsigned k = sk_addr + (step >> 2) * VW_K_BLOCK_BYTES + (step & 3) * 32;
        wgmma_m64n64k16_ss(s, wgmma_desc(a, 16, 1024), wgmma_desc(k, 16, 1024), step > 0);
    }
    wgmma_commit();
}

// O += P V for one key tile: P (bf16 A fragments of the four k-steps) from registers, V = keys x the output
// dims [256 half, 256 half + 256), read transposed from the key tile. Issued and committed, not waited for.
__device__ __forceinline__ void vw_issue_pv(float (&acc)[128], const unsigned (&p)[16], unsigned sk_addr, int half) {
#pragma unroll
    for (int kk = 0; kk < VW_BN / 16; ++kk) {
        const unsigned a_frag[4] = {p[4 * kk + 0], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        // keys 16 kk .. (two 8-key groups 1024 bytes apart), dims 256 half .. (four 64-dim blocks apart)
        const unsigned v = sk_addr + (4 * half) * VW_K_BLOCK_BYTES + kk * 16 * 128;
        wgmma_m64n256k16_rs_tb(acc, a_frag, wgmma_desc(v, VW_K_BLOCK_BYTES, 1024));
    }
    wgmma_commit();
}

__device__ __forceinline__ void vw_rescale(float (&acc)[128], const float (&alpha)[2]) {
    if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            acc[4 * n + 0] *= alpha[0];
            acc[4 * n + 1] *= alpha[0];
            acc[4 * n + 2] *= alpha[1];
            acc[4 * n + 3] *= alpha[1];
        }
    }
}

// The keys of split `split` of a request with `prefix` cache keys and `tokens` tree keys (kv_len in all): its
// n_tiles key tiles of VW_BN keys from key_begin, its keys ending at key_end (the next split's begin). The
// host's plan (tiles_per_split) and both Hopper kernels agree on this.
struct VwSplitKeys {
    int kv_len, n_tiles, key_begin, key_end;
};
__device__ __forceinline__ VwSplitKeys vw_split_keys(int prefix, int tokens, int split, int tiles_per_split) {
    const int kv_len = prefix + tokens;
    const int tiles = (kv_len + VW_BN - 1) / VW_BN;
    const int tile_begin = split * tiles_per_split;
    const int tile_end = min(tiles, tile_begin + tiles_per_split);
    return {kv_len, max(0, tile_end - tile_begin), tile_begin * VW_BN, min(kv_len, tile_end * VW_BN)};
}
#endif  // VW_ENABLED

extern "C" __global__ void __launch_bounds__(VW_THREADS, 1) ddtree_verify_attn_wgmma(VA_KERNEL_PARAMS) {
#if VW_ENABLED
    VX_MARK(0);
    extern __shared__ __align__(1024) unsigned char vw_smem_raw[];
    // 1024-byte alignment of the swizzle atoms (the dynamic window's start is not guaranteed to have it)
    unsigned char* smem = vw_smem_raw + ((1024 - (smem_addr(vw_smem_raw) & 1023)) & 1023);
    unsigned char* sq = smem;
    unsigned char* sk0 = smem + VW_Q_BYTES;  // key tiles: VW_STAGES buffers of VW_K_BYTES
    unsigned* sx_p = reinterpret_cast<unsigned*>(smem + VW_Q_BYTES + VW_STAGES * VW_K_BYTES);  // [16][128]
    float* sx_f = reinterpret_cast<float*>(sx_p + 16 * 128);                                     // [2][128]

    const int b = blockIdx.z;
    const int split = blockIdx.y;
    const int rows = tokens * heads;
    const int row0 = blockIdx.x * VW_BM;
    const int tid = threadIdx.x;
    // warpgroup (through a shuffle, so that the compiler knows it is the same in a warp: wgmma under a branch
    // it cannot prove warp-uniform is serialised), thread within it
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wtid = tid & 127;
    const int warp_in_wg = wtid >> 5, lane = tid & 31;
    const int prefix = prefix_lengths[b];
    const VwSplitKeys keys = vw_split_keys(prefix, tokens, split, tiles_per_split);
    const int kv_len = keys.kv_len, n_tiles = keys.n_tiles, key_begin = keys.key_begin, key_end = keys.key_end;

    const __nv_bfloat16* q_b = q + static_cast<long long>(b) * rows * VA_DIM;
    const __nv_bfloat16* kv_b = kv + static_cast<long long>(b) * kv_rows * VA_DIM;
    const unsigned* mask_b = mask_bits + static_cast<long long>(b) * tokens * mask_words;
    const unsigned sq_addr = smem_addr(sq), sk_addr0 = smem_addr(sk0);

    // this thread's two rows of the 64-row tile (the m16n8 accumulator layout, warp w of the warpgroup owns
    // rows 16 w ..): r_lo and r_lo + 8; columns 8 j + 2 (lane % 4) + {0, 1} of n-tile j. The same in both
    // warpgroups.
    const int r_lo = warp_in_wg * 16 + (lane >> 2);
    const int col0 = 2 * (lane & 3);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    float l_row[2] = {0.f, 0.f}, m_row[2] = {-INFINITY, -INFINITY};  // whole-row sums and maxima at the end

    // Q tile (rows past M zero-filled) and the first two key tiles, by all threads
    for (int c = tid; c < VW_BM * (VA_DIM / 8); c += VW_THREADS) {
        const int r = c / (VA_DIM / 8), chunk = c % (VA_DIM / 8);
        const bool valid = row0 + r < rows;
        const __nv_bfloat16* src = q_b + (valid ? static_cast<long long>(row0 + r) * VA_DIM + chunk * 8 : 0);
        cp_async16(sq + vw_swizzled(r, chunk, VW_BM * 128), src, valid);
    }
    for (int t = 0; t < min(n_tiles, VW_STAGES); ++t)
        vw_load_key_tile<VW_THREADS>(sk0 + t * VW_K_BYTES, sk0 + t * VW_K_BYTES + (VW_DIM_BLOCKS - 1) * VW_K_BLOCK_BYTES,
                                     kv_b, key_begin + t * VW_BN, kv_len, tid);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    VX_MARK(1);

    unsigned p[16];  // P of the current tile: A fragments {row lo keys +0, row hi +0, row lo +8, row hi +8} x 4
    if (wg == 0) {
        int row_tok[2];
        bool row_ok[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + r_lo + 8 * h;
            row_ok[h] = row < rows;
            row_tok[h] = row_ok[h] ? row / heads : 0;
        }
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // l_run: this thread's columns only

        // S of tile i in s: scale, tree mask, online softmax (log2 domain; 4 threads share a row) -> P (bf16 A
        // fragments) and the factor alpha that takes the accumulators to the new running max
        auto softmax = [&](const float (&s)[32], int i, float (&alpha)[2]) {
            const int key0 = key_begin + i * VW_BN;
            const bool plain = key0 + VW_BN <= min(prefix, key_end);  // every key of the tile: visible prefix
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v[16];  // raw scores, -inf where masked (the scale is positive: max commutes with it)
                if (plain) {
#pragma unroll
                    for (int e = 0; e < 16; ++e) v[e] = row_ok[h] ? s[4 * (e >> 1) + 2 * h + (e & 1)] : -INFINITY;
                } else {
#pragma unroll
                    for (int j = 0; j < 8; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = key0 + 8 * j + col0 + e;
                            float x = -INFINITY;
                            if (row_ok[h] && key < key_end) {
                                x = s[4 * j + 2 * h + e];
                                if (key >= prefix) {
                                    const int jj = key - prefix;
                                    if (!((mask_b[static_cast<long long>(row_tok[h]) * mask_words + (jj >> 5)] >>
                                           (jj & 31)) &
                                          1u))
                                        x = -INFINITY;
                                }
                            }
                            v[2 * j + e] = x;
                        }
                }
                float tmax = v[0];
#pragma unroll
                for (int e = 1; e < 16; ++e) tmax = fmaxf(tmax, v[e]);
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
                const float m_new = fmaxf(m_run[h], tmax * scale_log2);
                float pr[16];
                if (m_new == -INFINITY) {
                    alpha[h] = 1.f;
#pragma unroll
                    for (int e = 0; e < 16; ++e) pr[e] = 0.f;
                } else {
                    alpha[h] = vw_exp2(m_run[h] - m_new);
                    float sum = 0.f;
#pragma unroll
                    for (int e = 0; e < 16; ++e) {
                        pr[e] = vw_exp2(fmaf(v[e], scale_log2, -m_new));
                        sum += pr[e];
                    }
                    l_run[h] = l_run[h] * alpha[h] + sum;
                }
                m_run[h] = m_new;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    __nv_bfloat162 pair = __floats2bfloat162_rn(pr[2 * j], pr[2 * j + 1]);
                    p[(j >> 1) * 4 + (j & 1) * 2 + h] = *reinterpret_cast<unsigned*>(&pair);
                }
            }
        };
        // hand P and alpha over to warpgroup 1
        auto publish = [&](const float (&alpha)[2]) {
#pragma unroll
            for (int k = 0; k < 16; ++k) sx_p[k * 128 + wtid] = p[k];
            sx_f[wtid] = alpha[0];
            sx_f[128 + wtid] = alpha[1];
            vw_bar_arrive(VW_BAR_PREADY);
        };

        if (n_tiles > 0) {  // tile 0: its S and softmax (O is still zero: no rescale)
            float s[32], alpha[2];
            wgmma_fence();
            vw_issue_qk(s, sq_addr, sk_addr0);
            wgmma_wait<0>();
            wgmma_fence_regs(s);
            softmax(s, 0, alpha);
            publish(alpha);
        }
        // Tile i: P V of tile i - 1 issued first, then S of tile i; once P V is done (wait<1>), tile i - 1's
        // buffer is free for tile i + 1 (warpgroup 1 loads it while S and the softmax of tile i run). The loop
        // body has no branch between the MMAs and their waits (the barriers are predicated): with one, ptxas
        // serialises the MMAs.
        for (int i = 1; i < n_tiles; ++i) {
            const int buf = i & 1;
            float s[32], alpha[2];
            wgmma_fence();
            vw_issue_pv(acc, p, sk_addr0 + (buf ^ 1) * VW_K_BYTES, 0);
            vw_bar_sync_if(i >= VW_STAGES, VW_BAR_KREADY + buf);
            vw_issue_qk(s, sq_addr, sk_addr0 + buf * VW_K_BYTES);
            wgmma_wait<1>();  // P V of tile i - 1
            vw_bar_arrive_if(i + 1 < n_tiles, VW_BAR_KFREE);
            wgmma_wait<0>();  // S of tile i
            wgmma_fence_regs(s);
            wgmma_fence_regs(acc);
            wgmma_keep_regs(p);
            softmax(s, i, alpha);
            vw_rescale(acc, alpha);
            vw_bar_sync(VW_BAR_PFREE);  // warpgroup 1 has taken P of tile i - 1
            publish(alpha);
        }
        if (n_tiles > 0) {
            wgmma_fence();
            vw_issue_pv(acc, p, sk_addr0 + ((n_tiles - 1) & 1) * VW_K_BYTES, 0);
        }
        wgmma_wait<0>();
        wgmma_fence_regs(acc);
        wgmma_keep_regs(p);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_run[h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            l_row[h] = l;
            m_row[h] = m_run[h];
        }
        if (n_tiles > 0) {
            vw_bar_sync(VW_BAR_PFREE);
            sx_f[wtid] = l_row[0];
            sx_f[128 + wtid] = l_row[1];
            vw_bar_arrive(VW_BAR_PREADY);
        }
    } else {
        for (int i = 0; i < n_tiles; ++i) {
            const int buf = i & 1;
            wgmma_wait<0>();  // P V of tile i - 1
            wgmma_fence_regs(acc);
            wgmma_keep_regs(p);
            const bool load = i >= 1 && i + 1 < n_tiles;
            if (load) {  // tile i + 1 into tile i - 1's buffer, once warpgroup 0 is done with it
                vw_bar_sync(VW_BAR_KFREE);
                unsigned char* tile = sk0 + (buf ^ 1) * VW_K_BYTES;
                vw_load_key_tile<128>(tile, tile + (VW_DIM_BLOCKS - 1) * VW_K_BLOCK_BYTES, kv_b,
                                      key_begin + (i + 1) * VW_BN, kv_len, wtid);
                cp_async_commit();
            }
            vw_bar_sync(VW_BAR_PREADY);
#pragma unroll
            for (int k = 0; k < 16; ++k) p[k] = sx_p[k * 128 + wtid];
            const float alpha[2] = {sx_f[wtid], sx_f[128 + wtid]};
            vw_bar_arrive(VW_BAR_PFREE);
            vw_rescale(acc, alpha);
            wgmma_fence();
            vw_issue_pv(acc, p, sk_addr0 + buf * VW_K_BYTES, 1);
            if (load) {
                cp_async_wait<0>();
                fence_proxy_async();
                vw_bar_arrive(VW_BAR_KREADY + (buf ^ 1));
            }
        }
        wgmma_wait<0>();
        wgmma_fence_regs(acc);
        wgmma_keep_regs(p);
        if (n_tiles > 0) {
            vw_bar_sync(VW_BAR_PREADY);
            l_row[0] = sx_f[wtid];
            l_row[1] = sx_f[128 + wtid];
        }
    }

    VX_MARK(2);
    // ---- epilogue: each warpgroup writes its 256 dims of the rows it holds
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + r_lo + 8 * h;
        if (row >= rows) continue;
        const float l = l_row[h];
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
            if (wg == 0 && (lane & 3) == 0) partial_lse[prow] = l > 0.f ? m_row[h] + log2f(l) : -INFINITY;
        }
    }
    VX_MARK(3);
    if (splits > 1 && split_counters != nullptr)  // the splits merge here, no combine launch
        va_merge_splits(partial_out, partial_lse, out, split_counters, reinterpret_cast<float*>(smem), batch,
                        rows, splits, row0, min(VW_BM, rows - row0), b, split, tid, VW_THREADS);
    VX_MARK(4);
#endif  // VW_ENABLED
}

// info[0]: shared memory one block of ddtree_verify_attn_wgmma needs; info[1]: 1 where the wgmma kernel is
// compiled in for the running device (sm_90a code), else 0; info[2]: keys per key tile (the split plan's unit).
extern "C" __global__ void ddtree_verify_attn_wgmma_info(int* info) {
    info[0] = VW_SMEM_BYTES;
    info[1] = VW_ENABLED;
    info[2] = VW_BN;
}
