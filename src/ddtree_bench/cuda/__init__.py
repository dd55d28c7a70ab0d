"""The CUDA side: building kernels with nvcc (fatbins, cached), probing the GPU, loading kernels (``loader``),
and the GPU self-test (``python -m ddtree_bench.cuda.selftest``)."""
