// DDTree draft-tree build on the GPU: one thread block per request, the whole batch in one launch.
//
// Output contract: byte-identical to SGLang's CPU `build_ddtree_tree_from_topk` (a heapq best-first search
// over entries (-logw, ranks, parent, depth, rank, logw)), padded to the budget N (see ddtree_bench.tree).
//
// How the heap's pop sequence is reproduced without a sequential heap
// -------------------------------------------------------------------
// Every candidate path x = (r_1, ..., r_d) has a score E(x) that depends only on the path: the heap
// computes it through the generator chain (first child: E(p) + lp[d-1][0]; next sibling:
// E(x) - lp[d-1][r] + lp[d-1][r+1]), in float64 from float32 inputs, left to right. The kernel evaluates
// exactly those operations (__dadd_rn/__dsub_rn: never contracted or reordered), so E is the heap's value.
// With key(x) = (-E(x), ranks(x)), a child never precedes its parent and a sibling never precedes its elder
// sibling unless E(sibling) > E(elder) (possible by one rounding when lp[r] == lp[r+1]: the "anomaly").
// Without anomalies the heap pops the paths in global key order, so the tree is the N smallest keys in
// sorted order. The kernel therefore
//   1. grows, depth by depth, a candidate pool U that provably contains the first N pops: every pruned path
//      is beaten by N pool paths by more than a rigorous rounding-error margin (see `margin` below);
//   2. evaluates E exactly for every pool path (sibling chains evaluated in parallel where each step is
//      exact -- checked with an error-free TwoSum -- and sequentially from the first inexact step on);
//   3. orders the pool by (-E, preorder rank in the ranks trie == Python tuple order): preorder ranks by a
//      walk over the depths (no barrier per depth), the first N selected exactly by radix selection, and
//      only those sorted (bitonic, in registers and shuffles);
//   4. writes the first N as the tree, with parents, depths, tokens, retrieve_next_token/sibling and the
//      ancestor mask as packed bits (built in shared memory), and the bool form where asked (the block's own
//      rows, or ddtree_expand_visibility launched next over the whole GPU).
// Budgets <= 64 (up to 128 when asked) run the heap itself in one warp instead: ddtree_build_tree_warp1/2/4,
// code in tree_build_warp.cuh.
// Where the fast path cannot prove its result -- an anomaly inside the pool, or a pool that would overflow
// its shared-memory capacity (massive exact ties) -- the block runs the exact sequential heap instead
// (thread 0, same entries and tie order as Python's heapq), and records that in `stats`.

#include <cstdint>

#include "tree_build_common.cuh"
#include "tree_build_warp.cuh"
#include "tree_build_bool.cuh"

#define DDT_MAX_DEPTH 32
#define DDT_FLAG_FORCE_HEAP 1
#define DDT_FLAG_ROWS_IN_SMEM 4

namespace {

// Exclusive scan of data[0, n) in place by the whole block; returns the total (to every thread).
__device__ int block_exclusive_scan(int* data, int n, int* warp_buf) {
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int per = (n + nthreads - 1) / nthreads;
    const int begin = min(n, tid * per), end = min(n, begin + per);
    int local = 0;
    for (int i = begin; i < end; ++i) local += data[i];
    const int lane = tid & 31, warp = tid >> 5, nwarps = (nthreads + 31) >> 5;
    int incl = local;
    for (int off = 1; off < 32; off <<= 1) {
        int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
    }
    if (lane == 31) warp_buf[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? warp_buf[lane] : 0;
        int wi = w;
        for (int off = 1; off < 32; off <<= 1) {
            int v = __shfl_up_sync(0xffffffffu, wi, off);
            if (lane >= off) wi += v;
        }
        if (lane < nwarps) warp_buf[lane] = wi - w;  // exclusive warp offsets
        if (lane == 31) warp_buf[32] = wi;          // total
    }
    __syncthreads();
    int run = warp_buf[warp] + incl - local;
    for (int i = begin; i < end; ++i) {
        int v = data[i];
        data[i] = run;
        run += v;
    }
    int total = warp_buf[32];
    __syncthreads();
    return total;
}

// Exclusive scan of one value a thread (thread order) by the whole block, two barriers; total to every thread.
__device__ int block_exclusive_scan_one(int v, int* warp_buf, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    int incl = v;
    for (int off = 1; off < 32; off <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += u;
    }
    if (lane == 31) warp_buf[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int w = lane < nwarps ? warp_buf[lane] : 0;
        int wi = w;
        for (int off = 1; off < 32; off <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, wi, off);
            if (lane >= off) wi += u;
        }
        __syncwarp();
        if (lane < nwarps) warp_buf[lane] = wi - w;  // exclusive warp offsets
        if (lane == 31) warp_buf[32] = wi;
    }
    __syncthreads();
    total = warp_buf[32];
    return warp_buf[warp] + incl - v;
}

__device__ int block_sum(int v, int* warp_buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) warp_buf[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? warp_buf[lane] : 0;
        for (int off = 16; off > 0; off >>= 1) w += __shfl_down_sync(0xffffffffu, w, off);
        if (lane == 0) warp_buf[32] = w;
    }
    __syncthreads();
    int total = warp_buf[32];
    __syncthreads();
    return total;
}

