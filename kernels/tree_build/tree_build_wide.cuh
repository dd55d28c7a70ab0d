// The wide single-tree path (ddtree_build_tree_wide in tree_build.cu): one block of many threads per tree,
// for small batches (batch 1 is SGLang's DDTree worker) and any depth L (SGLang's worker hands the builder
// L = N rows). Included by tree_build.cu after its helpers (block_exclusive_scan, count_at_least,
// radix_pick, Histograms).
//
// The heap pops paths in key order (-E, ranks) whenever no generator edge in play goes "uphill" (a child or
// younger sibling scoring above the entry that pushes it). This path therefore builds, level by level, a
// pool C of paths that is closed under the generator edges (elder sibling, parent) with their exact heap
// scores, and certifies three things before it trusts key order:
//   (a) every materialised sibling chain is evaluated exactly: a sibling's heap score equals fl(E(p) + lp[r])
//       as long as every earlier step fl(E(p) + lp[j]), j < r, was exact (checked with an error-free TwoSum);
//   (b) no edge inside C goes uphill (child <= parent; younger sibling <= elder, which also catches
//       unsorted rows);
//   (c) every path left out whose generator parent is in C scores below the final threshold t, and at least
//       N pool paths score >= t (or no path was ever left out: C is every path).
// Then, by induction over the pops, the heap's first N pops are C's N smallest keys in order (see
// docs/gpu_kernel.md). If (a), (b) or (c) fails, or C outgrows its shared-memory capacity, the block runs
// the exact sequential heap (any depth) instead and says so in `stats`.

#pragma once

#define DDT_STAT_WIDE 5
#define DDT_STAT_WIDE_HEAP_ANOMALY 6
#define DDT_STAT_WIDE_HEAP_OVERFLOW 7
#define DDT_WIDE_MAX_PREFETCH 8  // row floats a thread prefetches (topk <= 8 * blockDim.x)
#define DDT_WIDE_RAISES 8        // threshold raises a level may take before giving up (overflow)

