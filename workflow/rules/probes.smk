"""The workflow's parse-time probes: what can run on this machine (nvcc, a usable GPU, SGLang's builder, the
in-situ mode), each probed once when the workflow is parsed. Included by common.smk, which decides from
these reasons which jobs run and which get an "unavailable" row instead."""


def nvcc_path():
    """nvcc's path (as ddtree_bench.cuda.loader finds it), or None where there is none."""
    try:
        from ddtree_bench.cuda.loader import find_nvcc
    except ImportError:
        return shutil.which("nvcc")
    return find_nvcc()


def gpu_reason():
    """Why the GPU jobs are left out here (None: they run). `gpu: on` without a GPU stops the run."""
    if SETTINGS.gpu == "off":
        return "gpu: off in the configuration"
    try:
        from ddtree_bench.cuda.loader import gpu_unavailable_reason
    except ImportError as error:
        reason = f"ddtree_bench.cuda.loader cannot be imported ({error})"
    else:
        reason = gpu_unavailable_reason()
    if reason is not None and SETTINGS.gpu == "on":
        bad_input(f"config: gpu: on, but no usable GPU here: {reason}")
    return reason


def sglang_reason():
    """Why SGLang's builder cannot run here (None: it can); probed once, when the workflow is parsed.
    With sglang.source set, a failure stops the run with one line instead (the user asked for that file).
    """
    if SETTINGS.sglang.source is not None:
        from ddtree_bench.builders import get_builder

        try:
            return get_builder(
                "sglang", **builder_options("sglang")
            ).unavailable_reason()
        except ValueError as error:
            bad_input(f"config: sglang.source: {error}")
    try:
        from ddtree_bench.builders import get_builder

        return get_builder("sglang", **builder_options("sglang")).unavailable_reason()
    except (
        Exception
    ) as error:  # a broken SGLang install is "unavailable", with the error as the reason
        return f"{type(error).__name__}: {' '.join(str(error).split())}"


# Probed once, and only where a GPU job is configured (the gpu builder, the step stages).
GPU_REASON = (
    gpu_reason()
    if any(b in BUILDERS for b in catalog.builders_where(runner=catalog.GPU))
    or STEP["enabled"]
    else None
)


def in_situ_reason():
    """Why the in-situ mode cannot run here (None: it can, or it is off); probed once, when parsed."""
    if not IN_SITU:
        return None
    if SETTINGS.gpu == "off":
        return "gpu: off in the configuration"
    try:
        from ddtree_bench.cuda.loader import gpu_unavailable_reason
    except ImportError as error:
        return f"ddtree_bench.cuda.loader cannot be imported ({error})"
    return gpu_unavailable_reason()


# Where it is not None, each timing job adds one in-situ row saying why (no torch import, no trace re-read).
IN_SITU_REASON = in_situ_reason()
