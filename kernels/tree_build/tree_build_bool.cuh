// The bool ancestor mask from the packed bits (tree_build.cu's parallel kernel and expansion kernel; run on
// the CPU by tests/test_bool_mask_emulator.py): 16 bits of a packed row, and a block writing its own tree's
// bool rows. Needs tree_build_common.cuh (bool_bytes16) first.
#pragma once

// 16 mask bits starting at column c of a packed row rw (W words), continued into the next row rw + W where
// the row ends (N1 columns) within them; the caller guarantees N1 >= 16 and that the next row exists when it
// is read; bool_bytes16 (tree_build_common.cuh) turns them into 16 bool bytes.
__device__ __forceinline__ unsigned int bits16_at(const unsigned int* words, int W, int col) {
    const int w = col >> 5, sh = col & 31;
    const unsigned int lo = words[w];
    const unsigned int hi = (w + 1 < W) ? words[w + 1] : 0u;
    return __funnelshift_r(lo, hi, sh) & 0xffffu;
}
__device__ __forceinline__ unsigned int chunk_bits16(const unsigned int* rw, int W, int N1, int c) {
    unsigned int v = bits16_at(rw, W, c);
    const int in_row = N1 - c;
    if (in_row < 16) {
        v &= (1u << in_row) - 1u;
        v |= (bits16_at(rw + W, W, 0) << in_row) & 0xffffu;
    }
    return v;
}

// The bool rows of tree b [N1, N1] from its packed bits (written by this block, visible to all its threads),
// by the whole block: 16-byte stores for the chunks of the batch's flat mask that lie inside the tree's
// region [b * N1^2, (b + 1) * N1^2), byte stores for the bytes it shares a chunk with trees b - 1 and b + 1.
__device__ void expand_own_tree(const unsigned int* __restrict__ bits_b, int N1, int W, long long b,
                                unsigned char* __restrict__ visibility) {
    const int S = N1 * N1;
    const long long lo = b * S, hi = lo + S;
    const long long c_lo = (lo + 15) >> 4, c_hi = hi >> 4;  // chunks wholly inside the tree
    auto bit_at = [&](int rem) -> unsigned int {
        const int r = rem / N1, c = rem - r * N1;
        return (bits_b[r * W + (c >> 5)] >> (c & 31)) & 1u;
    };
    uint4* out = reinterpret_cast<uint4*>(visibility);  // allocation is 256-byte aligned
    // the thread's chunk starts at byte rem of the tree, row r, column c; its next chunk is 16 blockDim bytes
    // on: (step_r rows, step_c columns) further, so one division a thread instead of one a chunk
    const int step = 16 * static_cast<int>(blockDim.x), step_r = step / N1, step_c = step - step_r * N1;
    int rem = static_cast<int>((c_lo << 4) - lo) + 16 * static_cast<int>(threadIdx.x);
    int r = rem / N1, c = rem - r * N1;
    for (long long ci = c_lo + threadIdx.x; ci < c_hi; ci += blockDim.x) {
        unsigned int v = 0u;
        if (N1 >= 16) {  // the 16 bytes span this row and at most the next one, both in the tree
            v = chunk_bits16(bits_b + r * W, W, N1, c);
        } else {
            for (int k = 0; k < 16; ++k) v |= bit_at(rem + k) << k;
        }
        out[ci] = bool_bytes16(v);
        rem += step;
        r += step_r;
        c += step_c;
        if (c >= N1) { c -= N1; ++r; }
    }
    const long long head_end = c_lo < c_hi ? (c_lo << 4) : hi;  // no whole chunk: every byte goes singly
    const long long tail_begin = c_lo < c_hi ? (c_hi << 4) : hi;
    for (long long q = lo + threadIdx.x; q < head_end; q += blockDim.x)
        visibility[q] = static_cast<unsigned char>(bit_at(static_cast<int>(q - lo)));
    for (long long q = tail_begin + threadIdx.x; q < hi; q += blockDim.x)
        visibility[q] = static_cast<unsigned char>(bit_at(static_cast<int>(q - lo)));
}
