// The tree-build emulators' inputs and outputs (tests/test_tree_build_emulator.py,
// tests/test_tree_build_block_emulator.py): exact-size allocations (AddressSanitizer sees any access past
// them), outputs filled with UNWRITTEN bytes first (what the kernel must overwrite), written back in the
// order of the kernels' parameter list (host_programs.run_tree_emulator reads them).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

template <class T> static T* output_array(long long n) {
    T* p = static_cast<T*>(std::malloc(n > 0 ? n * sizeof(T) : 1));
    std::memset(p, UNWRITTEN, n > 0 ? n * sizeof(T) : 1);
    return p;
}

struct EmuTrees {
    long long B = 0, N = 0;
    int* counts = nullptr;
    long long *tokens = nullptr, *depths = nullptr, *next_token = nullptr, *next_sibling = nullptr;
    int *parents = nullptr, *stats = nullptr;
    unsigned int* bits = nullptr;
    unsigned char* visibility = nullptr;  // null: no bool mask asked for

    void allocate(long long batch, long long budget, bool with_bool) {
        B = batch;
        N = budget;
        const long long n1 = N + 1, words = (n1 + 31) / 32;
        counts = output_array<int>(B);
        tokens = output_array<long long>(B * N);
        depths = output_array<long long>(B * N);
        parents = output_array<int>(B * n1);
        bits = output_array<unsigned int>(B * n1 * words);
        next_token = output_array<long long>(B * n1);
        next_sibling = output_array<long long>(B * n1);
        stats = output_array<int>(B);
        visibility = with_bool ? output_array<unsigned char>(B * n1 * n1) : nullptr;
    }
    bool write(const char* path) const {
        FILE* o = std::fopen(path, "wb");
        if (!o) return false;
        const long long n1 = N + 1, words = (n1 + 31) / 32;
        std::fwrite(counts, sizeof(int), B, o);
        std::fwrite(tokens, sizeof(long long), B * N, o);
        std::fwrite(depths, sizeof(long long), B * N, o);
        std::fwrite(parents, sizeof(int), B * n1, o);
        std::fwrite(bits, sizeof(unsigned int), B * n1 * words, o);
        std::fwrite(next_token, sizeof(long long), B * n1, o);
        std::fwrite(next_sibling, sizeof(long long), B * n1, o);
        std::fwrite(stats, sizeof(int), B, o);
        if (visibility) std::fwrite(visibility, 1, B * n1 * n1, o);
        return std::fclose(o) == 0;
    }
    void release() {
        std::free(counts); std::free(tokens); std::free(depths); std::free(parents); std::free(bits);
        std::free(next_token); std::free(next_sibling); std::free(stats); std::free(visibility);
    }
};
