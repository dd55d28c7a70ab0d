// The one-warp heap of the tree-build kernels (budgets <= 128), included by tree_build.cu (its extern "C"
// entries ddtree_build_tree_warp1/2/4) and by the host emulator in tests/test_tree_build_emulator.py, which
// runs this very code on the CPU, a host thread per lane.
#pragma once

#include "tree_build_common.cuh"

// ---- small budgets: the heap simulated by one warp ----------------------------------------------------
// One warp per request, no block barriers. The live heap entries sit in registers, SLOTS per lane: a pop
// frees its slot and pushes at most two entries (the next sibling and the first child: one into the freed
// slot, one into a new one), so before the k-th pop at most k slots were ever used and N <= 32 * SLOTS
// fits. Pops come in rounds. A round starts with a warp-wide arg-max of the 64-bit ordered key of logw (two
// redux.sync), then, only where several entries share the best logw, an arg-min of their ranks tuples: 8
// bits a level (rank + 1, 0 for an absent level), 32 levels in four 64-bit words compared from the most
// significant end == Python's tuple order, built by walking the popped ancestors. Then the round keeps
// popping the better successor of the last pop while it is strictly above every other live entry and every
// successor the round left behind (float64 comparisons, every lane computing the same straight-line steps):
// on a peaked tree a chain of first children, on a flat one a run of siblings, at about 200 cycles a pop
// against about 500 for a round. After the last pop (warp_write_outputs, a function of its own so that its
// code leaves the pops' alone) every lane walks the ancestors of its nodes for their mask rows and ORs each
// row into the flat bits of the bool mask in shared memory (row i at bit i * (N + 1)), so that every 16
// bytes of the bool mask are one funnel shift of two words; the packed mask, and the bool mask when asked
// for, come out of this one launch. Inputs: the log-prob rows and token ids are staged in shared memory
// with cp.async.
namespace {

constexpr int WARP_PATH_WORDS = 4;  // 4 x 64 bits = 32 levels of 8 bits

__device__ __forceinline__ int warp_meta(int parent, int prev, int rank, int depth) {
    // parent node (8 bits) | pusher node + 1 (8 bits) | rank (7 bits) | depth (6 bits)
    return parent | ((prev + 1) << 8) | (rank << 16) | (depth << 23);
}

__device__ __forceinline__ unsigned long long level_field(int word, int depth, int rank) {
    const int level = depth - 1;
    return word == (level >> 3) ? static_cast<unsigned long long>(rank + 1) << (56 - 8 * (level & 7)) : 0ull;
}

#ifndef DDT_HOST_EMULATOR  // the host emulator (tests) brings its own copies
__device__ __forceinline__ void cp_async(void* dst, const void* src, int bytes) {
    const unsigned int d = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
    if (bytes == 8) asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
#endif

// The ranks tuple of the entry (parent node, rank, depth) as four words (see above), from the popped
// nodes' meta (ancestor walk).
__device__ __forceinline__ void ranks_words(const int* node_meta, int parent, int rank, int depth,
                                            unsigned long long (&q)[WARP_PATH_WORDS]) {
#pragma unroll
    for (int w = 0; w < WARP_PATH_WORDS; ++w) q[w] = level_field(w, depth, rank);
    for (int v = parent; v != 0;) {
        const int m = node_meta[v];
#pragma unroll
        for (int w = 0; w < WARP_PATH_WORDS; ++w) q[w] += level_field(w, (m >> 23) & 0x3f, (m >> 16) & 0x7f);
        v = m & 0xff;
    }
}

// Among the entries whose key equals `best` (at least two), the one whose ranks tuple is smallest; returns
// (slot << 5) | lane of the winner, the same on every lane.
template <int SLOTS>
__device__ int tie_break(const unsigned long long (&key)[SLOTS], const int (&meta)[SLOTS],
                         unsigned long long best, const int* node_meta) {
    const int lane = threadIdx.x & 31;
    __syncwarp();  // lane 0's node_meta stores are visible
    unsigned long long p[WARP_PATH_WORDS];
#pragma unroll
    for (int w = 0; w < WARP_PATH_WORDS; ++w) p[w] = ~0ull;
    int id = 0x7fffffff;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        if (key[s] != best) continue;
        unsigned long long q[WARP_PATH_WORDS];
        ranks_words(node_meta, meta[s] & 0xff, (meta[s] >> 16) & 0x7f, (meta[s] >> 23) & 0x3f, q);
        bool less = false, decided = false;
#pragma unroll
        for (int w = 0; w < WARP_PATH_WORDS; ++w)
            if (!decided && q[w] != p[w]) { less = q[w] < p[w]; decided = true; }
        if (id == 0x7fffffff || less) {
#pragma unroll
            for (int w = 0; w < WARP_PATH_WORDS; ++w) p[w] = q[w];
            id = (s << 5) | lane;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        unsigned long long o[WARP_PATH_WORDS];
#pragma unroll
        for (int w = 0; w < WARP_PATH_WORDS; ++w) o[w] = __shfl_xor_sync(0xffffffffu, p[w], off);
        const int oid = __shfl_xor_sync(0xffffffffu, id, off);
        bool less = false, decided = false;
#pragma unroll
        for (int w = 0; w < WARP_PATH_WORDS; ++w)
            if (!decided && o[w] != p[w]) { less = o[w] < p[w]; decided = true; }
        if (oid != 0x7fffffff && (id == 0x7fffffff || less)) {
#pragma unroll
            for (int w = 0; w < WARP_PATH_WORDS; ++w) p[w] = o[w];
            id = oid;
        }
    }
    return id;
}

// The warp kernels' dynamic shared memory (its size: warp_shared_bytes in ddtree_bench/builders/gpu.py): token
// ids [L*topk] i64, log-prob rows [L*topk] f32, popped nodes' meta [N1], next token / sibling [N1] each,
// packed mask rows [N1*W] u32, the flat bits of the bool mask (row i at bit i * N1) [N1*N1 / 32 + 1] u32.
struct WarpShared {
    long long* ids;
    float* rows;
    int* meta;
    int* next;
    int* sib;
    unsigned int* mask;
    unsigned int* flat;
    __device__ __forceinline__ WarpShared(unsigned char* sp, int L, int topk, int N1, int W) {
        ids = reinterpret_cast<long long*>(sp); sp += sizeof(long long) * L * topk;
        rows = reinterpret_cast<float*>(sp); sp += sizeof(float) * L * topk;
        meta = reinterpret_cast<int*>(sp); sp += sizeof(int) * N1;
        next = reinterpret_cast<int*>(sp); sp += sizeof(int) * N1;
        sib = reinterpret_cast<int*>(sp); sp += sizeof(int) * N1;
        mask = reinterpret_cast<unsigned int*>(sp); sp += sizeof(unsigned int) * N1 * W;
        flat = reinterpret_cast<unsigned int*>(sp);
    }
};

template <int SLOTS>
__device__ __noinline__ void warp_write_outputs(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility, int n);

template <int SLOTS>
__device__ __forceinline__ void warp_build_tree(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility) {
#ifdef DDT_HOST_EMULATOR
    unsigned char* smem = DDT_HOST_EMULATOR_SHARED;
#else
    extern __shared__ __align__(16) unsigned char smem[];
#endif
    const int b = blockIdx.x;
    if (b >= batch) return;
    const int lane = threadIdx.x;
    const int N = budget, N1 = N + 1, W = (N1 + 31) >> 5;
    const int topk = min(N, K);
    const float* lp = top_log_probs + static_cast<long long>(b) * L * K;
    const long long* ids = top_token_ids + static_cast<long long>(b) * L * K;
    long long* prof = profile ? profile + static_cast<long long>(b) * 8 : nullptr;
    if (prof && lane == 0) prof[0] = clock64();

    const WarpShared sh(smem, L, topk, N1, W);
    long long* s_ids = sh.ids;
    float* s_rows = sh.rows;
    int* s_meta = sh.meta;

    for (int i = lane, d = lane / topk, r = lane - d * topk; i < L * topk; i += 32) {
        const long long at = static_cast<long long>(d) * K + r;
        cp_async(s_rows + i, lp + at, 4);
        cp_async(s_ids + i, ids + at, 8);
        for (r += 32; r >= topk; r -= topk) ++d;
    }
    cp_async_commit();
    for (int i = lane; i < N1; i += 32) { sh.next[i] = -1; sh.sib[i] = -1; }
    cp_async_wait_all();
    __syncwarp();
    if (prof && lane == 0) prof[4] = clock64();  // staged

    unsigned long long key[SLOTS];
    int meta[SLOTS];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) { key[s] = 0ull; meta[s] = 0; }  // key 0: empty (every real key > 0)
    if (lane == 0) {
        key[0] = ordered_key(__dadd_rn(static_cast<double>(s_rows[0]), 0.0));  // + 0.0: -0.0 == 0.0
        meta[0] = warp_meta(0, -1, 0, 1);
    }
    int ncand = 1, count = 0;
    while (count < N) {
        unsigned long long lane_best = key[0];
#pragma unroll
        for (int s = 1; s < SLOTS; ++s) lane_best = key[s] > lane_best ? key[s] : lane_best;
        const unsigned int lane_hi = static_cast<unsigned int>(lane_best >> 32);
        const unsigned int hi = __reduce_max_sync(0xffffffffu, lane_hi);
        const unsigned int lo =
            __reduce_max_sync(0xffffffffu, lane_hi == hi ? static_cast<unsigned int>(lane_best) : 0u);
        const unsigned long long best = (static_cast<unsigned long long>(hi) << 32) | lo;
        if (best == 0ull) break;  // the heap is drained
        int mine = 0, my = 0;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s)
            if (key[s] == best) { ++mine; my = (s << 30) | meta[s]; }
        const unsigned int holders = __ballot_sync(0xffffffffu, mine != 0);
        const bool unique = __popc(holders) == 1 && (SLOTS == 1 || !__any_sync(0xffffffffu, mine > 1));
        int m, wlane, wslot;
        if (unique) {
            wlane = __ffs(holders) - 1;
            m = __shfl_sync(0xffffffffu, my, wlane);
            wslot = (m >> 30) & 3;
            m &= 0x3fffffff;
        } else {  // several entries share the best logw: the smallest ranks tuple pops first
            const int id = tie_break<SLOTS>(key, meta, best, s_meta);
            wlane = id & 31;
            wslot = id >> 5;
            int mm = meta[0];
#pragma unroll
            for (int s = 1; s < SLOTS; ++s) mm = wslot == s ? meta[s] : mm;
            m = __shfl_sync(0xffffffffu, mm, wlane);
        }
        // A round pops the winner, then keeps popping the better of the last pop's two successors while it
        // is strictly above every other live entry and every successor this round left behind: exactly the
        // heap's next pop. Anything closer ends the round; the next round's arg-max and tie break decide.
        // The other live entries are summed up by their best key's high word (conservative), as the largest
        // double with that high word: `ahead` must beat it.
        unsigned int lane_other = 0u;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const unsigned int h = static_cast<unsigned int>(key[s] >> 32);
            if (!(lane == wlane && s == wslot) && h > lane_other) lane_other = h;
            if (lane == wlane && s == wslot) key[s] = 0ull;  // freed: the round's first push goes here
        }
        const unsigned int other_hi = __reduce_max_sync(0xffffffffu, lane_other);
        const double minus_inf = __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
        double ahead = other_hi == 0u
            ? minus_inf : key_to_double((static_cast<unsigned long long>(other_hi) << 32) | 0xffffffffull);
        // the next push goes to slot id `target` (slot * 32 + lane): the winner's freed slot first, then
        // new ones (ncand: the next id never used)
        int target = (wslot << 5) | wlane;
        int parent = m & 0xff, rank = (m >> 16) & 0x7f, depth = (m >> 23) & 0x3f;
        double E = key_to_double(best);
        // the popped node's own log-prob, its next sibling's and its first child's, as doubles (indices
        // clamped: a missing successor is never scored)
        auto lp_at = [&](int d, int r) { return static_cast<double>(s_rows[d * topk + r]); };
        double lp_self = lp_at(depth - 1, rank), lp_next = lp_at(depth - 1, min(rank + 1, topk - 1));
        double lp_child = lp_at(min(depth, L - 1), 0);
        bool more = true;
        while (more) {  // straight-line steps (selects, no branches but the loop's)
            const int cur = ++count;
            if (lane == 0) s_meta[cur] = m;  // (no other shared-memory store here: it slows every step)
            const bool sibling = rank + 1 < topk, child = depth < L, room = cur < N;
            // what either next pop needs, loaded before the choice: a child (depth + 1, rank 0) scores its
            // sibling with row depth, rank 1 and its child with row depth + 1; a sibling scores its own
            // next sibling with rank + 2 of this row (its child row is this node's)
            const double next_child_sib = lp_at(min(depth, L - 1), min(1, topk - 1));
            const double next_child_child = lp_at(min(depth + 1, L - 1), 0);
            const double next_sib_sib = lp_at(depth - 1, min(rank + 2, topk - 1));
            // the successors' scores, exactly the heap's float64 operations
            const double es = sibling ? __dadd_rn(__dsub_rn(E, lp_self), lp_next) : minus_inf;
            const double ec = child ? __dadd_rn(E, lp_child) : minus_inf;
            // on equal scores the child pops first: its ranks tuple (..., rank, 0) < (..., rank + 1)
            const bool pick_child = ec >= es;
            const double ep = pick_child ? ec : es, eo = pick_child ? es : ec;
            const int ms = warp_meta(parent, cur, rank + 1, depth), mc = warp_meta(cur, -1, 0, depth + 1);
            const int mp = pick_child ? mc : ms, mo = pick_child ? ms : mc;
            const bool go = room && ep > ahead;  // never true for a missing successor (-inf)
            // push what is not popped next: the other successor, and the picked one when the round ends
            const bool push_o = room && eo != minus_inf, push_p = room && !go && ep != minus_inf;
            const unsigned long long ko = ordered_key(__dadd_rn(eo, 0.0));  // + 0.0: -0.0 == 0.0
            const unsigned long long kq = ordered_key(__dadd_rn(ep, 0.0));
            // a new slot (id ncand) counts as taken once a push lands there
            const int target_o = target;
            ncand += push_o && target_o == ncand ? 1 : 0;
            target = push_o ? ncand : target;
            const int target_p = target;
            ncand += push_p && target_p == ncand ? 1 : 0;
            target = push_p ? ncand : target;
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) {
                const int id = (s << 5) | lane;
                if (push_o && id == target_o) { key[s] = ko; meta[s] = mo; }
                if (push_p && id == target_p) { key[s] = kq; meta[s] = mp; }
            }
            more = go;
            ahead = eo > ahead ? eo : ahead;
            m = mp;
            E = ep;
            parent = pick_child ? cur : parent;
            depth += pick_child ? 1 : 0;
            rank = pick_child ? 0 : rank + 1;
            lp_self = pick_child ? lp_child : lp_next;
            lp_next = pick_child ? next_child_sib : next_sib_sib;
            lp_child = pick_child ? next_child_child : lp_child;
        }
    }
    __syncwarp();
    if (prof && lane == 0) prof[1] = clock64();
    warp_write_outputs<SLOTS>(DDT_BUILD_ARGS, visibility, count);
}

