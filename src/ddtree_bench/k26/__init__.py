"""One GPU's share of Kimi K2.6 and its drafter: shapes and arithmetic, the GPU model, the MoE kernels."""
