// DDTree tree accept on the GPU: greedy verification of a batch of draft trees in one launch.
//
// Semantics: SGLang's `follow_verified_tree(child_maps, posterior)`, where child_maps[p] maps a child's token
// to its index (built in node-index order, so when two children of one parent carry the same token the later
// one -- the larger index -- wins). From the root (index 0), with t = posterior[cur], move to
// child_maps[cur][t] while it exists; accepted indices are the root and every node moved to; the bonus token
// is t at the node where the walk stopped. Here the child maps come from the TreeBatch's parents: node i
// (1 <= i <= node_count) is a child of parents[i], and the move from cur goes to
//     next[cur] = max { i : parents[i] == cur and token[i] == target[cur] }   (none: the walk stops),
// the maximum being exactly the dict's last insertion. next[] does not depend on the path, so the kernel
// computes it for every node at once and then follows it: no scan is repeated per step.
//
// Layout (row-major, one row per request b, budget N):
//   target_tokens  [B, N+1] int64   the target's argmax at every tree node (index 0 is the root)
//   node_token_ids [B, N]   int64   token of node i at column i-1
//   parents        [B, N+1] int32   parent of node i (parents[b, 0] = -1; padding -1)
//   node_count     [B]      int32   real nodes 1..node_count (clamped to 0..N; later columns are ignored)
//   accepted_indices [B, N+1] int32: the accepted path, root first, then -1 up to N+1
//   accept_length  [B]      int32   number of accepted nodes including the root (1...N+1)
//   bonus_token    [B]      int64
//
// Parallelism: one thread block per request (gridDim.x >= batch; blocks past the batch return at once).
//   1. Each thread loads the parent and token of up to NODES_PER_THREAD nodes into registers (coalesced), and
//      the block stages the target row into shared memory (coalesced) with next[] = 0 beside it. The node
//      loads are issued before the first barrier, so staging and node loads share one memory round trip.
//   2. Barrier. Every real node i with a well-formed parent p (0 <= p < i) whose token equals target[p] does
//      a shared atomicMax(&next[p], i). Nodes beyond the first NODES_PER_THREAD * blockDim are loaded here.
//   3. Barrier. Thread 0 follows next[] from the root (one shared load per accepted node), writes the path,
//      the accept length and the bonus token target[last]; a barrier publishes the length and all threads
//      pad accepted_indices with -1 (coalesced).
// Cost per request: about 20 bytes per node read once (coalesced), one shared gather and compare per node,
// one shared atomic per matching node (well-formed trees have at most one per parent), three block
// barriers, and a serial chain of (accept length) shared loads -- independent of how many children the
// accepted nodes have. No warp primitives, no global atomics in the staged path, no allocation, no host
// sync: the launch is CUDA-graph capturable. Expected at B = 64, N = 1024 (256 threads, 12 KB of shared
// memory per block, one block per SM): the launch floor plus one L2 round trip, three barriers and a walk of a
// few shared loads -- an estimate of 1 to 2 us over the floor, not a measurement. (The previous kernel, one
// warp per request with lane 0 walking retrieve_next_token / retrieve_next_sibling in global memory, paid one
// dependent global load per child scanned: 134 us there on an H200.) The serial part is the accept length:
// a chain tree accepted to the end costs N+1 dependent shared loads.
//
// Shared memory: the staged path needs DDTREE_ACCEPT_SHARED_BYTES(N) = 12 (N+1) bytes of dynamic shared
// memory (target int64 [N+1], then next int32 [N+1]). The kernel stages exactly when the launch gives at least
// that much (it reads %dynamic_smem_size, so a launch with less can never overrun shared memory); otherwise
// it runs the same algorithm on global memory: target[p] is gathered from global memory and next[] lives in
// the request's own accepted_indices row (global atomicMax), which the walk then overwrites in place (the
// path is strictly increasing, so position k is written only after next[k] has been read) and the padding
// finishes. The host launches the staged path for N <= 4000 (48 KB, no opt-in needed) and the global one
// above, or when forced.
//
// Robustness: a parent outside 0..i-1 (negative, >= its child, or past N) never matches, so next[p] > p and
// the walk is strictly increasing: it ends after at most N+1 nodes (also capped explicitly), every index it
// reads or writes is in 0..N, and the accept length is in 1..N+1. node_count is clamped to 0..N. Every output
// element is written.

#ifndef DDTREE_ACCEPT_NODES_PER_THREAD
#define DDTREE_ACCEPT_NODES_PER_THREAD 4  // nodes whose parent and token a thread holds in registers
#endif
// The launch's limits, read by the host (ops/accept.py) from this file rather than copied there.
#define DDTREE_ACCEPT_MAX_THREADS 1024           // threads per block at most (__launch_bounds__)
#define DDTREE_ACCEPT_SHARED_BYTES_PER_NODE 12  // staged path: an int64 target and an int32 link per node
#define DDTREE_ACCEPT_SHARED_BYTES(budget)                                  \
    (static_cast<unsigned long long>(DDTREE_ACCEPT_SHARED_BYTES_PER_NODE) * \
     (static_cast<unsigned long long>(budget) + 1ull))

// The dynamic shared memory and its size (hooks: the tests' host emulator replaces both).
#ifndef DDTREE_ACCEPT_DYNAMIC_SHARED
extern __shared__ __align__(16) unsigned char ddtree_accept_dynamic_shared[];
#define DDTREE_ACCEPT_DYNAMIC_SHARED ddtree_accept_dynamic_shared
__device__ inline unsigned int ddtree_accept_dynamic_shared_bytes() {
    unsigned int bytes;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}