// Number of r in [0, topk) with fl(base + row[r]) >= t (row sorted descending, so a prefix). The prefix is
// mostly short once a bound exists (a few children a parent), so a galloping search first (r = 0, 2, 6, 14,
// ...: about 2 log2(count) probes instead of log2(topk)), then a binary search between the last probe that
// held and the first that did not.
__device__ __forceinline__ int count_at_least(const float* row, int topk, double base, double t) {
    int lo = 0, hi = topk;  // every r < lo holds, every r >= hi fails
    for (int step = 1; lo < hi; step <<= 1) {
        const int probe = min(lo + step - 1, hi - 1);
        if (__dadd_rn(base, static_cast<double>(row[probe])) >= t) lo = probe + 1;
        else { hi = probe; break; }
    }
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (__dadd_rn(base, static_cast<double>(row[mid])) >= t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

struct Pool {
    double* E;        // exact heap score of the path
    double* Q;        // monotone pruning score: min(fl(E(parent) + lp), Q(parent))
    int* tmp;         // scan scratch [cap + 1]
    int* aux;         // per-parent scratch [cap]
    short* par;       // pool index of the parent, -1 = root
    short* pre;       // preorder rank (tie order)
    short* sz;        // node index of an entry (0 = not in the tree)
    unsigned short* rnk;
    unsigned short* order;
    unsigned char* dep;
};

struct Nodes {  // node-indexed (0 = root), filled by either path, read by the output stage
    short* parent;
    short* prev;    // elder sibling's node index (rank > 0), unused for rank 0
    unsigned short* rank;
    unsigned char* depth;
};

// ---- the exact sequential heap (fallback) -----------------------------------------------------------
// Entries mirror Python's (-logw, ranks, parent, depth, rank, logw); ranks are not stored but recovered
// from the parent node chain when two scores tie.

struct HeapView {
    double* key;           // logw
    short* parent;         // parent node index
    short* prev;           // node that pushed this entry (elder sibling) or -1
    unsigned short* rank;
    unsigned char* depth;
};

__device__ int ranks_of(const Nodes& nodes, int parent, int rank, unsigned short* out) {
    // ranks tuple of an entry whose parent node is `parent` and own rank `rank`, root first.
    int len = 0;
    unsigned short rev[DDT_MAX_DEPTH];
    rev[len++] = static_cast<unsigned short>(rank);
    for (int v = parent; v > 0; v = nodes.parent[v]) rev[len++] = nodes.rank[v];
    for (int i = 0; i < len; ++i) out[i] = rev[len - 1 - i];
    return len;
}

// true when entry a pops before entry b (a < b in Python's tuple order)
__device__ bool heap_less(const HeapView& h, const Nodes& nodes, int a, int b) {
    double ka = h.key[a], kb = h.key[b];
    if (ka != kb) return ka > kb;  // -logw ascending
    unsigned short ra[DDT_MAX_DEPTH], rb[DDT_MAX_DEPTH];
    int la = ranks_of(nodes, h.parent[a], h.rank[a], ra);
    int lb = ranks_of(nodes, h.parent[b], h.rank[b], rb);
    int m = la < lb ? la : lb;
    for (int i = 0; i < m; ++i)
        if (ra[i] != rb[i]) return ra[i] < rb[i];
    return la < lb;
}

__device__ void heap_swap(HeapView& h, int a, int b) {
    double k = h.key[a]; h.key[a] = h.key[b]; h.key[b] = k;
    short p = h.parent[a]; h.parent[a] = h.parent[b]; h.parent[b] = p;
    short q = h.prev[a]; h.prev[a] = h.prev[b]; h.prev[b] = q;
    unsigned short r = h.rank[a]; h.rank[a] = h.rank[b]; h.rank[b] = r;
    unsigned char d = h.depth[a]; h.depth[a] = h.depth[b]; h.depth[b] = d;
}

__device__ void heap_push(HeapView& h, const Nodes& nodes, int& size, double key, int parent, int prev,
                          int rank, int depth) {
    int i = size++;
    h.key[i] = key; h.parent[i] = static_cast<short>(parent); h.prev[i] = static_cast<short>(prev);
    h.rank[i] = static_cast<unsigned short>(rank); h.depth[i] = static_cast<unsigned char>(depth);
    while (i > 0) {
        int up = (i - 1) >> 1;
        if (!heap_less(h, nodes, i, up)) break;
        heap_swap(h, i, up);
        i = up;
    }
}

__device__ void heap_pop_top(HeapView& h, const Nodes& nodes, int& size) {
    --size;
    if (size == 0) return;
    heap_swap(h, 0, size);
    int i = 0;
    while (true) {
        int l = 2 * i + 1, r = l + 1, best = i;
        if (l < size && heap_less(h, nodes, l, best)) best = l;
        if (r < size && heap_less(h, nodes, r, best)) best = r;
        if (best == i) break;
        heap_swap(h, i, best);
        i = best;
    }
}

// Runs on one thread; returns the node count.
__device__ int sequential_heap(const float* lp, int L, int K, int topk, int budget, HeapView h,
                               const Nodes& nodes) {
    int size = 0, count = 0;
    heap_push(h, nodes, size, static_cast<double>(lp[0]), 0, -1, 0, 1);
    while (size > 0 && count < budget) {
        double logw = h.key[0];
        int parent = h.parent[0], prev = h.prev[0], rank = h.rank[0], depth = h.depth[0];
        heap_pop_top(h, nodes, size);
        int cur = ++count;
        nodes.parent[cur] = static_cast<short>(parent);
        nodes.prev[cur] = static_cast<short>(prev);
        nodes.rank[cur] = static_cast<unsigned short>(rank);
        nodes.depth[cur] = static_cast<unsigned char>(depth);
        const float* row = lp + static_cast<long long>(depth - 1) * K;
        if (rank + 1 < topk) {
            double s = __dadd_rn(__dsub_rn(logw, static_cast<double>(row[rank])),
                                 static_cast<double>(row[rank + 1]));
            heap_push(h, nodes, size, s, parent, cur, rank + 1, depth);
        }
        if (depth < L) {
            double c = __dadd_rn(logw, static_cast<double>(lp[static_cast<long long>(depth) * K]));
            heap_push(h, nodes, size, c, cur, -1, 0, depth + 1);
        }
    }
    return count;
}

// ---- the parallel path ------------------------------------------------------------------------------

// Keep the pool entries whose flag tmp[i] (0 or 1, written before a barrier) is set, preserving order and
// remapping parents. Returns the new size; `at` (an index < size) becomes the number of kept entries before
// it (its new index where it is kept).
__device__ int compact_pool(Pool& p, int size, int* warp_buf, int& at) {
    const int kept = block_exclusive_scan(p.tmp, size, warp_buf);  // tmp[i] = kept entries before i
    at = p.tmp[at];
    // move in chunks of blockDim so each thread holds one element in registers
    for (int base = 0; base < size; base += blockDim.x) {
        int i = base + threadIdx.x;
        bool live = i < size && (i + 1 < size ? p.tmp[i + 1] : kept) > p.tmp[i];
        double e = 0, q = 0; short pr = -1; unsigned short rk = 0; unsigned char dp = 0; int dst = 0;
        if (live) {
            e = p.E[i]; q = p.Q[i]; pr = p.par[i]; rk = p.rnk[i]; dp = p.dep[i]; dst = p.tmp[i];
            if (pr >= 0) pr = static_cast<short>(p.tmp[pr]);
        }
        __syncthreads();
        if (live) { p.E[dst] = e; p.Q[dst] = q; p.par[dst] = pr; p.rnk[dst] = rk; p.dep[dst] = dp; }
        __syncthreads();
    }
    return kept;
}

// The same for at most two entries a thread, keeping those with Q >= keep_at: each thread reads entries
// 2t and 2t + 1 into registers before the scan's barriers, so every read precedes every move and the moves
// need no barrier of their own (four barriers in all; compact_pool takes three plus two a block of
// entries, and its caller one more for the flags).
__device__ int compact_pool_pairs(Pool& p, int size, int* warp_buf, int& at, double keep_at) {
    const int i0 = 2 * static_cast<int>(threadIdx.x), i1 = i0 + 1;
    double e0 = 0, q0 = 0, e1 = 0, q1 = 0;
    short pr0 = -1, pr1 = -1;
    unsigned short rk0 = 0, rk1 = 0;
    unsigned char dp0 = 0, dp1 = 0;
    bool keep0 = false, keep1 = false;
    if (i0 < size) {
        e0 = p.E[i0]; q0 = p.Q[i0]; pr0 = p.par[i0]; rk0 = p.rnk[i0]; dp0 = p.dep[i0];
        keep0 = q0 >= keep_at;
    }
    if (i1 < size) {
        e1 = p.E[i1]; q1 = p.Q[i1]; pr1 = p.par[i1]; rk1 = p.rnk[i1]; dp1 = p.dep[i1];
        keep1 = q1 >= keep_at;
    }
    int kept;
    const int o0 = block_exclusive_scan_one(static_cast<int>(keep0) + static_cast<int>(keep1), warp_buf, kept);
    const int o1 = o0 + static_cast<int>(keep0);
    if (i0 < size) p.tmp[i0] = o0;  // kept entries before i
    if (i1 < size) p.tmp[i1] = o1;
    __syncthreads();
    at = p.tmp[at];
    if (keep0) {
        p.E[o0] = e0; p.Q[o0] = q0; p.par[o0] = pr0 >= 0 ? static_cast<short>(p.tmp[pr0]) : pr0;
        p.rnk[o0] = rk0; p.dep[o0] = dp0;
    }
    if (keep1) {
        p.E[o1] = e1; p.Q[o1] = q1; p.par[o1] = pr1 >= 0 ? static_cast<short>(p.tmp[pr1]) : pr1;
        p.rnk[o1] = rk1; p.dep[o1] = dp1;
    }
    __syncthreads();
    return kept;
}

// Radix selection, 8-bit digits from the most significant end. Two 256-bin histograms take turns: a pass
// counts into the one zeroed by the pass before (or at the kernel's start) and zeroes the other, so a pass
// costs two barriers. `turn` (block-uniform) says which histogram is clean.
struct Histograms {
    int (*bins)[256];  // [2][256], shared
    int turn;
};
struct RadixPick {
    int digit;  // the digit holding the want-th largest entry
    int above;  // entries in larger digits
    int count;  // entries in that digit
};

// One pass over entries [0, size): digit_of(i) is i's digit, or -1 where i is not a candidate. Every thread
// gets the same pick; want must not exceed the candidates.
template <class DigitOf>
__device__ RadixPick radix_pick(int size, int want, Histograms& h, DigitOf digit_of) {
    __shared__ RadixPick s_pick;
    int* hist = h.bins[h.turn & 1];
    int* next = h.bins[(h.turn + 1) & 1];
    ++h.turn;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) next[i] = 0;
    // warp-aggregated histogram: most keys share their leading digits, so plain atomics would serialize
    for (int base = threadIdx.x & ~31; base < size; base += blockDim.x) {
        const int i = base + (threadIdx.x & 31);
        const int digit = i < size ? digit_of(i) : -1;
        const unsigned int peers = __match_any_sync(0xffffffffu, digit);
        if (digit >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // one warp finds the digit holding the want-th largest entry
        const int lane = threadIdx.x, top = 255 - 8 * lane;  // lane 0: digits 255..248
        int h[8], sum = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {  // eight independent loads, then registers only
            h[k] = hist[top - k];
            sum += h[k];
        }
        int incl = sum;
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += v;
        }
        const unsigned int ball = __ballot_sync(0xffffffffu, incl >= want);
        if (ball == 0u && lane == 0) s_pick = RadixPick{-1, incl, 0};  // fewer candidates than want
        if (lane == __ffs(ball) - 1) {
            int acc = incl - sum, k = 0;
#pragma unroll
            for (int j = 0; j < 7; ++j)  // the first of the lane's digits where the count reaches want
                if (k == j && acc + h[j] < want) { acc += h[j]; k = j + 1; }
            int count = h[0];
#pragma unroll
            for (int j = 1; j < 8; ++j) count = k == j ? h[j] : count;
            s_pick = RadixPick{top - k, acc, count};
        }
    }
    __syncthreads();
    return s_pick;  // read by every thread before the next pass's first barrier, its next write after it
}

// Largest value t (as a bucket floor: the 24 most significant bits of the ordered key) such that at least
// `need` entries have Q >= t. Valid lower bound.
__device__ double select_lower_bound(const Pool& p, int size, int need, Histograms& h) {
    unsigned long long prefix = 0ull;
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = 56 - 8 * pass;
        const unsigned long long mask = pass == 0 ? 0ull : (~0ull << (64 - 8 * pass));
        const RadixPick pick = radix_pick(size, need, h, [&](int i) {
            const unsigned long long k = ordered_key(p.Q[i]);
            return (k & mask) == prefix ? static_cast<int>((k >> shift) & 255) : -1;
        });
        need -= pick.above;
        prefix |= static_cast<unsigned long long>(pick.digit) << shift;
    }
    return key_to_double(prefix);
}

