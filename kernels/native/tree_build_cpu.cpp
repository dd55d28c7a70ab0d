// ddtree-bench: the `native` CPU builder of DDTree draft trees.
//
// Builds a whole batch per call into caller-provided buffers laid out exactly like
// ddtree_bench.tree.TreeBatch (C-contiguous, padded to the budget N):
//
//   node_count             int32  [B]
//   node_token_ids         int64  [B, N]          pad -1
//   node_depths            int64  [B, N]          pad 0
//   parents                int32  [B, N+1]        pad -1, parents[:, 0] = -1
//   visibility             uint8  [B, N+1, N+1]   pad 0 (numpy bool)
//   retrieve_next_token    int64  [B, N+1]        pad -1
//   retrieve_next_sibling  int64  [B, N+1]        pad -1
//
// Every element of every output is written (padding included), so the buffers need no initialisation
// and may be reused from call to call. Entry points (extern "C", at the end): ddtree_build_batch (14
// arguments) and ddtree_build_packed (the same 14 in one int64 array, for ctypes); see their comments.
//
// The algorithm is SGLang's `build_ddtree_tree_from_topk` (a best-first search over a heap of
// `(-logw, ranks, parent, depth, rank, logw)`), reproduced exactly:
//   * scores are doubles computed with the reference's operations in the reference's order
//     (first `(double)lp[0][0]`; sibling `logw - (double)lp[d-1][r] + (double)lp[d-1][r+1]`, left to right;
//     child `logw + (double)lp[d][0]`). Build with -ffp-contract=off and without -ffast-math so that no
//     FMA contraction or reassociation changes a rounding.
//   * equal scores are ordered by the ranks tuple in Python's tuple order (lexicographic, a proper prefix
//     first). A heap entry does not store its tuple: it is `parent node + own rank`, and each tree node keeps
//     `(parent, rank, depth)`, so the tuple is the chain of ranks from the root. Two entries with equal
//     scores are compared by lifting the longer one to the shorter one's length and then walking both up to
//     their common ancestor (tuples are unique, so the first differing rank decides; O(depth), ties only).
//   * the pop order of a priority queue under a strict total order does not depend on the heap's layout:
//     the heap is 4-ary (a node's children share a cache line) and a pop followed by a sibling push is one
//     "replace top" sift.
//
// No allocation per node: each thread keeps a workspace (heap of N+1 16-byte entries, node links, a 5 KiB
// staging buffer) that grows only when a larger budget arrives. Row i of the visibility is written when
// node i pops, as zeros plus ones at i and its ancestors (see VisibilityWriter); large outputs go out with
// non-temporal stores. At large budgets the dense [N+1, N+1] visibility, not the heap, bounds the time.
//
// Threads: `threads == 1` builds on the calling thread; `threads == 0` uses every CPU this process may run
// on (sched_getaffinity), `threads == t > 1` uses t; either way one request per thread at a time, and calls
// with fewer than kParallelMinPops pops (batch x budget) stay on the calling thread. Requests are handed
// out in small chunks from an atomic counter to a persistent pool (created on first use, grown on demand,
// re-created after fork); idle workers spin for ~50 us before sleeping on a condition variable, so
// back-to-back calls do not pay a thread wake-up each.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DDTREE_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define DDTREE_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define DDTREE_CPU_RELAX() ((void)0)
#endif