// The outputs of a warp-built tree of n nodes (a function of its own, so that its code leaves the pops' alone)
template <int SLOTS>
__device__ __noinline__ void warp_write_outputs(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility, int n) {
#ifdef DDT_HOST_EMULATOR
    unsigned char* smem = DDT_HOST_EMULATOR_SHARED;
#else
    extern __shared__ __align__(16) unsigned char smem[];
#endif
    const int b = blockIdx.x, lane = threadIdx.x;
    const int N = budget, N1 = N + 1, W = (N1 + 31) >> 5;
    const int topk = min(N, K);
    long long* prof = profile ? profile + static_cast<long long>(b) * 8 : nullptr;
    const WarpShared sh(smem, L, topk, N1, W);
    const long long* s_ids = sh.ids;
    int* s_meta = sh.meta;
    int* s_next = sh.next;
    int* s_sib = sh.sib;
    unsigned int* s_mask = sh.mask;
    unsigned int* s_flat = sh.flat;
    const int FW = (N1 * N1 + 31) / 32 + 1;  // the flat bits, plus a word for the funnel shift

    // ---- child / sibling links, ancestor masks (node i: itself and its ancestors, root included)
    if (lane < W) s_mask[lane] = lane == 0 ? 1u : 0u;  // the root sees itself
    if (lane == 0) s_meta[0] = 0;                        // the root: its parent field is 0, itself
    if (visibility)
        for (int k = lane; k < FW; k += 32) s_flat[k] = k == 0 ? 1u : 0u;  // the root's row, bit 0
    __syncwarp();
    constexpr int MW = SLOTS + 1;  // 32-bit words of an ancestor mask row: N + 1 <= 32 * SLOTS + 1
    for (int i = 1 + lane; i <= n; i += 32) {
        const int m = s_meta[i];
        if (((m >> 16) & 0x7f) == 0) s_next[m & 0xff] = i;           // the first child
        else s_sib[((m >> 8) & 0xff) - 1] = i;                        // the elder sibling's next
        unsigned int acc[MW];
#pragma unroll
        for (int w = 0; w < MW; ++w) acc[w] = w == 0 ? 1u : 0u;
        for (int v = i; v != 0;) {  // two levels a turn: the root's meta is 0, so its parent is itself
#pragma unroll
            for (int w = 0; w < MW; ++w) acc[w] |= (v >> 5) == w ? 1u << (v & 31) : 0u;
            v = s_meta[v] & 0xff;
#pragma unroll
            for (int w = 0; w < MW; ++w) acc[w] |= (v >> 5) == w ? 1u << (v & 31) : 0u;
            v = s_meta[v] & 0xff;
        }
#pragma unroll
        for (int w = 0; w < MW; ++w) {
            if (w < W) {
                s_mask[i * W + w] = acc[w];
                if (visibility) {  // the same row into the flat bits (it may share words with its neighbours)
                    const int p = i * N1 + 32 * w, sh = p & 31;
                    atomicOr(&s_flat[p >> 5], acc[w] << sh);
                    if (sh != 0) atomicOr(&s_flat[(p >> 5) + 1], acc[w] >> (32 - sh));
                }
            }
        }
    }
    __syncwarp();
    if (prof && lane == 0) prof[5] = clock64();  // links and mask rows
    // the TreeBatch and the packed mask, a row a lane
    const long long o = static_cast<long long>(b);
    unsigned int* bits = visibility_bits + o * N1 * W;
    for (int i = lane; i <= N; i += 32) {
        const bool node = i >= 1 && i <= n;
        const int m = node ? s_meta[i] : 0;
        const int depth = (m >> 23) & 0x3f, rank = (m >> 16) & 0x7f;
        retrieve_next_token[o * N1 + i] = s_next[i];
        retrieve_next_sibling[o * N1 + i] = s_sib[i];
        parents[o * N1 + i] = node ? (m & 0xff) : -1;
        if (i >= 1) {
            node_token_ids[o * N + i - 1] = node ? s_ids[(depth - 1) * topk + rank] : -1;
            node_depths[o * N + i - 1] = node ? depth : 0;
        }
        for (int w = 0; w < W; ++w) bits[i * W + w] = i <= n ? s_mask[i * W + w] : 0u;
    }
    if (lane == 0) {
        node_count[b] = n;
        if (stats) stats[b] = DDT_STAT_WARP_HEAP;
    }
    if (prof && lane == 0) prof[6] = clock64();  // the TreeBatch and the packed mask
    if (visibility) {  // the bool mask [N1, N1] of this tree: 16 bytes a store where aligned
        unsigned char* v = visibility + o * N1 * N1;
        const int S = N1 * N1;
        const int head = min(S, static_cast<int>((16 - (reinterpret_cast<unsigned long long>(v) & 15)) & 15));
        const int chunks = (S - head) >> 4, tail = head + 16 * chunks;
        // one pass over the aligned 16-byte chunks, then the head's and the tail's single bytes
        uint4* vc = reinterpret_cast<uint4*>(v + head);
        for (int u = lane; u < chunks + head + (S - tail); u += 32) {
            const bool chunk = u < chunks;
            const int q = chunk ? head + 16 * u : u - chunks < head ? u - chunks : tail + (u - chunks - head);
            const unsigned int got = __funnelshift_r(s_flat[q >> 5], s_flat[(q >> 5) + 1], q & 31);
            if (chunk) vc[u] = bool_bytes16(got & 0xffffu);
            else v[q] = static_cast<unsigned char>(got & 1u);
        }
    }
    if (prof && lane == 0) { prof[2] = clock64(); prof[3] = prof[2]; }
}

}  // namespace
