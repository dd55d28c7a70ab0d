rule build_native:
    """Compile the native C++ tree builder (one thread and all-cores variants share the library)."""
    input:
        source=NATIVE_SOURCE,
        headers=NATIVE_HEADERS,
    output:
        library=NATIVE_LIBRARY,
    log:
        f"{LOGS}/build/native.log",
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        # the compiler, its version and every flag: another compiler or flag rebuilds it (and what it times)
        toolchain=lambda wildcards: native_toolchain(),
    script:
        "../scripts/build_native.py"


rule build_fatbin:
    """Compile a CUDA source (kernels/NAME/NAME.cu) to a fatbin: machine code per configured architecture, plus PTX."""
    input:
        source=KERNEL_SOURCE_PATTERN,
        headers=lambda wildcards: headers(f"kernels/{wildcards.kernel}"),
    output:
        fatbin=FATBIN_PATTERN,
        info=f"{FATBIN_PATTERN}.json",
    log:
        f"{LOGS}/build/{{kernel}}.fatbin.log",
    wildcard_constraints:
        kernel=r"[A-Za-z0-9_]+",
    conda:
        "../envs/ddtree-bench.yaml"
    params:
        archs=list(SETTINGS.cuda_archs),
        # nvcc, its version and every flag: another nvcc or flag rebuilds the kernel (and what it times)
        toolchain=lambda wildcards: fatbin_toolchain(
            KERNEL_SOURCE_PATTERN.format(kernel=wildcards.kernel), SETTINGS.cuda_archs
        ),
    script:
        "../scripts/build_fatbin.py"
