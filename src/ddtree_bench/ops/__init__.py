"""The Python side of each GPU kernel: input checks, launch plan, launch and a CPU reference (``attention``:
verify attention; ``accept``: tree accept; ``attention_peers``: the PyTorch peers of verify attention)."""