namespace {

struct WidePool {
    double* E;              // exact heap score
    int* par;               // pool index of the parent, -1 = root
    int* tmp;               // scan scratch [cap + 1]
    int* nid;               // node index of a selected entry
    unsigned short* rnk;    // rank within the parent's row
    unsigned short* dep;    // depth (1 = child of the root)
};

struct WideNodes {  // node-indexed, 0 = root
    int* parent;
    int* prev;      // elder sibling's node index, -1 for rank 0
    unsigned short* rank;
    unsigned short* depth;
};

// Python's tuple order of the ranks of pool entries a != b (a proper prefix first).
__device__ bool wide_ranks_less(const WidePool& p, int a, int b) {
    const int da = p.dep[a], db = p.dep[b];
    int x = a, y = b;
    while (p.dep[x] > db) x = p.par[x];
    while (p.dep[y] > da) y = p.par[y];
    if (x == y) return da < db;
    while (p.par[x] != p.par[y]) { x = p.par[x]; y = p.par[y]; }
    return p.rnk[x] < p.rnk[y];
}

// ---- the exact sequential heap for any depth (fallback), one thread ----------------------------------
struct WideHeap {
    double* key;
    int* parent;   // parent node index
    int* prev;     // node that pushed it as a sibling, -1 for a first child
    unsigned short* rank;
    unsigned short* depth;
};

// entry (pa, ra, da) before entry (pb, rb, db) in Python's ranks-tuple order
__device__ bool wide_entry_ranks_less(const WideNodes& nd, int pa, int ra, int da, int pb, int rb, int db) {
    const int da0 = da, db0 = db;
    while (da > db) { ra = nd.rank[pa]; pa = nd.parent[pa]; --da; }
    while (db > da) { rb = nd.rank[pb]; pb = nd.parent[pb]; --db; }
    if (pa == pb && ra == rb) return da0 < db0;
    while (pa != pb) { ra = nd.rank[pa]; pa = nd.parent[pa]; rb = nd.rank[pb]; pb = nd.parent[pb]; }
    return ra < rb;
}

__device__ bool wide_heap_less(const WideHeap& h, const WideNodes& nd, int a, int b) {
    const double ka = h.key[a], kb = h.key[b];
    if (ka != kb) return ka > kb;
    return wide_entry_ranks_less(nd, h.parent[a], h.rank[a], h.depth[a], h.parent[b], h.rank[b], h.depth[b]);
}

__device__ void wide_heap_swap(WideHeap& h, int a, int b) {
    const double k = h.key[a]; h.key[a] = h.key[b]; h.key[b] = k;
    int t = h.parent[a]; h.parent[a] = h.parent[b]; h.parent[b] = t;
    t = h.prev[a]; h.prev[a] = h.prev[b]; h.prev[b] = t;
    unsigned short u = h.rank[a]; h.rank[a] = h.rank[b]; h.rank[b] = u;
    u = h.depth[a]; h.depth[a] = h.depth[b]; h.depth[b] = u;
}

__device__ void wide_heap_push(WideHeap& h, const WideNodes& nd, int& size, double key, int parent, int prev,
                               int rank, int depth) {
    int i = size++;
    h.key[i] = key; h.parent[i] = parent; h.prev[i] = prev;
    h.rank[i] = static_cast<unsigned short>(rank); h.depth[i] = static_cast<unsigned short>(depth);
    while (i > 0) {
        const int up = (i - 1) >> 1;
        if (!wide_heap_less(h, nd, i, up)) break;
        wide_heap_swap(h, i, up);
        i = up;
    }
}

__device__ void wide_heap_pop(WideHeap& h, const WideNodes& nd, int& size) {
    if (--size == 0) return;
    wide_heap_swap(h, 0, size);
    int i = 0;
    while (true) {
        const int l = 2 * i + 1, r = l + 1;
        int best = i;
        if (l < size && wide_heap_less(h, nd, l, best)) best = l;
        if (r < size && wide_heap_less(h, nd, r, best)) best = r;
        if (best == i) break;
        wide_heap_swap(h, i, best);
        i = best;
    }
}

// SGLang's heap, exactly (entries, scores, tie order); fills the node arrays, returns the node count.
__device__ int wide_sequential_heap(const float* lp, int L, int K, int topk, int budget, WideHeap h,
                                    const WideNodes& nd) {
    int size = 0, count = 0;
    nd.parent[0] = -1;
    nd.rank[0] = 0;
    nd.depth[0] = 0;
    wide_heap_push(h, nd, size, static_cast<double>(lp[0]), 0, -1, 0, 1);
    while (size > 0 && count < budget) {
        const double logw = h.key[0];
        const int parent = h.parent[0], prev = h.prev[0], rank = h.rank[0], depth = h.depth[0];
        wide_heap_pop(h, nd, size);
        const int cur = ++count;
        nd.parent[cur] = parent;
        nd.prev[cur] = prev;
        nd.rank[cur] = static_cast<unsigned short>(rank);
        nd.depth[cur] = static_cast<unsigned short>(depth);
        const float* row = lp + static_cast<long long>(depth - 1) * K;
        if (rank + 1 < topk) {
            const double s = __dadd_rn(__dsub_rn(logw, static_cast<double>(row[rank])),
                                       static_cast<double>(row[rank + 1]));
            wide_heap_push(h, nd, size, s, parent, cur, rank + 1, depth);
        }
        if (depth < L) {
            const double c = __dadd_rn(logw, static_cast<double>(lp[static_cast<long long>(depth) * K]));
            wide_heap_push(h, nd, size, c, cur, -1, 0, depth + 1);
        }
    }
    return count;
}

// Largest bucket floor t (24 leading bits of the ordered key) such that at least `need` of E[0, size) are
// >= t; -inf where no such finite floor exists. Only a threshold: the final certificate decides.
__device__ double wide_lower_bound(const double* E, int size, int need, Histograms& h) {
    unsigned long long prefix = 0ull;
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = 56 - 8 * pass;
        const unsigned long long mask = pass == 0 ? 0ull : (~0ull << (64 - 8 * pass));
        const RadixPick pick = radix_pick(size, need, h, [&](int i) {
            const unsigned long long k = ordered_key(E[i] + 0.0);
            return (k & mask) == prefix ? static_cast<int>((k >> shift) & 255) : -1;
        });
        if (pick.digit < 0) return -__longlong_as_double(0x7ff0000000000000ll);
        need -= pick.above;
        prefix |= static_cast<unsigned long long>(pick.digit) << shift;
    }
    const double t = key_to_double(prefix);
    return t > -__longlong_as_double(0x7ff0000000000000ll) ? t : -__longlong_as_double(0x7ff0000000000000ll);
}