namespace {

constexpr int kAbiVersion = 1;

enum Status : int {
    kOk = 0,
    kBadShape = -1,       // B, L, K or N < 1, or too large for the int32 indices used here
    kNullPointer = -2,    // an input or output pointer is null
    kBadThreads = -3,     // threads < 0
    kOutOfMemory = -4,    // the workspace could not be allocated
    kInternal = -5,       // any other C++ exception
};

constexpr size_t kArity = 4;  // children per heap node

// A heap entry: 16 bytes, so a 4-ary heap's children share one cache line.
struct Entry {
    double logw;     // the path's score (log-probability)
    int32_t parent;  // tree index of the parent node (0 = root); the entry's depth is the parent's + 1
    int32_t rank;    // own rank: the last element of the ranks tuple
};

struct NodeLink {
    int32_t parent;
    int32_t rank;
    int32_t depth;  // length of the node's ranks tuple (root: 0)
};

// True when the ranks tuple of (pa, ra) sorts before that of (pb, rb) in Python's tuple order: each is
// the parent node's tuple followed by the own rank. `nodes[i]` holds node i's parent, rank and depth; the
// root (0) is never dereferenced past its depth.
inline bool ranks_less(const NodeLink* nodes, int32_t pa, int32_t ra, int32_t pb, int32_t rb) {
    int32_t da = nodes[pa].depth + 1;
    int32_t db = nodes[pb].depth + 1;
    const int32_t length_a = da;
    const int32_t length_b = db;
    while (da > db) {
        ra = nodes[pa].rank;
        pa = nodes[pa].parent;
        --da;
    }
    while (db > da) {
        rb = nodes[pb].rank;
        pb = nodes[pb].parent;
        --db;
    }
    if (pa == pb && ra == rb) return length_a < length_b;  // one tuple is a prefix of the other
    while (pa != pb) {
        ra = nodes[pa].rank;
        pa = nodes[pa].parent;
        rb = nodes[pb].rank;
        pb = nodes[pb].parent;
    }
    return ra < rb;
}

// True when `a` pops before `b`: heapq's `(-a.logw, ranks_a) < (-b.logw, ranks_b)`.
inline bool pops_before(const Entry& a, const Entry& b, const NodeLink* nodes) {
    if (a.logw != b.logw) return a.logw > b.logw;
    return ranks_less(nodes, a.parent, a.rank, b.parent, b.rank);
}

// The one of heap[a], heap[b] that pops first, as (index, score). Scores rarely tie: the common case is
// a branch-free select on the doubles, the tie-break walks the ranks.
struct Pick {
    size_t index;
    double logw;
};

inline Pick first_of(const Entry* heap, Pick a, Pick b, const NodeLink* nodes) {
    if (__builtin_expect(a.logw != b.logw, 1)) {
        const bool take_b = b.logw > a.logw;
        return Pick{take_b ? b.index : a.index, take_b ? b.logw : a.logw};
    }
    return pops_before(heap[b.index], heap[a.index], nodes) ? b : a;
}

inline Pick pick(const Entry* heap, size_t i) { return Pick{i, heap[i].logw}; }

// Places `item` at the root of a heap of `size` entries (the old root is gone) and sifts it down.
inline void sift_down(Entry* heap, size_t size, const Entry item, const NodeLink* nodes) {
    size_t hole = 0;
    for (;;) {
        const size_t first = kArity * hole + 1;
        if (first >= size) break;
        Pick best = pick(heap, first);
        if (first + kArity <= size) {
            static_assert(kArity == 4, "the unrolled selection below is for a 4-ary heap");
            const Pick x = first_of(heap, best, pick(heap, first + 1), nodes);
            const Pick y = first_of(heap, pick(heap, first + 2), pick(heap, first + 3), nodes);
            best = first_of(heap, x, y, nodes);
        } else {
            for (size_t c = first + 1; c < size; ++c) best = first_of(heap, best, pick(heap, c), nodes);
        }
        if (best.logw != item.logw ? !(best.logw > item.logw) : !pops_before(heap[best.index], item, nodes))
            break;
        heap[hole] = heap[best.index];
        hole = best.index;
    }
    heap[hole] = item;
}

inline void sift_up(Entry* heap, size_t& size, const Entry item, const NodeLink* nodes) {
    size_t hole = size++;
    while (hole > 0) {
        const size_t parent = (hole - 1) / kArity;
        if (!pops_before(item, heap[parent], nodes)) break;
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = item;
}

// The visibility block of a tree is written row by row, in order, as nodes pop. Row i is zero except at
// i and its ancestors (depth + 1 ones), so a row is a memset and an ancestor walk, never a read of the
// parent's row. Small outputs are written in place (they stay in cache). Large outputs (the whole batch's
// visibility at least kStreamThresholdBytes) go through a small L1-resident staging buffer that mirrors the
// destination's alignment and is drained in whole 64-byte lines with non-temporal stores: no read for
// ownership, and the stores drain while the heap keeps working (rows are flushed about every kFlushBytes).
constexpr size_t kStreamThresholdBytes = size_t{2} << 20;
constexpr size_t kFlushBytes = 1024;
constexpr size_t kStageBytes = 4096 + kFlushBytes + 128;  // also bounds the widest row that is staged
constexpr double kMaxPathInts = 4.0 * 1024 * 1024;       // per-node paths up to 16 MiB per thread

struct Workspace {
    std::vector<Entry> heap_storage;
    Entry* heap = nullptr;  // heap[1 + kArity * h ...] (a node's children) start on a 64-byte boundary
    std::vector<NodeLink> nodes;
    std::vector<int32_t> last_child;
    std::vector<int32_t> paths;  // node i's path (root, ..., i) at paths[i * stride], when it fits
    std::vector<unsigned char> stage_storage;
    uint8_t* stage = nullptr;  // kStageBytes, 64-byte aligned

    // Room for a budget; `path_stride` > 0 also sizes the per-node paths (path_stride ints per node).
    void ensure(int64_t budget, int64_t path_stride = 0) {
        const size_t need = static_cast<size_t>(budget) + 1;
        if (path_stride > 0 && paths.size() < need * static_cast<size_t>(path_stride))
            paths.resize(need * static_cast<size_t>(path_stride));
        if (nodes.size() < need) {
            heap_storage.resize(need + 64 / sizeof(Entry) + 1);
            const uintptr_t base = reinterpret_cast<uintptr_t>(heap_storage.data() + 1);
            const uintptr_t aligned = (base + 63) & ~uintptr_t{63};
            heap = reinterpret_cast<Entry*>(aligned) - 1;
            nodes.resize(need);
            last_child.resize(need);
        }
        if (stage == nullptr) {
            stage_storage.assign(kStageBytes + 64, 0);
            const uintptr_t base = reinterpret_cast<uintptr_t>(stage_storage.data());
            stage = reinterpret_cast<uint8_t*>((base + 63) & ~uintptr_t{63});
        }
    }
};

Workspace& thread_workspace() {
    static thread_local Workspace workspace;
    return workspace;
}

// Copies whole 64-byte lines (dst 64-byte aligned, n a multiple of 64) with non-temporal stores where the
// CPU has them (SSE2: every x86-64; AVX2 or AVX-512 when the running CPU has them, chosen at run time:
// wider stores take fewer store-buffer entries, so the heap keeps running while they drain); elsewhere a
// plain copy. The bytes written are the same whichever is used.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void stream_lines_avx512(uint8_t* dst, const uint8_t* src, size_t n) {
    for (; n >= 64; n -= 64, dst += 64, src += 64)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_load_si512(src));
}

