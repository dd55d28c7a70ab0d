"""Pieces of a Kimi K2.6 forward on one GPU's share of tensor parallel 8 (routed experts: ``moe``)."""