// The ordered key k* of the n-th largest E (n <= size) and `want`: how many entries with key == k* belong
// to the first n (those with a larger key are n - want). Early exit once a digit holds exactly `want`:
// then every entry with that key prefix is taken and k* is the prefix (want = 0 returned as "take all").
__device__ void wide_select_nth(const double* E, int size, int n, Histograms& h, unsigned long long& k_star,
                                unsigned long long& k_mask, int& want) {
    unsigned long long prefix = 0ull, mask = 0ull;
    want = n;
    for (int pass = 0; pass < 8; ++pass) {
        const int shift = 56 - 8 * pass;
        const RadixPick pick = radix_pick(size, want, h, [&](int i) {
            const unsigned long long k = ordered_key(E[i] + 0.0);
            return (k & mask) == prefix ? static_cast<int>((k >> shift) & 255) : -1;
        });
        want -= pick.above;
        prefix |= static_cast<unsigned long long>(pick.digit) << shift;
        mask |= 255ull << shift;
        if (pick.count == want) { want = 0; break; }
    }
    k_star = prefix;
    k_mask = mask;
}

}  // namespace

// Builds tree blockIdx.x with the wide path. `cap`: pool entries the dynamic shared memory holds (the host's
// plan_launch carve-up: see wide_shared_bytes in builders/gpu.py).
__device__ __forceinline__ void wide_build_tree(DDT_BUILD_PARAMS, unsigned char* __restrict__ visibility) {
#ifdef DDT_HOST_EMULATOR
    unsigned char* smem = DDT_HOST_EMULATOR_SHARED;
#else
    extern __shared__ __align__(16) unsigned char smem[];
#endif
    __shared__ int warp_buf[33];
    __shared__ int hist_bins[2][256];
    __shared__ int s_fail;      // 0, or the stats code of the fallback
    __shared__ int s_bad;       // a level's children broke (a) or (b) or (c): set during the level
    __shared__ int s_cut;       // some path was left out (a threshold was set)
    __shared__ int s_count;
    __shared__ double s_t;      // the current threshold

    const int b = blockIdx.x;
    if (b >= batch) return;
    const int N = budget, N1 = N + 1, T = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
    const int topk = min(N, K);
    const float* lp = top_log_probs + static_cast<long long>(b) * L * K;
    const long long* ids = top_token_ids + static_cast<long long>(b) * L * K;
    const double NEG_INF = -__longlong_as_double(0x7ff0000000000000ll);

    unsigned char* sp = smem;
    auto carve = [&](long long bytes) {
        unsigned char* at = sp;
        sp += (bytes + 15) & ~15ll;
        return at;
    };
    WidePool pool;
    pool.E = reinterpret_cast<double*>(carve(8ll * cap));
    pool.par = reinterpret_cast<int*>(carve(4ll * cap));
    pool.tmp = reinterpret_cast<int*>(carve(4ll * (cap + 1)));
    pool.nid = reinterpret_cast<int*>(carve(4ll * cap));
    pool.rnk = reinterpret_cast<unsigned short*>(carve(2ll * cap));
    pool.dep = reinterpret_cast<unsigned short*>(carve(2ll * cap));
    float* rowbuf[2];
    rowbuf[0] = reinterpret_cast<float*>(carve(4ll * topk));
    rowbuf[1] = reinterpret_cast<float*>(carve(4ll * topk));
    WideNodes nodes;
    nodes.parent = reinterpret_cast<int*>(carve(4ll * N1));
    nodes.prev = reinterpret_cast<int*>(carve(4ll * N1));
    nodes.rank = reinterpret_cast<unsigned short*>(carve(2ll * N1));
    nodes.depth = reinterpret_cast<unsigned short*>(carve(2ll * N1));
    int* order = reinterpret_cast<int*>(carve(4ll * N1));

    Histograms hist{hist_bins, 0};
    for (int i = tid; i < 256; i += T) hist_bins[0][i] = 0;
    if (tid == 0) {
        s_fail = (flags & DDT_FLAG_FORCE_HEAP) ? DDT_STAT_HEAP_FORCED : 0;
        s_cut = 0;
        s_bad = 0;
        s_t = NEG_INF;
    }
    // row 0 into the first buffer; row d + 1 is prefetched into registers while level d works
    for (int j = tid; j < topk; j += T) rowbuf[0][j] = lp[j];
    __syncthreads();

    int P = 0, lvl_begin = 0, lvl_end = 0;  // block-uniform
    for (int d = 0; d < L && s_fail == 0 && s_bad == 0; ++d) {
        const float* row = rowbuf[d & 1];
        float pre[DDT_WIDE_MAX_PREFETCH];
        const bool prefetch = d + 1 < L;
        if (prefetch) {
            const float* next = lp + static_cast<long long>(d + 1) * K;
#pragma unroll
            for (int k = 0; k < DDT_WIDE_MAX_PREFETCH; ++k) {
                const int j = tid + k * T;
                pre[k] = j < topk ? next[j] : 0.0f;
            }
        }
        if (d > 0 && lvl_end == lvl_begin) break;
        int total = 0;
        for (int attempt = 0;; ++attempt) {
            const int F = d == 0 ? 1 : lvl_end - lvl_begin;  // the frontier: level d (the root at d = 0)
            const double t = s_t;
            for (int i = tid; i < F; i += T) {
                const double e = d == 0 ? 0.0 : pool.E[lvl_begin + i];
                pool.tmp[i] = e >= t ? count_at_least(row, topk, e, t) : 0;
            }
            __syncthreads();
            total = block_exclusive_scan(pool.tmp, F, warp_buf);
            if (tid == 0) pool.tmp[F] = total;
            __syncthreads();
            if (P + total <= cap) break;
            if (attempt == DDT_WIDE_RAISES) {
                if (tid == 0) s_fail = DDT_STAT_WIDE_HEAP_OVERFLOW;
                __syncthreads();
                break;
            }
            // raise t: the need-th best of the pool and each frontier entry's first m counted children
            const int m = (cap - P) / F;
            for (int q = tid; q < F * m; q += T) {
                const int i = q / m, r = q - i * m;
                const int cnt = pool.tmp[i + 1] - pool.tmp[i];
                const double e = d == 0 ? 0.0 : pool.E[lvl_begin + i];
                pool.E[P + q] = r < cnt ? __dadd_rn(e, static_cast<double>(row[r])) : NEG_INF;
            }
            __syncthreads();
            const double t_new = P + F * m >= N ? wide_lower_bound(pool.E, P + F * m, N, hist) : NEG_INF;
            if (t_new > t) {
                // drop pool entries below the new threshold (order kept, parents remapped)
                if (tid == 0) { s_t = t_new; s_cut = 1; }
                for (int i = tid; i < P; i += T) pool.tmp[i] = pool.E[i] >= t_new ? 1 : 0;
                __syncthreads();
                const int kept = block_exclusive_scan(pool.tmp, P, warp_buf);
                if (tid == 0) pool.tmp[P] = kept;
                __syncthreads();
                for (int base = 0; base < P; base += T) {
                    const int i = base + tid;
                    const bool live = i < P && pool.tmp[i + 1] > pool.tmp[i];
                    double e = 0.0;
                    int pr = -1, dst = 0;
                    unsigned short rk = 0, dp = 0;
                    if (live) {
                        e = pool.E[i]; pr = pool.par[i]; rk = pool.rnk[i]; dp = pool.dep[i]; dst = pool.tmp[i];
                        if (pr >= 0) pr = pool.tmp[pr];  // a kept child's parent scores >= it: kept too
                    }
                    __syncthreads();
                    if (live) { pool.E[dst] = e; pool.par[dst] = pr; pool.rnk[dst] = rk; pool.dep[dst] = dp; }
                    __syncthreads();
                }
                lvl_begin = pool.tmp[lvl_begin];  // the frontier is the last level, [lvl_begin, P)
                P = kept;
                lvl_end = P;
                __syncthreads();
            }
            // else: same threshold, same count: only the raise limit ends it
        }
        if (s_fail != 0) break;
        const int Fc = d == 0 ? 1 : lvl_end - lvl_begin;
        // materialise the children: entry j belongs to the frontier entry i with tmp[i] <= j < tmp[i + 1]
        bool bad = false;
        for (int j = tid; j < total; j += T) {
            int lo = 0, hi = Fc;  // last i with tmp[i] <= j
            while (hi - lo > 1) {
                const int mid = (lo + hi) >> 1;
                if (pool.tmp[mid] <= j) lo = mid;
                else hi = mid;
            }
            const int i = lo, r = j - pool.tmp[i], cnt = pool.tmp[i + 1] - pool.tmp[i];
            const int parent = d == 0 ? -1 : lvl_begin + i;
            const double e = d == 0 ? 0.0 : pool.E[parent];
            const double x = static_cast<double>(row[r]);
            const double s = __dadd_rn(e, x);
            // TwoSum: s is e + x exactly iff the error term is zero
            const double bv = __dsub_rn(s, e), av = __dsub_rn(s, bv);
            const double err = __dadd_rn(__dsub_rn(e, av), __dsub_rn(x, bv));
            if (err != 0.0) bad = true;                         // (a) the chain after step r is not exact
            if (r == 0 ? s > e : s > __dadd_rn(e, static_cast<double>(row[r - 1]))) bad = true;  // (b)
            if (r == cnt - 1 && r + 1 < topk) {                 // (c) the path left out scores below t
                const double nxt = __dadd_rn(e, static_cast<double>(row[r + 1]));
                if (!(nxt < s_t) || nxt > s) bad = true;
            }
            pool.E[P + j] = s;
            pool.par[P + j] = parent;
            pool.rnk[P + j] = static_cast<unsigned short>(r);
            pool.dep[P + j] = static_cast<unsigned short>(d + 1);
        }
        if (bad) atomicOr(&s_bad, 1);
        if (prefetch) {
            float* nb = rowbuf[(d + 1) & 1];
#pragma unroll
            for (int k = 0; k < DDT_WIDE_MAX_PREFETCH; ++k) {
                const int j = tid + k * T;
                if (j < topk) nb[j] = pre[k];
            }
        }
        __syncthreads();
        lvl_begin = P;
        P += total;
        lvl_end = P;
    }
    __syncthreads();
    if (tid == 0 && s_bad != 0 && s_fail == 0) s_fail = DDT_STAT_WIDE_HEAP_ANOMALY;
    __syncthreads();

    // ---- select the first N by key (-E, ranks), in order
    int n = 0;
    if (s_fail == 0) {
        const double t = s_t;
        int live = 0;
        for (int i = tid; i < P; i += T) live += pool.E[i] >= t ? 1 : 0;
        live = block_sum(live, warp_buf);
        if (s_cut != 0 && live < N) {
            if (tid == 0) s_fail = DDT_STAT_WIDE_HEAP_ANOMALY;  // (c) not shown: let the heap decide
            __syncthreads();
        }
    }
    if (s_fail == 0) {
        n = min(N, P);
        // candidates: every entry with a key above the n-th largest, and those tied with it
        unsigned long long k_star = 0ull, k_mask = 0ull;
        int want = 0;
        if (P > n) wide_select_nth(pool.E, P, n, hist, k_star, k_mask, want);
        for (int i = tid; i < P; i += T)
            pool.tmp[i] = (ordered_key(pool.E[i] + 0.0) & k_mask) >= k_star ? 1 : 0;
        __syncthreads();
        const int M = block_exclusive_scan(pool.tmp, P, warp_buf);
        if (tid == 0) pool.tmp[P] = M;
        __syncthreads();
        // the candidates' pool indices, packed into nid's storage (nid is written only after this)
        int* cand = pool.nid;
        for (int i = tid; i < P; i += T)
            if (pool.tmp[i + 1] > pool.tmp[i]) cand[pool.tmp[i]] = i;
        __syncthreads();
        // position of every candidate among the candidates: a warp per candidate, lanes over the others
        const int lane = tid & 31, warp = tid >> 5, nwarps = (T + 31) >> 5;
        for (int c0 = warp; c0 < M; c0 += nwarps) {
            const int x = cand[c0];
            const double ex = pool.E[x];
            int before = 0;
            for (int c1 = lane; c1 < M; c1 += 32) {
                const int y = cand[c1];
                const double ey = pool.E[y];
                before += (ey > ex || (ey == ex && y != x && wide_ranks_less(pool, y, x))) ? 1 : 0;
            }
            for (int off = 16; off > 0; off >>= 1) before += __shfl_down_sync(0xffffffffu, before, off);
            if (lane == 0 && before < n) order[before] = x;
        }
        __syncthreads();
        for (int pos = tid; pos < n; pos += T) pool.nid[order[pos]] = pos + 1;
        __syncthreads();
        for (int pos = tid; pos < n; pos += T) {
            const int x = order[pos], i = pos + 1;
            nodes.parent[i] = pool.par[x] < 0 ? 0 : pool.nid[pool.par[x]];
            nodes.prev[i] = pool.rnk[x] > 0 ? pool.nid[x - 1] : -1;
            nodes.rank[i] = pool.rnk[x];
            nodes.depth[i] = pool.dep[x];
        }
        if (tid == 0) s_count = n;
        __syncthreads();
    } else {
        if (tid == 0) {
            WideHeap h;  // over the pool's memory (the plan makes cap >= N + 2)
            h.key = pool.E;
            h.parent = pool.par;
            h.prev = pool.tmp;
            h.rank = pool.rnk;
            h.depth = pool.dep;
            s_count = wide_sequential_heap(lp, L, K, topk, N, h, nodes);
        }
        __syncthreads();
    }
    n = s_count;

    // ---- outputs (pads: token -1, depth 0, parent -1, links -1, mask rows and columns 0)
    if (tid == 0) {
        node_count[b] = n;
        if (stats) stats[b] = s_fail == 0 ? DDT_STAT_WIDE : s_fail;
        nodes.parent[0] = -1;
        nodes.depth[0] = 0;
    }
    long long* tok_out = node_token_ids + static_cast<long long>(b) * N;
    long long* dep_out = node_depths + static_cast<long long>(b) * N;
    int* par_out = parents + static_cast<long long>(b) * N1;
    long long* nt_out = retrieve_next_token + static_cast<long long>(b) * N1;
    long long* ns_out = retrieve_next_sibling + static_cast<long long>(b) * N1;
    for (int i = tid; i < N1; i += T) {
        nt_out[i] = -1;
        ns_out[i] = -1;
    }
    __syncthreads();
    for (int i = 1 + tid; i <= N; i += T) {
        if (i <= n) {
            const int d = nodes.depth[i];
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
    if (tid == 0) par_out[0] = -1;
    __syncthreads();
    // packed ancestor rows: a thread per (row, word); the ancestors' indices decrease up the chain, so the
    // walk for word w stops at the first ancestor below 32 w (at most 32 steps inside the word)
    const int W = (N1 + 31) >> 5;
    unsigned int* bits = visibility_bits + static_cast<long long>(b) * N1 * W;
    unsigned char* vis = visibility ? visibility + static_cast<long long>(b) * N1 * N1 : nullptr;
    for (int q = tid; q < N1 * W; q += T) {
        const int i = q / W, w = q - i * W;
        unsigned int acc = 0u;
        if (i <= n && (w << 5) <= i) {
            int v = i;
            while (v >= 0 && (v >> 5) > w) v = nodes.parent[v];
            for (; v >= 0 && (v >> 5) == w; v = nodes.parent[v]) acc |= 1u << (v & 31);
        }
        bits[q] = acc;
        if (vis) {
            unsigned char* dst = vis + static_cast<long long>(i) * N1 + (w << 5);
            const int cols = min(32, N1 - (w << 5));
            for (int c = 0; c < cols; ++c) dst[c] = static_cast<unsigned char>((acc >> c) & 1u);
        }
    }
}
