"""Everything this package loads of SGLang, in one place, and the bridge from a live SGLang DDTree service.

- ``source``: SGLang's ``build_ddtree_tree_from_topk``, found in an installed ``sglang`` or loaded by path
  from a checkout or its file, with where it came from (what ``builders.sglang`` times);
- ``files``: SGLang's files (extracted from the sglang wheel, or an installed ``sglang``'s) imported without
  ``import sglang``, through one import finder and our stand-ins (``stubs``); the MoE impls' entry points;
- ``jit``: SGLang's JIT modules built ahead of time and loaded without a rebuild; why the JIT cannot build;
- ``attention``: SGLang's Triton tree-verify attention file, its fork's FA3 and merge, its Triton tree accept,
  upstream's Triton DFlash chain accept;
- ``service``: from a live service, ``record`` its builder's inputs as a trace, ``parse_profile_log``.

One error style: a path the user gave that is wrong is a ``ValueError`` (bad input); anything else that keeps
SGLang's code from loading or running here is ``SglangUnavailable``, whose message is one line (``describe``
gives a cause's). The callers (the builder, the attention peers, the MoE impls, the stacks) turn it into
their own "unavailable" reasons. This package imports nothing of the benchmark above it (builders, ops, k26,
stages).
"""

from __future__ import annotations

from ddtree_bench.integrations.sglang.attention import (
    ACCEPT_FILE,
    ACCEPT_FUNCTION,
    ATTENTION_FILES,
    CHAIN_ACCEPT_FILE,
    CHAIN_ACCEPT_FUNCTION,
    MERGE_FILE,
    find_accept_file,
    find_attention_file,
    load_accept,
    load_chain_accept,
    load_extend_attention,
    load_fa3,
    load_merge_state,
)
from ddtree_bench.integrations.sglang.errors import SglangUnavailable, describe
from ddtree_bench.integrations.sglang.files import (
    MOE_ENTRY_POINTS,
    REPACK_MODULE,
    REQUIRED_FILES,
    files_version,
    install_sglang_files,
    load_sglang_moe,
    sglang_moe_root,
    sglang_roots,
)
from ddtree_bench.integrations.sglang.jit import PREBUILT_ENV, jit_reason
from ddtree_bench.integrations.sglang.service import (
    DEFAULT_MAX_BYTES,
    WORKER_MODULE,
    Profile,
    Recording,
    budget_fragment,
    fragment_yaml,
    parse_profile_log,
    record,
)
from ddtree_bench.integrations.sglang.source import (
    FUNCTION_NAME,
    KNOWN_FILE_PATHS,
    KNOWN_MODULE_PATHS,
    Found,
    check_source,
    file_sha256,
    find_function,
    git_provenance,
    installed_version,
    load_function,
    load_source,
    resolve_source,
    sglang_version,
)

__all__ = [
    "ACCEPT_FILE",
    "ACCEPT_FUNCTION",
    "ATTENTION_FILES",
    "CHAIN_ACCEPT_FILE",
    "CHAIN_ACCEPT_FUNCTION",
    "MERGE_FILE",
    "DEFAULT_MAX_BYTES",
    "FUNCTION_NAME",
    "KNOWN_FILE_PATHS",
    "KNOWN_MODULE_PATHS",
    "MOE_ENTRY_POINTS",
    "PREBUILT_ENV",
    "REPACK_MODULE",
    "REQUIRED_FILES",
    "WORKER_MODULE",
    "Found",
    "Profile",
    "Recording",
    "SglangUnavailable",
    "budget_fragment",
    "check_source",
    "describe",
    "file_sha256",
    "files_version",
    "find_accept_file",
    "find_attention_file",
    "find_function",
    "fragment_yaml",
    "git_provenance",
    "install_sglang_files",
    "installed_version",
    "jit_reason",
    "load_accept",
    "load_chain_accept",
    "load_extend_attention",
    "load_fa3",
    "load_merge_state",
    "load_function",
    "load_sglang_moe",
    "load_source",
    "parse_profile_log",
    "record",
    "resolve_source",
    "sglang_moe_root",
    "sglang_roots",
    "sglang_version",
]