// A lower bound of the same kind from a single pass, for the prunes once a bound exists: 256 equal buckets
// of Q over [lo, hi] (entries below lo are not candidates, those above hi count in the top bucket). At least
// `need` entries lie in the bucket holding the need-th largest or above it, so its floor is a valid bound;
// half a bucket lower absorbs the rounding of the bucket arithmetic (the caller makes sure hi - lo is not
// tiny against |lo| and |hi|). -inf where that bucket is the lowest (no better than lo). Coarser than
// select_lower_bound (a bucket is (hi - lo) / 256 wide), one pass instead of three.
__device__ double bucket_lower_bound(const Pool& p, int size, int need, Histograms& h, double lo, double hi) {
    const double width = hi - lo, scale = 256.0 / width;
    const RadixPick pick = radix_pick(size, need, h, [&](int i) {
        const double q = p.Q[i];
        if (!(q >= lo)) return -1;
        const double x = (q - lo) * scale;
        return x >= 255.0 ? 255 : static_cast<int>(x);
    });
    if (pick.digit <= 0) return -__longlong_as_double(0x7ff0000000000000ll);
    return lo + (static_cast<double>(pick.digit) - 0.5) * (width / 256.0);
}

// The n-th largest (n <= size) of the pool's composite keys (ordered_key(E), 0xffff - preorder) -- the
// heap's pop order, preorders being unique: afterwards exactly n entries have a composite >= (t_key,
// t_inv_pre). Passes 0..7 take the key's bytes, 8 and 9 the high and low byte of 0xffff - preorder; stops
// at the first pass whose chosen digit holds exactly the entries still wanted (at the latest at the last,
// as composites are unique).
__device__ void select_top_n(const Pool& p, int size, int n, Histograms& h, unsigned long long& t_key,
                             int& t_inv_pre) {
    unsigned long long key_prefix = 0ull;
    int pre_prefix = 0, want = n;
    for (int pass = 0; pass < 10; ++pass) {
        const unsigned long long key_mask = pass >= 8 ? ~0ull : (pass == 0 ? 0ull : (~0ull << (64 - 8 * pass)));
        const int pre_mask = pass == 9 ? 0xff00 : 0;
        const RadixPick pick = radix_pick(size, want, h, [&](int i) {
            const unsigned long long k = ordered_key(p.E[i]);
            const int inv = 0xffff - p.pre[i];
            if ((k & key_mask) != key_prefix || (inv & pre_mask) != pre_prefix) return -1;
            return pass < 8 ? static_cast<int>((k >> (56 - 8 * pass)) & 255) : (pass == 8 ? inv >> 8 : inv & 255);
        });
        want -= pick.above;
        if (pass < 8) key_prefix |= static_cast<unsigned long long>(pick.digit) << (56 - 8 * pass);
        else pre_prefix |= pass == 8 ? pick.digit << 8 : pick.digit;
        if (pick.count == want) break;
    }
    t_key = key_prefix;
    t_inv_pre = pre_prefix;
}

}  // namespace