__attribute__((target("avx2"))) void stream_lines_avx2(uint8_t* dst, const uint8_t* src, size_t n) {
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(src));
        const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 32));
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    }
}
#endif

void stream_lines_sse2(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__SSE2__)
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        const __m128i a = _mm_load_si128(reinterpret_cast<const __m128i*>(src));
        const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(src + 16));
        const __m128i c = _mm_load_si128(reinterpret_cast<const __m128i*>(src + 32));
        const __m128i d = _mm_load_si128(reinterpret_cast<const __m128i*>(src + 48));
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    }
#else
    std::memcpy(dst, src, n);
#endif
}

using StreamLines = void (*)(uint8_t*, const uint8_t*, size_t);

StreamLines pick_stream_lines() {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return stream_lines_avx512;
    if (__builtin_cpu_supports("avx2")) return stream_lines_avx2;
#endif
    return stream_lines_sse2;
}

const StreamLines stream_lines = pick_stream_lines();

inline void store_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

class VisibilityWriter {
  public:
    VisibilityWriter(uint8_t* out, size_t width, const int32_t* parents, uint8_t* stage, bool stream)
        : next_(out), end_of_block_(out + width * width), width_(width), parents_(parents), stage_(stage),
          stream_(stream && width + kFlushBytes + 64 <= kStageBytes) {
        if (stream_) {
            // stage_[j] mirrors destination byte line_ + j, line_ being next_ rounded down to 64
            line_ = next_ - (reinterpret_cast<uintptr_t>(next_) & 63);
            begin_ = end_ = static_cast<size_t>(next_ - line_);
        }
    }

