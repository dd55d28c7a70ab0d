"""PROVISIONAL (replaced by the moe branch at merge)."""

MOE_IMPLS = ("marlin-w4a16", "triton-w4a16", "bf16-grouped-mm")


def weight_bytes(impl, experts, hidden, intermediate, group_size=32):
    weights = 3 * experts * hidden * intermediate
    if impl == "bf16-grouped-mm":
        return 2.0 * weights
    return weights * (0.5 + 2.0 / group_size)