#include "tree_build_wide.cuh"

// Builds tree blockIdx.x; returns where its packed rows can be read by the block afterwards: the shared
// memory they were built in when they fit there all at once, else the output (nullptr for a block past the
// batch).
__device__ __forceinline__ const unsigned int* build_tree(DDT_BUILD_PARAMS) {
#ifdef DDT_HOST_EMULATOR  // tests/test_tree_build_block_emulator.py runs this code on the CPU
    unsigned char* smem = DDT_HOST_EMULATOR_SHARED;
#else
    extern __shared__ __align__(16) unsigned char smem[];
#endif
    __shared__ int warp_buf[33];
    __shared__ int hist_bins[2][256];
    __shared__ int s_flag;
    __shared__ int s_inexact;  // some candidate score of this depth was rounded
    __shared__ double s_margin;

    const int b = blockIdx.x;
    if (b >= batch) return nullptr;
    const int N = budget;
    const int N1 = N + 1;
    const int topk = min(N, K);
    const float* lp = top_log_probs + static_cast<long long>(b) * L * K;
    const long long* ids = top_token_ids + static_cast<long long>(b) * L * K;

    // ---- carve shared memory
    unsigned char* sp = smem;
    Pool pool;
    pool.E = reinterpret_cast<double*>(sp); sp += sizeof(double) * cap;
    pool.Q = reinterpret_cast<double*>(sp); sp += sizeof(double) * cap;
    pool.tmp = reinterpret_cast<int*>(sp); sp += sizeof(int) * (cap + 1);
    pool.aux = reinterpret_cast<int*>(sp); sp += sizeof(int) * cap;
    pool.par = reinterpret_cast<short*>(sp); sp += sizeof(short) * cap;
    pool.pre = reinterpret_cast<short*>(sp); sp += sizeof(short) * cap;
    pool.sz = reinterpret_cast<short*>(sp); sp += sizeof(short) * cap;
    pool.rnk = reinterpret_cast<unsigned short*>(sp); sp += sizeof(unsigned short) * cap;
    pool.order = reinterpret_cast<unsigned short*>(sp); sp += sizeof(unsigned short) * cap;
    pool.dep = sp; sp += cap;
    sp = smem + ((sp - smem + 15) & ~static_cast<long long>(15));
    Nodes nodes;
    nodes.parent = reinterpret_cast<short*>(sp); sp += sizeof(short) * N1;
    nodes.prev = reinterpret_cast<short*>(sp); sp += sizeof(short) * N1;
    nodes.rank = reinterpret_cast<unsigned short*>(sp); sp += sizeof(unsigned short) * N1;
    nodes.depth = sp; sp += N1;
    sp = smem + ((sp - smem + 15) & ~static_cast<long long>(15));
    const bool staged = (flags & DDT_FLAG_ROWS_IN_SMEM) != 0;
    float* srows = reinterpret_cast<float*>(sp);
    if (staged) {
        sp += sizeof(float) * L * topk;
        // rows of topk floats, 16 bytes a load where K and topk allow (the input is 16-byte aligned), as many
        // rows a pass as the block holds (one division a thread, not one an element)
        const bool aligned = (reinterpret_cast<unsigned long long>(top_log_probs) & 15) == 0;
        const int vec = aligned && ((K | topk) & 3) == 0 ? 4 : 1, per_row = topk / vec;
        const int threads = static_cast<int>(blockDim.x);
        const bool fits = per_row <= threads;  // a row a thread each, several rows a pass
        const int rows_at_once = fits ? threads / per_row : 1;
        const int d0 = fits ? static_cast<int>(threadIdx.x) / per_row : 0;
        const int r0 = static_cast<int>(threadIdx.x) - d0 * per_row, r_step = fits ? per_row : threads;
        if (d0 < rows_at_once) {
            for (int d = d0; d < L; d += rows_at_once) {
                for (int r = r0; r < per_row; r += r_step) {
                    const float* src = lp + static_cast<long long>(d) * K + r * vec;
                    float* dst = srows + d * topk + r * vec;
                    if (vec == 4) *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
                    else *dst = *src;
                }
            }
        }
    }
    const float* rowbase = staged ? srows : lp;
    const long long rs = staged ? topk : K;  // row stride

    // ---- rounding-error margin: every pool score is within delta of the exact real path sum.
    // Bound: each float64 operation on the chain errs by at most 2^-53 |result| <= 2^-53 * smax, where smax
    // bounds every intermediate (sum over depths of the row minimum, plus one more row minimum); a path
    // passes through at most L * (2 * topk + 1) operations. Twice that, times 8 in the proof of pruning.
    if (threadIdx.x < 32) {
        double mins = 0.0, maxrow = 0.0;
        for (int d = threadIdx.x; d < L; d += 32) {
            double m = -static_cast<double>(lp[static_cast<long long>(d) * K + topk - 1]);
            mins += m;
            maxrow = fmax(maxrow, m);
        }
        for (int off = 16; off > 0; off >>= 1) {
            mins += __shfl_down_sync(0xffffffffu, mins, off);
            maxrow = fmax(maxrow, __shfl_down_sync(0xffffffffu, maxrow, off));
        }
        if (threadIdx.x == 0) {
            double ops = static_cast<double>(L) * (2.0 * topk + 2.0) + 4.0;
            double delta = 2.0 * ops * ldexp(1.0, -53) * (mins + maxrow) * 1.0000001;
            s_margin = 8.0 * delta;
            s_flag = (flags & DDT_FLAG_FORCE_HEAP) ? DDT_STAT_HEAP_FORCED : DDT_STAT_FAST;
        }
    }
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist_bins[0][i] = 0;  // the radix passes' first
    Histograms hists{hist_bins, 0};
    __syncthreads();
    const double margin = s_margin;
    long long* prof = profile ? profile + static_cast<long long>(b) * 8 : nullptr;
    if (prof && threadIdx.x == 0) { prof[0] = clock64(); prof[4] = prof[5] = prof[6] = 0; }

    int n = 0;  // nodes in the tree
    if (s_flag == DDT_STAT_FAST) {
        // ================= fast path =================
        int size = 0;                 // pool size
        int front_begin = 0, front_end = 0;
        double beta = -__longlong_as_double(0x7ff0000000000000ll);  // -inf: no bound yet
        bool have_beta = false;
        for (int d = 1; d <= L; ++d) {
            const float* row = rowbase + static_cast<long long>(d - 1) * rs;
            const bool root = d == 1;
            const int nparents = root ? 1 : front_end - front_begin;
            if (nparents == 0) break;
            // 1. children per parent above the pruning threshold
            const double thr = have_beta ? beta - margin : beta;
            auto children = [&](int j) -> int {
                if (root) return have_beta ? count_at_least(row, topk, 0.0, thr) : topk;
                const int pidx = front_begin + j;
                return (have_beta && pool.Q[pidx] < thr) ? 0
                       : (have_beta ? count_at_least(row, topk, pool.E[pidx], thr) : topk);
            };
            int total;
            if (nparents <= static_cast<int>(blockDim.x)) {  // a parent a thread: scanned in registers
                const int j = threadIdx.x;
                const int c = j < nparents ? children(j) : 0;
                const int offset = block_exclusive_scan_one(c, warp_buf, total);
                if (j < nparents) pool.tmp[j] = offset;  // published by the barrier before the expansion
            } else {
                for (int j = threadIdx.x; j < nparents; j += blockDim.x) pool.tmp[j] = children(j);
                __syncthreads();
                total = block_exclusive_scan(pool.tmp, nparents, warp_buf);
            }
            if (total == 0) break;
            if (size + total > cap) {
                if (prof && threadIdx.x == 0) { prof[5] += 1; prof[4] -= clock64(); }
                // 2. tighten: raise beta to the N-th best over pool + candidates, by bisection on the
                //    ordered 64-bit key of the value (exact in at most 64 steps).
                //    count(t) = #pool{Q >= t} + sum_p #{r: fl(E_p + lp[r]) >= t and Q_p >= t}.
                unsigned long long lo = ordered_key(have_beta ? beta : -1e300);
                unsigned long long hi = ordered_key(0.0) + 1;  // count(hi) < N or hi is above every score
                while (hi - lo > 1) {
                    unsigned long long midk = lo + ((hi - lo) >> 1);
                    double mid = key_to_double(midk);
                    int local = 0;
                    for (int i = threadIdx.x; i < size; i += blockDim.x) local += pool.Q[i] >= mid;
                    for (int j = threadIdx.x; j < nparents; j += blockDim.x) {
                        double base = root ? 0.0 : pool.E[front_begin + j];
                        bool ok = root || pool.Q[front_begin + j] >= mid;
                        if (ok) local += count_at_least(row, topk, base, mid);
                    }
                    int cnt = block_sum(local, warp_buf);
                    if (cnt >= N) lo = midk; else hi = midk;
                    if (cnt >= N && cnt <= N + (cap - N) / 2) break;  // a valid, tight enough bound
                }
                {
                    double t = key_to_double(lo);  // at least N known or candidate paths score >= t
                    if (!have_beta || t > beta) { beta = t; have_beta = true; }
                }
                // prune the pool and recount
                for (int i = threadIdx.x; i < size; i += blockDim.x) pool.tmp[i] = pool.Q[i] >= beta - margin;
                __syncthreads();
                // the frontier (depth d-1) is the tail of the pool: it starts after every shallower entry
                size = compact_pool(pool, size, warp_buf, front_begin);
                if (root) front_begin = 0;
                front_end = size;
                const int np2 = root ? 1 : front_end - front_begin;
                const double thr2 = beta - margin;
                for (int j = threadIdx.x; j < np2; j += blockDim.x) {
                    int c;
                    if (root) c = count_at_least(row, topk, 0.0, thr2);
                    else {
                        int pidx = front_begin + j;
                        c = pool.Q[pidx] < thr2 ? 0 : count_at_least(row, topk, pool.E[pidx], thr2);
                    }
                    pool.tmp[j] = c;
                }
                __syncthreads();
                total = block_exclusive_scan(pool.tmp, np2, warp_buf);
                if (size + total > cap) {  // too many near-ties to hold: exact heap instead
                    if (threadIdx.x == 0) s_flag = DDT_STAT_HEAP_OVERFLOW;
                    __syncthreads();
                    break;
                }
                if (prof && threadIdx.x == 0) prof[4] += clock64();
                if (total == 0) break;
            }
            const int np = root ? 1 : front_end - front_begin;
            if (threadIdx.x == 0) pool.tmp[np] = total;
            // 3. expand: slot j -> (parent, rank); candidate score fl(E_p + lp[r]) and its exactness
            for (int j = threadIdx.x; j < np; j += blockDim.x) pool.aux[j] = 0x7fffffff;  // first inexact
            if (threadIdx.x == 0) s_inexact = 0;
            __syncthreads();
            for (int j = threadIdx.x; j < total; j += blockDim.x) {
                int lo = 0, hi = np;  // last parent with tmp[parent] <= j
                while (hi - lo > 1) {
                    int mid = (lo + hi) >> 1;
                    if (pool.tmp[mid] <= j) lo = mid; else hi = mid;
                }
                // skip parents with zero children (equal offsets): lo is the last with offset <= j
                int r = j - pool.tmp[lo];
                int pidx = root ? -1 : front_begin + lo;
                double base = root ? 0.0 : pool.E[pidx];
                double a = static_cast<double>(row[r]);
                double s = __dadd_rn(base, a);
                // TwoSum: s == base + a exactly?
                double bb = __dsub_rn(s, base);
                double err = __dadd_rn(__dsub_rn(base, __dsub_rn(s, bb)), __dsub_rn(a, bb));
                if (err != 0.0) { atomicMin(&pool.aux[lo], r); atomicOr(&s_inexact, 1); }
                int at = size + j;
                pool.E[at] = s;
                double qp = root ? 0.0 : pool.Q[pidx];
                pool.Q[at] = fmin(s, qp);
                pool.par[at] = static_cast<short>(pidx);
                pool.rnk[at] = static_cast<unsigned short>(r);
                pool.dep[at] = static_cast<unsigned char>(d);
            }
            __syncthreads();
            // 4. sibling chains past their first inexact step: sequential, exactly as the heap (nothing to do,
            //    and no barrier, where every step was exact)
            if (s_inexact) {
                for (int j = threadIdx.x; j < np; j += blockDim.x) {
                    int first = pool.aux[j];
                    int cnt = pool.tmp[j + 1] - pool.tmp[j];
                    if (first < cnt - 1) {
                        int at = size + pool.tmp[j];
                        double e = pool.E[at + first];
                        for (int r = first + 1; r < cnt; ++r) {
                            e = __dadd_rn(__dsub_rn(e, static_cast<double>(row[r - 1])),
                                          static_cast<double>(row[r]));
                            pool.E[at + r] = e;
                        }
                    }
                }
                __syncthreads();
            }
            front_begin = size;
            size += total;
            front_end = size;
            // 5. once N paths are known, prune what N known paths beat by more than the margin
            if (size >= N && size > 2 * N) {
                if (prof && threadIdx.x == 0) prof[6] -= clock64();
                // every pool entry has Q <= min(0, the best first log-prob); once a bound exists, every one
                // that counts has Q >= beta - margin: one pass of equal buckets over that range
                const double lo = beta - margin, hi = fmin(static_cast<double>(rowbase[0]), 0.0);
                const bool buckets = have_beta && fabs(lo) <= 1.7976931348623157e308 && hi > lo &&
                                     hi - lo >= ldexp(fmax(fabs(lo), fabs(hi)), -30);
                const double t = buckets ? bucket_lower_bound(pool, size, N, hists, lo, hi)
                                         : select_lower_bound(pool, size, N, hists);
                if (!have_beta || t > beta) { beta = t; have_beta = true; }
                // the frontier (depth d) starts after every shallower entry
                if (size <= 2 * static_cast<int>(blockDim.x)) {
                    size = compact_pool_pairs(pool, size, warp_buf, front_begin, beta - margin);
                } else {
                    for (int i = threadIdx.x; i < size; i += blockDim.x) pool.tmp[i] = pool.Q[i] >= beta - margin;
                    __syncthreads();
                    size = compact_pool(pool, size, warp_buf, front_begin);
                }
                front_end = size;
                if (prof && threadIdx.x == 0) prof[6] += clock64();
            } else if (size >= N && !have_beta) {
                beta = select_lower_bound(pool, size, N, hists);
                have_beta = true;
            }
        }
        if (prof && threadIdx.x == 0) prof[7] = clock64();
        if (s_flag == DDT_STAT_FAST) {
            // anomaly check: a younger sibling scoring above its elder breaks sorted order == pop order
            int bad = 0;
            for (int i = threadIdx.x; i < size; i += blockDim.x)
                if (pool.rnk[i] > 0 && pool.E[i] > pool.E[i - 1]) bad = 1;
            if (block_sum(bad, warp_buf) > 0) {
                if (threadIdx.x == 0) s_flag = DDT_STAT_HEAP_ANOMALY;
                __syncthreads();
            }
        }
        if (s_flag == DDT_STAT_FAST) {
            // preorder ranks in the pool trie (Python's tuple order of the ranks, a proper prefix first).
            // The pool is ordered by depth, and within a depth by the ranks tuple (expansion in parent order,
            // siblings by rank; compaction keeps the order), so its parent indices are sorted. An entry y
            // precedes x at depth d' < depth(x) iff y is at or before x's ancestor there; at depth(x) iff y is
            // before x; at d' > depth(x) iff y's ancestor at depth(x) is before x, i.e. y lies before the
            // first entry of depth d' descending from x or a later entry: lo(d') = childstart[lo(d' - 1)],
            // lo(depth(x)) = x, where childstart[i] = the first pool index whose parent is >= i. The sum over
            // the depths is x's preorder rank, counted without a barrier per depth.
            __shared__ int s_dstart[DDT_MAX_DEPTH + 2];  // entries of depth d: [s_dstart[d], s_dstart[d + 1])
            int* childstart = pool.tmp;                   // [size + 1]
            for (int i = threadIdx.x; i <= size; i += blockDim.x) {
                const int d = i < size ? pool.dep[i] : L + 1;
                for (int dd = (i > 0 ? pool.dep[i - 1] : 0) + 1; dd <= d; ++dd) s_dstart[dd] = i;
                int lo = 0, hi = size;  // the first j with par[j] >= i
                while (lo < hi) {
                    const int mid = (lo + hi) >> 1;
                    if (pool.par[mid] < i) lo = mid + 1; else hi = mid;
                }
                childstart[i] = lo;
            }
            __syncthreads();
            const int max_depth = pool.dep[size - 1];
            for (int x = threadIdx.x; x < size; x += blockDim.x) {
                const int dx = pool.dep[x];
                int rank = x - s_dstart[dx];
                for (int d = dx - 1, v = pool.par[x]; d >= 1; --d, v = pool.par[v]) rank += v - s_dstart[d] + 1;
                for (int d = dx + 1, lo = x; d <= max_depth; ++d) {
                    lo = childstart[lo];
                    rank += lo - s_dstart[d];
                }
                pool.pre[x] = static_cast<short>(rank);
            }
            __syncthreads();
            // the first n = min(N, size) pool entries in (E descending, preorder ascending) order: select
            // exactly them, then sort only those (the pool holds up to cap entries, the tree N).
            n = min(N, size);
            int m = 1;  // the sort's size: a power of two
            while (m < n) m <<= 1;
            int m_pool = m;
            while (m_pool < size) m_pool <<= 1;
            // where the whole pool fits the sort of one element a thread, no selection: all of it is sorted
            // (one more merge level costs less than the selection's radix passes)
            if (m_pool <= static_cast<int>(blockDim.x)) m = m_pool;
            const int chosen = size <= m ? size : n;
            unsigned long long t_key = 0ull;  // every entry's key is above 0
            int t_inv_pre = 0;
            if (chosen < size) select_top_n(pool, size, n, hists, t_key, t_inv_pre);
            // bitonic sort of the chosen (E descending, preorder ascending); values carry the pool index.
            // Q and tmp are dead here and hold the keys: sk = E, sv = preorder << 16 | pool index.
            double* sk = pool.Q;
            int* sv = pool.tmp;
            const double NEG_INF = -__longlong_as_double(0x7ff0000000000000ll);
            if (threadIdx.x == 0) warp_buf[0] = 0;
            __syncthreads();
            for (int base = threadIdx.x & ~31; base < size; base += blockDim.x) {
                const int i = base + (threadIdx.x & 31);
                bool in = false;
                if (i < size) {
                    const unsigned long long k = ordered_key(pool.E[i]);
                    in = k > t_key || (k == t_key && 0xffff - pool.pre[i] >= t_inv_pre);
                }
                const unsigned int ball = __ballot_sync(0xffffffffu, in);
                int at = 0;
                if ((threadIdx.x & 31) == 0 && ball) at = atomicAdd(&warp_buf[0], __popc(ball));
                at = __shfl_sync(0xffffffffu, at, 0) + __popc(ball & ((1u << (threadIdx.x & 31)) - 1u));
                if (in) { sk[at] = pool.E[i]; sv[at] = (static_cast<int>(pool.pre[i]) << 16) | i; }
            }
            // padding after the chosen: -inf, and values above every real one (preorder < 2^14), unique, so
            // that every key of the sort is distinct
            const int PAD_V = 0x40000000;
            for (int i = chosen + threadIdx.x; i < m; i += blockDim.x) { sk[i] = NEG_INF; sv[i] = PAD_V + i; }
            __syncthreads();
            const int* sorted_v = sv;  // where the sorted values end up
            if (m <= static_cast<int>(blockDim.x)) {
                // one element a thread. Runs of 32: a bitonic sort in registers by shuffles (its last merge
                // puts every run in the same order). Then the runs merge pairwise, doubling in length: the
                // element at index i of its run goes to i + (the number of elements of the partner run that
                // come before it), found by a binary search (keys are distinct), through two shared buffers
                // taking turns (Q/tmp and E/aux, dead here), one barrier a level.
                const int t = threadIdx.x;
                const int M = max(m, 32);  // whole warps
                double e = t < m ? sk[t] : NEG_INF;
                int v = t < m ? sv[t] : PAD_V + t;
                for (int k = 2; k <= 32; k <<= 1) {
                    for (int j = k >> 1; j > 0; j >>= 1) {
                        const double oe = __shfl_xor_sync(0xffffffffu, e, j);
                        const int ov = __shfl_xor_sync(0xffffffffu, v, j);
                        // the lower index of an ascending pair, or the upper of a descending one, keeps the
                        // element that comes first; the last merge (k = 32) sorts every run ascending
                        const bool want_first = k == 32 ? (t & j) == 0 : ((t & j) == 0) == ((t & k) == 0);
                        const bool mine_first = e > oe || (e == oe && v < ov);
                        if (mine_first != want_first) { e = oe; v = ov; }
                    }
                }
                double* ae = sk;
                int* av = sv;
                double* be = pool.E;
                int* bv = pool.aux;
                if (t < M) { ae[t] = e; av[t] = v; }
                __syncthreads();
                for (int run = 32; run < M; run <<= 1) {
                    if (t < M) {
                        const double x = ae[t];
                        const int xv = av[t];
                        const int first = t & ~(2 * run - 1), mine = t & run, i = t & (run - 1);
                        const int other = first + (mine ^ run);  // the partner run's first index
                        int lo = 0, hi = run;                      // partner elements before x: [0, lo)
                        while (lo < hi) {
                            const int mid = (lo + hi) >> 1;
                            const double pe = ae[other + mid];
                            if (pe > x || (pe == x && av[other + mid] < xv)) lo = mid + 1;
                            else hi = mid;
                        }
                        be[first + i + lo] = x;
                        bv[first + i + lo] = xv;
                    }
                    __syncthreads();
                    double* te = ae; ae = be; be = te;
                    int* tv = av; av = bv; bv = tv;
                }
                sorted_v = av;
            } else {
                for (int k = 2; k <= m; k <<= 1) {
                    for (int j = k >> 1; j > 0; j >>= 1) {
                        for (int t = threadIdx.x; t < (m >> 1); t += blockDim.x) {
                            const int i = 2 * t - (t & (j - 1));
                            const int l = i + j;
                            const double ea = sk[i], ec = sk[l];
                            const int va = sv[i], vc = sv[l];
                            const bool a_first = ea > ec || (ea == ec && va < vc);
                            if (a_first != ((i & k) == 0)) { sk[i] = ec; sk[l] = ea; sv[i] = vc; sv[l] = va; }
                        }
                        __syncthreads();
                    }
                }
            }
            for (int pos = threadIdx.x; pos < n; pos += blockDim.x)
                pool.order[pos] = static_cast<unsigned short>(sorted_v[pos] & 0xffff);
            __syncthreads();
            // node index of every pool entry (0 = not in the tree)
            for (int i = threadIdx.x; i < size; i += blockDim.x) pool.sz[i] = 0;
            __syncthreads();
            for (int pos = threadIdx.x; pos < n; pos += blockDim.x) pool.sz[pool.order[pos]] = static_cast<short>(pos + 1);
            __syncthreads();
            for (int pos = threadIdx.x; pos < n; pos += blockDim.x) {
                int x = pool.order[pos];
                int i = pos + 1;
                nodes.parent[i] = pool.par[x] < 0 ? 0 : pool.sz[pool.par[x]];
                nodes.prev[i] = pool.rnk[x] > 0 ? pool.sz[x - 1] : -1;
                nodes.rank[i] = pool.rnk[x];
                nodes.depth[i] = pool.dep[x];
            }
            __syncthreads();
        }
    }
    if (s_flag != DDT_STAT_FAST) {
        if (threadIdx.x == 0) {
            HeapView h;
            h.key = pool.E;
            h.parent = pool.par;
            h.prev = pool.pre;
            h.rank = pool.rnk;
            h.depth = pool.dep;
            warp_buf[0] = sequential_heap(lp, L, K, topk, N, h, nodes);
        }
        __syncthreads();
        n = warp_buf[0];
        __syncthreads();
    }

    // ================= outputs =================
    if (prof && threadIdx.x == 0) prof[1] = clock64();
    if (threadIdx.x == 0) {
        node_count[b] = n;
        if (stats) stats[b] = s_flag;
        nodes.parent[0] = -1;
        nodes.depth[0] = 0;
    }
    long long* tok_out = node_token_ids + static_cast<long long>(b) * N;
    long long* dep_out = node_depths + static_cast<long long>(b) * N;
    int* par_out = parents + static_cast<long long>(b) * N1;
    long long* nt_out = retrieve_next_token + static_cast<long long>(b) * N1;
    long long* ns_out = retrieve_next_sibling + static_cast<long long>(b) * N1;
    for (int i = threadIdx.x; i < N1; i += blockDim.x) {
        nt_out[i] = -1;
        ns_out[i] = -1;
    }
    __syncthreads();
    for (int i = 1 + threadIdx.x; i <= N; i += blockDim.x) {
        if (i <= n) {
            int d = nodes.depth[i];
            tok_out[i - 1] = ids[static_cast<long long>(d - 1) * K + nodes.rank[i]];
            dep_out[i - 1] = d;
            par_out[i] = nodes.parent[i];
            if (nodes.rank[i] == 0) nt_out[nodes.parent[i]] = i;
            else ns_out[nodes.prev[i]] = i;
        } else {
            tok_out[i - 1] = -1;
            dep_out[i - 1] = 0;
            par_out[i] = -1;
        }
    }
    if (threadIdx.x == 0) par_out[0] = -1;

    // packed ancestor bits, built in shared memory (the pool's memory is dead by now), as many rows at a
    // time as fit: zeroed with 16-byte stores, then each row's thread writes its nonzero words (walking from
    // the node up to the root, the ancestors' indices decrease, so every word is finished in one run), then
    // copied out with coalesced 16-byte stores (the buffer is offset so its words line up with the output's).
    const int W = (N1 + 31) >> 5;
    unsigned int* bits = visibility_bits + static_cast<long long>(b) * N1 * W;
    const unsigned int* tree_bits = bits;
    __syncthreads();
    if (prof && threadIdx.x == 0) prof[2] = clock64();
    {
        // the pool's words, less room for the alignment offset and the 16-byte zeroing
        const int words_at_once = static_cast<int>((reinterpret_cast<unsigned char*>(nodes.parent) - smem) / 4) - 8;
        const int rows_at_once = words_at_once / W;
        for (int r0 = 0; r0 < N1; r0 += rows_at_once) {
            const int rows = min(rows_at_once, N1 - r0), words = rows * W;
            unsigned int* out = bits + static_cast<long long>(r0) * W;
            const int head = static_cast<int>((16 - (reinterpret_cast<unsigned long long>(out) & 15)) & 15) >> 2;
            unsigned int* s_bits = reinterpret_cast<unsigned int*>(smem) + ((4 - head) & 3);  // s_bits + head: 16 B
            uint4* s_vec = reinterpret_cast<uint4*>(smem);
            for (int q = threadIdx.x; q < (words + 7) >> 2; q += blockDim.x) s_vec[q] = make_uint4(0u, 0u, 0u, 0u);
            __syncthreads();
            for (int i = r0 + threadIdx.x; i <= min(n, r0 + rows - 1); i += blockDim.x) {
                unsigned int* row = s_bits + (i - r0) * W;
                int w = i >> 5;
                unsigned int acc = 0u;
                for (int v = i;; v = nodes.parent[v]) {  // i, its ancestors, the root (parent[0] = -1)
                    const int vw = v >> 5;
                    if (vw != w) { row[w] = acc; w = vw; acc = 0u; }
                    acc |= 1u << (v & 31);
                    if (v == 0) break;
                }
                row[0] = acc;
            }
            __syncthreads();
            const int h = min(head, words), nvec = (words - h) >> 2;
            if (threadIdx.x < h) out[threadIdx.x] = s_bits[threadIdx.x];
            const uint4* src = reinterpret_cast<const uint4*>(s_bits + h);
            uint4* dst = reinterpret_cast<uint4*>(out + h);
            for (int q = threadIdx.x; q < nvec; q += blockDim.x) dst[q] = src[q];
            for (int q = h + 4 * nvec + threadIdx.x; q < words; q += blockDim.x) out[q] = s_bits[q];
            __syncthreads();
            if (rows == N1) tree_bits = s_bits;  // the whole tree in one part: it stays in shared memory
        }
    }
    __syncthreads();  // bits of this tree are visible to the whole block from here
    if (prof && threadIdx.x == 0) prof[3] = clock64();
    return tree_bits;
}