    // Appends the next row (rows come in order 0, 1, 2, ...): ones at the `count` indices of `path` (the
    // node's ancestors and itself), or, without a path, at `index` and its ancestors found through the
    // parents (a chain of dependent loads: slower for deep trees).
    void add_row(int32_t index, const int32_t* path, int32_t count) {
        uint8_t* row = next_row();
        if (path != nullptr) {
            for (int32_t k = 0; k < count; ++k) row[path[k]] = 1;
        } else {
            for (int32_t a = index; a >= 0; a = parents_[a]) row[a] = 1;
        }
        if (stream_ && end_ - begin_ >= kFlushBytes) drain(false);
    }

    // Everything after the rows added so far is padding: zero. Leaves nothing pending.
    void finish() {
        if (!stream_) {
            std::memset(next_, 0, static_cast<size_t>(end_of_block_ - next_));
            return;
        }
        size_t zeros = static_cast<size_t>(end_of_block_ - (line_ + end_));
        while (zeros > 0) {
            const size_t n = std::min(zeros, kStageBytes - end_);
            std::memset(stage_ + end_, 0, n);
            end_ += n;
            zeros -= n;
            drain(zeros == 0);
        }
        drain(true);
    }

  private:
    uint8_t* next_row() {
        uint8_t* row;
        if (stream_) {
            row = stage_ + end_;
            end_ += width_;
        } else {
            row = next_;
            next_ += width_;
        }
        std::memset(row, 0, width_);
        return row;
    }

    // Writes out the staged bytes: whole lines with non-temporal stores, the partial lines at the edges of
    // the block with ordinary stores. Unless `all`, a trailing partial line stays staged (moved to the
    // front of the stage) for the next row to complete.
    void drain(bool all) {
        size_t lo = begin_;
        if (lo & 63) {  // the block's first, partial line
            const size_t edge = std::min<size_t>((lo | 63) + 1, end_);
            if (edge == end_ && !all && (end_ & 63)) return;  // still partial: wait for more rows
            std::memcpy(line_ + lo, stage_ + lo, edge - lo);
            lo = edge;
        }
        const size_t whole_end = end_ & ~size_t{63};
        if (whole_end > lo) {
            stream_lines(line_ + lo, stage_ + lo, whole_end - lo);
            lo = whole_end;
        }
        if (all) {
            std::memcpy(line_ + lo, stage_ + lo, end_ - lo);  // the block's last, partial line
            line_ += end_ & ~size_t{63};
            begin_ = end_ = end_ & 63;
            return;
        }
        // keep the partial tail line: move it to the front
        const size_t tail = end_ - lo;
        if (lo > 0 && tail > 0) std::memcpy(stage_, stage_ + lo, tail);
        line_ += lo;
        begin_ = 0;
        end_ = tail;
    }

    uint8_t* next_;              // in-place mode: where the next row goes
    uint8_t* const end_of_block_;
    const size_t width_;
    const int32_t* const parents_;
    uint8_t* const stage_;
    const bool stream_;
    uint8_t* line_ = nullptr;  // stream mode: destination of stage_[0] (64-byte aligned)
    size_t begin_ = 0;         // stage_[begin_, end_) is pending
    size_t end_ = 0;
};

struct Batch {
    const float* lp;
    const int64_t* ids;
    int64_t L, K, N;
    int32_t* node_count;
    int64_t* node_token_ids;
    int64_t* node_depths;
    int32_t* parents;
    uint8_t* visibility;
    int64_t* next_token;
    int64_t* next_sibling;
    bool stream;  // non-temporal stores for the visibility
};

