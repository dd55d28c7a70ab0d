// DDTree tree accept on the GPU: greedy verification of a batch of draft trees in one launch.
//
// Semantics: SGLang's `follow_verified_tree(child_maps, posterior)`, where child_maps[p] maps a child's token
// to its index (built in node-index order, so when two children of one parent carry the same token the later
// one -- the larger index -- wins). From the root (index 0), with t = posterior[cur], move to
// child_maps[cur][t] while it exists; accepted indices are the root and every node moved to; the bonus token
// is t at the node where the walk stopped. Here child_maps[cur] is read from the TreeBatch's links:
// retrieve_next_token[cur] is cur's first child, retrieve_next_sibling[c] the next child of the same parent by
// increasing index. The walk scans the whole child list of cur and keeps the LAST child whose token equals t,
// which is exactly the dict's value (the first match would differ from SGLang on duplicate sibling tokens).
//
// Layout (row-major, one row per request b, budget N):
//   target_tokens [B, N+1] int64   the target's argmax at every tree node (index 0 is the root)
//   node_token_ids [B, N] int64    token of node i at column i-1
//   retrieve_next_token / retrieve_next_sibling [B, N+1] int64, -1 for none
//   accepted_indices [B, N+1] int32: the accepted path, root first, then -1 up to N+1
//   accept_length [B] int32: number of accepted nodes including the root (1...N+1)
//   bonus_token [B] int64
//
// Parallelism and cost: one warp per request. Lane 0 walks the tree; then the whole warp pads
// accepted_indices with -1 (coalesced). The walk costs one dependent global load per child scanned: the sum,
// over the accepted nodes, of their number of children (plus one load per accepted node for its target
// token), at most N + 1 steps per request because every node is scanned at most once. No shared memory, no
// atomics, no allocation, no host sync: the launch is CUDA-graph capturable.
//
// Robustness: links outside 1..N end a child list, and the number of children scanned is capped at N, so
// even a malformed tree (a cycle in the links) terminates and every read and write stays inside the rows
// above. The accept length never exceeds N+1.

// The walk for one request (shared by the kernel and the host-side tests, which compile this file with a
// host `main`). Writes accepted[0, len) and *bonus; returns len (>= 1).
__host__ __device__ inline int ddtree_accept_walk(const long long* target, const long long* tokens,
                                                  const long long* next_token, const long long* next_sibling,
                                                  int budget, int* accepted, long long* bonus) {
    int cur = 0;
    int length = 1;
    int scanned = 0;
    accepted[0] = 0;
    long long t = target[0];
    while (length < budget + 1) {
        int match = -1;
        long long child = next_token[cur];
        while (child >= 1 && child <= budget && scanned < budget) {
            ++scanned;
            const int c = static_cast<int>(child);
            if (tokens[c - 1] == t) match = c;  // the last match wins, as the dict's overwrite
            child = next_sibling[c];
        }
        if (match < 0) break;
        cur = match;
        accepted[length++] = cur;
        t = target[cur];
    }
    *bonus = t;
    return length;
}

// Lane `lane` of `lanes` pads accepted[length, n1) with -1.
__host__ __device__ inline void ddtree_accept_pad(int* accepted, int length, int n1, int lane, int lanes) {
    for (int i = length + lane; i < n1; i += lanes) accepted[i] = -1;
}

// Launch: blockDim.x a multiple of 32 (one warp per request), gridDim.x = ceil(batch / (blockDim.x / 32)).
// budget >= 0, batch >= 0; the host checks every shape before launch.
extern "C" __global__ void ddtree_tree_accept(const long long* __restrict__ target_tokens,
                                              const long long* __restrict__ node_token_ids,
                                              const long long* __restrict__ retrieve_next_token,
                                              const long long* __restrict__ retrieve_next_sibling, int batch,
                                              int budget, int* __restrict__ accepted_indices,
                                              int* __restrict__ accept_length,
                                              long long* __restrict__ bonus_token) {
    const int warps_per_block = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= warps_per_block) return;  // a partial trailing warp (blockDim not a multiple of 32) idles
    const long long b = static_cast<long long>(blockIdx.x) * warps_per_block + warp;
    if (b >= batch) return;  // warp-uniform
    const int n1 = budget + 1;
    const long long row = b * n1;
    int* accepted = accepted_indices + row;
    int length = 0;
    if (lane == 0) {
        long long bonus;
        length = ddtree_accept_walk(target_tokens + row, node_token_ids + b * budget, retrieve_next_token + row,
                                    retrieve_next_sibling + row, budget, accepted, &bonus);
        accept_length[b] = length;
        bonus_token[b] = bonus;
    }
    length = __shfl_sync(0xffffffffu, length, 0);
    ddtree_accept_pad(accepted, length, n1, lane, 32);
}
