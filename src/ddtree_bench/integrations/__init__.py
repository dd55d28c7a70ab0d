"""Other systems' code, loaded below the rest of the benchmark: ``integrations.sglang`` (SGLang's tree
builder, its kernel files, its JIT modules, and the bridge from a live SGLang DDTree service)."""