void build_request(const Batch& batch, int64_t b, Workspace& ws) {
    const int64_t L = batch.L, K = batch.K, N = batch.N;
    const int64_t topk = std::min(N, K);
    const size_t width = static_cast<size_t>(N) + 1;
    const float* lp = batch.lp + b * L * K;
    const int64_t* ids = batch.ids + b * L * K;
    int64_t* token_out = batch.node_token_ids + b * N;
    int64_t* depth_out = batch.node_depths + b * N;
    int32_t* parents = batch.parents + b * static_cast<int64_t>(width);
    int64_t* next_token = batch.next_token + b * static_cast<int64_t>(width);
    int64_t* next_sibling = batch.next_sibling + b * static_cast<int64_t>(width);

    // Each node's path from the root (at most min(L, N) + 1 indices) is kept so that its visibility row is
    // a run of independent stores; past kMaxPathInts the rows fall back to walking the parents.
    const int64_t stride = std::min(L, N) + 1;
    const bool keep_paths = static_cast<double>(stride) * static_cast<double>(width) <= kMaxPathInts;
    ws.ensure(N, keep_paths ? stride : 0);
    Entry* heap = ws.heap;
    NodeLink* nodes = ws.nodes.data();
    int32_t* last_child = ws.last_child.data();
    int32_t* paths = keep_paths ? ws.paths.data() : nullptr;
    VisibilityWriter vis(batch.visibility + static_cast<size_t>(b) * width * width, width, parents, ws.stage,
                         batch.stream);

    std::fill(next_token, next_token + width, int64_t{-1});
    std::fill(next_sibling, next_sibling + width, int64_t{-1});
    parents[0] = -1;
    nodes[0] = NodeLink{-1, -1, 0};
    if (paths) paths[0] = 0;
    vis.add_row(0, paths, 1);

    size_t heap_size = 1;
    heap[0] = Entry{static_cast<double>(lp[0]), 0, 0};
    int64_t count = 0;
    while (heap_size > 0) {
        const Entry top = heap[0];
        const int32_t index = static_cast<int32_t>(count + 1);
        const int32_t parent = top.parent, rank = top.rank, depth = nodes[parent].depth + 1;
        const float* row = lp + static_cast<int64_t>(depth - 1) * K;

        token_out[count] = ids[static_cast<int64_t>(depth - 1) * K + rank];
        depth_out[count] = depth;
        parents[index] = parent;
        nodes[index] = NodeLink{parent, rank, depth};
        if (next_token[parent] == -1) {
            next_token[parent] = index;
        } else {
            next_sibling[last_child[parent]] = index;
        }
        last_child[parent] = index;
        if (paths) {
            int32_t* path = paths + index * stride;
            std::memcpy(path, paths + parent * stride, static_cast<size_t>(depth) * sizeof(int32_t));
            path[depth] = index;
            vis.add_row(index, path, depth + 1);
        } else {
            vis.add_row(index, nullptr, 0);
        }

        if (++count == N) break;  // the budget is spent: later pushes could never pop

        if (rank + 1 < topk) {
            const double sibling = top.logw - static_cast<double>(row[rank]) + static_cast<double>(row[rank + 1]);
            sift_down(heap, heap_size, Entry{sibling, parent, rank + 1}, nodes);
        } else if (--heap_size > 0) {
            sift_down(heap, heap_size, heap[heap_size], nodes);
        }
        if (depth < L) {
            const double child = top.logw + static_cast<double>(lp[static_cast<int64_t>(depth) * K]);
            sift_up(heap, heap_size, Entry{child, index, 0}, nodes);
        }
    }

    batch.node_count[b] = static_cast<int32_t>(count);
    std::fill(token_out + count, token_out + N, int64_t{-1});
    std::fill(depth_out + count, depth_out + N, int64_t{0});
    std::fill(parents + count + 1, parents + width, int32_t{-1});
    vis.finish();
    if (batch.stream) store_fence();
}

int available_cpus() {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int>(n) : 1;
}

// Below this many pops in a call (batch size x budget, about 100 us of single-thread work), `threads != 1`
// still builds on the calling thread: waking workers would cost more than it saves.
constexpr int64_t kParallelMinPops = 4096;

// A persistent pool. One parallel call at a time (calls from several threads queue on `call_mutex_`); the
// calling thread works too, so `threads` workers means `threads - 1` pool threads. Requests are handed
// out in small contiguous chunks from an atomic counter.
class Pool {
  public:
    explicit Pool(pid_t owner) : owner_(owner) {}
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;

    pid_t owner() const { return owner_; }