#define DDTREE_ACCEPT_DYNAMIC_SHARED_BYTES() ddtree_accept_dynamic_shared_bytes()
#endif

// Node i (parent p, token) records itself as p's chosen child when it matches target[p]; the largest index
// wins. A parent outside 0..i-1 never matches.
__device__ inline void ddtree_accept_match(const long long* target, int* next, int i, int p, long long token) {
    if (p >= 0 && p < i && token == target[p]) atomicMax(next + p, i);
}

// One request, on block `b`. kStaged: target and next[] in shared memory; else target read from global
// memory and next[] kept in `accepted` (the output row).
template <bool kStaged>
__device__ inline void ddtree_accept_request(const long long* __restrict__ target_row,
                                             const long long* __restrict__ token_row,
                                             const int* __restrict__ parent_row, int count, int budget,
                                             int* __restrict__ accepted, int* __restrict__ accept_length,
                                             long long* __restrict__ bonus_token, long long b) {
    constexpr int R = DDTREE_ACCEPT_NODES_PER_THREAD;
    __shared__ int walk_length;
    const int tid = static_cast<int>(threadIdx.x);
    const int stride = static_cast<int>(blockDim.x);
    const int n1 = budget + 1;
    long long* staged_target = reinterpret_cast<long long*>(DDTREE_ACCEPT_DYNAMIC_SHARED);
    int* staged_next = reinterpret_cast<int*>(DDTREE_ACCEPT_DYNAMIC_SHARED + 8ull * static_cast<unsigned>(n1));
    const long long* target = kStaged ? staged_target : target_row;
    int* next = kStaged ? staged_next : accepted;

    // 1. this thread's first R nodes (slot r: node 1 + tid + r * blockDim) into registers: parent, token and,
    // when staging, the node's target token; thread 0 also takes the root's target. Every load is issued
    // before the first store, so the whole phase is one memory round trip.
    int parent[R];
    long long token[R];
    long long target_at[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = 1 + tid + r * stride;
        parent[r] = -1;
        token[r] = 0;
        target_at[r] = 0;
        if (i <= budget) {  // not `count`: the node loads do not wait for node_count's
            parent[r] = parent_row[i];
            token[r] = token_row[i - 1];
            if (kStaged) target_at[r] = target_row[i];
        }
    }
    const long long root_target = (kStaged && tid == 0) ? target_row[0] : 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = 1 + tid + r * stride;
        if (i <= budget) {
            if (kStaged) staged_target[i] = target_at[r];
            next[i] = 0;  // no child chosen (a chosen child is >= 1)
        }
    }
    if (tid == 0) {
        if (kStaged) staged_target[0] = root_target;
        next[0] = 0;
    }
    for (int i = 1 + tid + R * stride; i <= budget; i += stride) {  // nodes past the slots (small blocks)
        if (kStaged) staged_target[i] = target_row[i];
        next[i] = 0;
    }
    __syncthreads();

    // 2. every real node: am I the chosen child of my parent?
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = 1 + tid + r * stride;
        if (i <= count) ddtree_accept_match(target, next, i, parent[r], token[r]);
    }
    for (int i = 1 + tid + R * stride; i <= count; i += stride)
        ddtree_accept_match(target, next, i, parent_row[i], token_row[i - 1]);
    __syncthreads();

    // 3. follow next[] from the root; next[cur] is read before accepted[length] is written (they alias in
    // the global path, and length <= cur)
    if (tid == 0) {
        int cur = 0;
        int length = 0;
        for (;;) {
            const int child = next[cur];
            accepted[length++] = cur;
            if (child <= cur || child > budget || length >= n1) break;
            cur = child;
        }
        walk_length = length;
        accept_length[b] = length;
        bonus_token[b] = target[cur];
    }
    __syncthreads();
    const int length = walk_length;
    for (int i = length + tid; i < n1; i += stride) accepted[i] = -1;
}

// Launch: gridDim.x >= batch (one block per request), any blockDim.x >= 1 (the host uses 32...1024 threads,
// about ceil(N / NODES_PER_THREAD) rounded up to whole warps), dynamic shared memory
// DDTREE_ACCEPT_SHARED_BYTES(budget) for the staged path or 0 for the global-memory path.
// 0 <= budget <= 2^30, batch >= 0; the host checks every shape before launch.
extern "C" __global__ void __launch_bounds__(DDTREE_ACCEPT_MAX_THREADS)
    ddtree_tree_accept(const long long* __restrict__ target_tokens, const long long* __restrict__ node_token_ids,
                       const int* __restrict__ parents, const int* __restrict__ node_count, int batch,
                       int budget, int* __restrict__ accepted_indices, int* __restrict__ accept_length,
                       long long* __restrict__ bonus_token) {
    const long long b = blockIdx.x;
    if (b >= batch) return;  // block-uniform, before any barrier
    const long long row = b * (budget + 1);
    int count = node_count[b];
    count = count < 0 ? 0 : (count > budget ? budget : count);
    const bool staged = DDTREE_ACCEPT_DYNAMIC_SHARED_BYTES() >= DDTREE_ACCEPT_SHARED_BYTES(budget);
    if (staged) {
        ddtree_accept_request<true>(target_tokens + row, node_token_ids + b * budget, parents + row, count,
                                    budget, accepted_indices + row, accept_length, bonus_token, b);
    } else {
        ddtree_accept_request<false>(target_tokens + row, node_token_ids + b * budget, parents + row, count,
                                     budget, accepted_indices + row, accept_length, bonus_token, b);
    }
}
