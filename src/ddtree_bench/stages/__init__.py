"""The measured stages, each a ``run_*() -> rows`` function: the tree build on the CPU (``build``) and the
GPU (``build_gpu``), in the serving loop (``insitu``), the equality check (``check``), verify attention
(``attention``), tree accept (``accept``) and the GPU's peaks (``peaks``)."""