    // Runs build_request for every request of `batch` on `threads` threads (caller included); returns a
    // Status (kOutOfMemory or kInternal when a request's build threw).
    int run(const Batch& batch, int64_t requests, int threads) {
        std::lock_guard<std::mutex> call_lock(call_mutex_);
        grow(threads - 1);
        const int helpers = std::min<int>(threads - 1, static_cast<int>(workers_.size()));
        batch_ = &batch;
        requests_ = requests;
        chunk_ = std::max<int64_t>(1, requests / (int64_t{4} * (helpers + 1)));
        next_.store(0, std::memory_order_relaxed);
        error_.store(kOk, std::memory_order_relaxed);
        remaining_.store(helpers, std::memory_order_relaxed);
        {
            // the ticket carries the generation and how many workers take part, read by workers in one load
            std::lock_guard<std::mutex> lock(wake_mutex_);
            const uint64_t generation = (ticket_.load(std::memory_order_relaxed) >> 16) + 1;
            ticket_.store((generation << 16) | static_cast<uint64_t>(helpers), std::memory_order_release);
        }
        wake_cv_.notify_all();
        work(thread_workspace());
        if (!spin_until([this] { return remaining_.load(std::memory_order_acquire) == 0; })) {
            std::unique_lock<std::mutex> lock(done_mutex_);
            done_cv_.wait(lock, [this] { return remaining_.load(std::memory_order_acquire) == 0; });
        }
        batch_ = nullptr;
        return error_.load(std::memory_order_acquire);
    }

  private:
    // Spins (with a pause) until ready() or ~50 us have passed; returns ready().
    template <class Ready>
    static bool spin_until(Ready ready) {
        using clock = std::chrono::steady_clock;
        const auto deadline = clock::now() + std::chrono::microseconds(50);
        for (int i = 0;; ++i) {
            if (ready()) return true;
            DDTREE_CPU_RELAX();
            if ((i & 63) == 63 && clock::now() > deadline) return ready();
        }
    }

    void work(Workspace& ws) {
        const Batch& batch = *batch_;
        try {
            ws.ensure(batch.N);
            for (;;) {
                const int64_t first = next_.fetch_add(chunk_, std::memory_order_relaxed);
                if (first >= requests_) break;
                const int64_t last = std::min(first + chunk_, requests_);
                for (int64_t b = first; b < last; ++b) build_request(batch, b, ws);
            }
        } catch (const std::bad_alloc&) {
            error_.store(kOutOfMemory, std::memory_order_release);
            next_.store(requests_, std::memory_order_relaxed);  // the others stop at their next chunk
        } catch (...) {
            error_.store(kInternal, std::memory_order_release);
            next_.store(requests_, std::memory_order_relaxed);
        }
    }

    void grow(int wanted) {
        while (static_cast<int>(workers_.size()) < wanted) {
            const int id = static_cast<int>(workers_.size());
            // the ticket the new thread has "seen": it must answer the next one, even when it only starts
            // running after that ticket is out
            const uint64_t seen = ticket_.load(std::memory_order_acquire);
            try {
                workers_.emplace_back([this, id, seen] { worker_loop(id, seen); });
            } catch (...) {
                break;  // run with the threads we have
            }
        }
    }

    void worker_loop(int id, uint64_t seen) {
        for (;;) {
            if (!spin_until([&] { return ticket_.load(std::memory_order_acquire) != seen; })) {
                std::unique_lock<std::mutex> lock(wake_mutex_);
                wake_cv_.wait(lock, [&] { return ticket_.load(std::memory_order_acquire) != seen; });
            }
            seen = ticket_.load(std::memory_order_acquire);
            if (static_cast<uint64_t>(id) >= (seen & 0xFFFF)) continue;  // not needed this time
            work(thread_workspace());
            if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                std::lock_guard<std::mutex> lock(done_mutex_);
                done_cv_.notify_one();
            }
        }
    }

    const pid_t owner_;
    std::mutex call_mutex_;
    std::vector<std::thread> workers_;  // never joined: the pool lives as long as the process

    std::mutex wake_mutex_;
    std::condition_variable wake_cv_;
    std::atomic<uint64_t> ticket_{0};  // generation << 16 | number of workers taking part

    std::mutex done_mutex_;
    std::condition_variable done_cv_;
    std::atomic<int> remaining_{0};  // workers taking part that have not finished yet

    const Batch* batch_ = nullptr;
    int64_t requests_ = 0;
    int64_t chunk_ = 1;
    std::atomic<int64_t> next_{0};
    std::atomic<int> error_{kOk};
};

