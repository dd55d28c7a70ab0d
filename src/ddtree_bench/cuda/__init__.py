"""The CUDA side: building kernels with nvcc (fatbins, cached), probing the GPU, loading kernels
(``loader``)."""
