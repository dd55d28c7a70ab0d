"""Small shares of the target and the drafter for the GPU tests of model/ (the real kernels, seconds to run):
the verify attention's fixed 576-wide latent (kv_lora_rank 512 + rope 64) and 8 query heads a rank."""

from ddtree_bench.k26.shapes import DrafterShape, ModelShape

SMALL_TARGET = ModelShape(
    hidden=1024,
    layers=3,
    dense_layers=1,
    experts=16,
    top_k=4,
    moe_intermediate=512,
    shared_intermediate=512,
    dense_intermediate=1024,
    heads=16,
    q_lora_rank=256,
    vocab=4096,
    tp=2,
)
SMALL_DRAFTER = DrafterShape(
    layers=2, hidden=1024, heads=16, kv_heads=2, head_dim=128, intermediate=1024, tp=2
)