// visibility: the bool mask [B, N+1, N+1] to write as well (each block its own tree's rows, read from the
// packed rows in shared memory where they were built there in one part), or null (packed
// bits only; ddtree_expand_visibility can expand them over the whole GPU afterwards).
extern "C" __global__ void __launch_bounds__(1024)
    ddtree_build_tree(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility) {
    const unsigned int* tree_bits = build_tree(DDT_BUILD_ARGS);
    if (visibility != nullptr && tree_bits != nullptr) {
        const int N1 = budget + 1;
        expand_own_tree(tree_bits, N1, (N1 + 31) >> 5, blockIdx.x, visibility);
    }
}


// The wide single-tree path (tree_build_wide.cuh): one block of many threads per tree, any depth, for
// small batches. visibility: the bool mask to write as well, or null (packed bits only).
extern "C" __global__ void __launch_bounds__(1024)
    ddtree_build_tree_wide(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility) {
    wide_build_tree(DDT_BUILD_ARGS, visibility);
}

// The bool ancestor mask [B, N+1, N+1] from the packed bits, spread over the whole GPU (grid-stride over
// 16-byte chunks of the batch's flat mask; chunks that cross a tree or span more than two rows go byte by
// byte). Launched after ddtree_build_tree on the same stream when a consumer wants the bool form.
extern "C" __global__ void ddtree_expand_visibility(const unsigned int* __restrict__ bits, int batch,
                                                   int budget, unsigned char* __restrict__ visibility) {
    const int N1 = budget + 1;
    const int W = (N1 + 31) >> 5;
    const long long S = static_cast<long long>(N1) * N1;
    const long long total = S * batch;
    // Division by S and N1 as a multiply-high by ceil(2^64 / d): exact here, since q * (error < d) stays
    // below 2^64 for every q < total (< 2^40) and d <= S (< 2^23).
    const unsigned long long inv_s = ~0ull / static_cast<unsigned long long>(S) + 1ull;
    const unsigned long long inv_n1 = ~0ull / static_cast<unsigned long long>(N1) + 1ull;
    auto div_s = [&](long long q) {
        return static_cast<long long>(__umul64hi(static_cast<unsigned long long>(q), inv_s));
    };
    auto div_n1 = [&](int q) { return static_cast<int>(__umul64hi(static_cast<unsigned long long>(q), inv_n1)); };
    auto bit_at = [&](long long q) -> unsigned int {
        long long b = div_s(q);
        int rem = static_cast<int>(q - b * S);
        int r = div_n1(rem), c = rem - r * N1;
        return (bits[(b * N1 + r) * W + (c >> 5)] >> (c & 31)) & 1u;
    };
    const long long nchunks = total >> 4;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    uint4* out = reinterpret_cast<uint4*>(visibility);  // allocation is 256-byte aligned
    for (long long ci = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; ci < nchunks;
         ci += stride) {
        const long long q = ci << 4;
        const long long b = div_s(q);
        const int rem = static_cast<int>(q - b * S);
        const int r = div_n1(rem), c = rem - r * N1;
        unsigned int v = 0u;
        if (rem + 16 <= S && N1 >= 16) {
            v = chunk_bits16(bits + (b * N1 + r) * W, W, N1, c);
        } else {
            for (int k = 0; k < 16; ++k) v |= bit_at(q + k) << k;
        }
        out[ci] = bool_bytes16(v);
    }
    for (long long q = (nchunks << 4) + blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; q < total;
         q += stride)
        visibility[q] = static_cast<unsigned char>(bit_at(q));
}

// The warp kernels: budgets up to 32, 64 and 128 (one, two and four heap slots per lane), depth <= 32.
// visibility: the bool mask [B, N+1, N+1] to write as well, or null (packed bits only).
extern "C" __global__ void __launch_bounds__(32)
    ddtree_build_tree_warp1(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility) {
    warp_build_tree<1>(DDT_BUILD_ARGS, visibility);
}
extern "C" __global__ void __launch_bounds__(32)
    ddtree_build_tree_warp2(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility) {
    warp_build_tree<2>(DDT_BUILD_ARGS, visibility);
}
extern "C" __global__ void __launch_bounds__(32)
    ddtree_build_tree_warp4(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility) {
    warp_build_tree<4>(DDT_BUILD_ARGS, visibility);
}