// The process-wide pool. Intentionally leaked (threads blocked in it must not be joined at exit); after a
// fork the child, which has none of the parent's threads, starts a fresh pool.
Pool& the_pool() {
    static std::mutex mutex;
    static Pool* pool = nullptr;
    std::lock_guard<std::mutex> lock(mutex);
    const pid_t self = getpid();
    if (pool == nullptr || pool->owner() != self) pool = new Pool(self);
    return *pool;
}

}  // namespace

extern "C" {

// Version of this C interface; the Python binding refuses a library whose version it does not know.
int ddtree_native_abi_version(void) { return kAbiVersion; }

// The number of threads `threads == 0` stands for: the CPUs this process may run on.
int ddtree_native_cpu_count(void) { return available_cpus(); }

// Calls with fewer pops than this (batch size x budget) run on the calling thread whatever `threads` says.
int64_t ddtree_native_parallel_min_pops(void) { return kParallelMinPops; }

// Builds B trees. lp: float32 [B, L, K], ids: int64 [B, L, K], both C-contiguous, rows sorted descending
// (not checked here: the Python side validates). Outputs as described at the top of this file.
// Returns 0, or a negative Status for arguments it cannot take (nothing is written then).
int ddtree_build_batch(const float* top_log_probs, const int64_t* top_token_ids, int64_t B, int64_t L,
                       int64_t K, int64_t budget, int threads, int32_t* node_count, int64_t* node_token_ids,
                       int64_t* node_depths, int32_t* parents, uint8_t* visibility,
                       int64_t* retrieve_next_token, int64_t* retrieve_next_sibling) {
    constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
    if (B < 1 || L < 1 || K < 1 || budget < 1) return kBadShape;
    if (L >= kMax32 || K >= kMax32 || budget >= kMax32 - 1) return kBadShape;
    if (threads < 0) return kBadThreads;
    if (!top_log_probs || !top_token_ids || !node_count || !node_token_ids || !node_depths || !parents ||
        !visibility || !retrieve_next_token || !retrieve_next_sibling)
        return kNullPointer;
    const size_t width = static_cast<size_t>(budget) + 1;
    const bool stream = static_cast<double>(B) * static_cast<double>(width * width) >=
                        static_cast<double>(kStreamThresholdBytes);
    const Batch batch{top_log_probs,  top_token_ids, L,      K,          budget,
                      node_count,     node_token_ids, node_depths, parents, visibility,
                      retrieve_next_token, retrieve_next_sibling, stream};
    try {
        int64_t workers = threads == 0 ? available_cpus() : threads;
        workers = std::min<int64_t>({workers, B, 0xFFFF});
        if (B * budget < kParallelMinPops) workers = 1;
        if (workers <= 1) {
            Workspace& ws = thread_workspace();
            ws.ensure(budget);
            for (int64_t b = 0; b < B; ++b) build_request(batch, b, ws);
        } else {
            return the_pool().run(batch, B, static_cast<int>(workers));
        }
    } catch (const std::bad_alloc&) {
        return kOutOfMemory;
    } catch (...) {
        return kInternal;
    }
    return kOk;
}

// The same call with its 14 arguments packed in one int64 array (pointers as integers), in the order of
// ddtree_build_batch's parameters: one argument to convert per call, for thin bindings (ctypes) whose
// per-argument cost would otherwise exceed the build of a small batch.
int ddtree_build_packed(const int64_t* args) {
    if (args == nullptr) return kNullPointer;
    auto ptr = [args](int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(args[i])); };
    if (args[6] < 0 || args[6] > std::numeric_limits<int>::max()) return kBadThreads;
    return ddtree_build_batch(static_cast<const float*>(ptr(0)), static_cast<const int64_t*>(ptr(1)), args[2],
                              args[3], args[4], args[5], static_cast<int>(args[6]), static_cast<int32_t*>(ptr(7)),
                              static_cast<int64_t*>(ptr(8)), static_cast<int64_t*>(ptr(9)),
                              static_cast<int32_t*>(ptr(10)), static_cast<uint8_t*>(ptr(11)),
                              static_cast<int64_t*>(ptr(12)), static_cast<int64_t*>(ptr(13)));
}

}  // extern "C"
