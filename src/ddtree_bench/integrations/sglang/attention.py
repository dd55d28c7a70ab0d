"""SGLang's verify pieces, loaded: its Triton ``extend_attention_fwd`` (from its file, without
importing the ``sglang`` package: ``files.files_on_path``), the FA3 its DDTree fork runs on Hopper
(``sgl_kernel``'s, else the ``fa3-fwd`` package's), the merge of FA3's two passes (``sgl_kernel``'s
``merge_state_v2``, else the wheel's ``merge_state_triton``), the fork's Triton tree accept (beside its DDTree
utils file), and upstream's Triton DFlash chain accept (the wheel's ``ops/speculative/dflash.py``).

A path the user gave that does not hold the file is a ``ValueError``; anything else that keeps a piece from
loading here is ``SglangUnavailable`` (one line).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ddtree_bench.integrations.sglang.errors import SglangUnavailable, describe
from ddtree_bench.integrations.sglang.files import (
    files_on_path,
    files_version,
    installed_roots,
    installed_spec,
    sglang_roots,
)
from ddtree_bench.integrations.sglang.source import load_source, resolve_source

#: where SGLang keeps its Triton extend-attention kernel, relative to the folder that holds the ``sglang``
#: package: sglang 0.5.23's layout, then the older one
ATTENTION_FILES = (
    "sglang/kernels/ops/attention/extend_attention.py",
    "sglang/srt/layers/attention/triton_ops/extend_attention.py",
)
#: the fork's accept kernel, relative to the folder of its DDTree utils file
ACCEPT_FILE = Path("triton_ops") / "ddtree.py"
ACCEPT_FUNCTION = "_compute_ddtree_accept_triton_unchecked"
#: the wheel's Triton merge of two attention states (what ``merge_state`` falls back to without sgl_kernel)
MERGE_FILE = "sglang/kernels/ops/attention/merge_state.py"
MERGE_FUNCTION = "merge_state_triton"
#: upstream's linear DFlash accept (the chain's), in the wheel
CHAIN_ACCEPT_FILE = "sglang/kernels/ops/speculative/dflash.py"
CHAIN_ACCEPT_FUNCTION = "_compute_dflash_accept_bonus_triton_unchecked"
_LOADED: dict = {}


def _attention_file_under(roots) -> tuple[Path, str] | None:
    for root in roots:
        for rel in ATTENTION_FILES:
            if (root / rel).is_file():
                return root.resolve(), rel
    return None


def find_attention_file(source=None) -> tuple[Path, str]:
    """``(root, relative path)`` of SGLang's Triton extend-attention file: under ``source`` (a folder holding
    ``sglang/``, a checkout whose ``python/`` holds it, or the ``sglang`` package folder) or, when None, the
    installed ``sglang``'s (found, not imported). A ``source`` without the file is a ``ValueError`` (a
    configuration error); no installed ``sglang`` with the file, ``SglangUnavailable``."""
    if source is not None:
        source = Path(source).expanduser()
        found = _attention_file_under(sglang_roots(source))
        if found is None:
            raise ValueError(
                f"sglang_triton_source: no SGLang Triton extend-attention file under {source} "
                f"(looked for {' or '.join(ATTENTION_FILES)} there and under its python/)"
            )
        return found
    try:
        spec = installed_spec()
        reason = "no installed sglang package"
    except SglangUnavailable as exc:
        spec, reason = None, str(exc)
    if spec is None:
        raise SglangUnavailable(
            f"{reason}; pip install --no-deps sglang (0.5.23 was measured), or give "
            "step.attention.sglang_triton_source (a directory holding sglang/'s Triton attention files)"
        )
    found = _attention_file_under(installed_roots(spec))
    if found is None:
        raise SglangUnavailable(f"the installed sglang ({spec.origin}) has none of {list(ATTENTION_FILES)}")
    return found


def load_extend_attention(source=None):
    """``(extend_attention_fwd, description)`` from SGLang's file (``find_attention_file``), imported with
    SGLang's files on the path for the load only (``files.files_on_path``: packages as empty modules, our
    stand-ins for the platform queries). Loaded once per file and process. ``ValueError`` for a bad
    ``source``; ``SglangUnavailable`` (one line) where it cannot load (a file it needs missing, no Triton)."""
    root, rel = find_attention_file(source)
    key = str(root / rel)
    if key in _LOADED:
        return _LOADED[key]
    try:
        with files_on_path(root):
            fwd = importlib.import_module(rel[: -len(".py")].replace("/", ".")).extend_attention_fwd
    except Exception as exc:
        raise SglangUnavailable(f"{rel} under {root} does not load ({describe(exc)})") from exc
    version = files_version(root)
    loaded = (fwd, f"sglang{' ' + version if version else ''} {rel}")
    _LOADED[key] = loaded
    return loaded


def load_fa3():
    """``(flash_attn_with_kvcache, merge, paged, description)``: SGLang's ``sgl_kernel`` FA3 where it
    loads (paged KV, SGLang's ``merge_state_v2``), else ``fa3-fwd`` (no paged KV, ``flash_attn_combine``).
    ``SglangUnavailable`` (one line) where neither loads."""
    reasons = []
    try:
        from sgl_kernel import merge_state_v2  # noqa: PLC0415
        from sgl_kernel.flash_attn import flash_attn_with_kvcache  # noqa: PLC0415

        return flash_attn_with_kvcache, merge_state_v2, True, "sgl_kernel FA3 (SGLang's own)"
    except Exception as exc:  # noqa: BLE001 (a missing or ABI-incompatible package: try the next)
        reasons.append(f"sgl_kernel: {describe(exc, 120)}")
    try:
        import fa3_fwd_interface as fa3  # noqa: PLC0415

        return fa3.flash_attn_with_kvcache, fa3.flash_attn_combine, False, "fa3-fwd (FA3, no paged KV)"
    except Exception as exc:  # noqa: BLE001
        reasons.append(f"fa3-fwd: {describe(exc, 120)}")
    raise SglangUnavailable("FA3 with the MLA qv path does not load here (" + "; ".join(reasons) + ")")


def find_accept_file(source) -> Path:
    """The fork's ``triton_ops/ddtree.py`` beside the DDTree utils file that ``source`` names
    (``source.resolve_source``). ``ValueError`` (one line) where it is not there."""
    utils = resolve_source(source)
    path = utils.parent / ACCEPT_FILE
    if not path.is_file():
        raise ValueError(f"sglang source {utils}: no {ACCEPT_FILE} beside it (SGLang's Triton DDTree accept)")
    return path


def load_accept(source):
    """``(the fork's accept function, its file)`` (``find_accept_file``, loaded by path);
    ``SglangUnavailable`` (one line) where the file does not execute or lacks the function."""
    path = find_accept_file(source)
    try:
        return getattr(load_source(path), ACCEPT_FUNCTION), path
    except (ValueError, AttributeError) as exc:
        raise SglangUnavailable(f"{path}: {describe(exc)}") from exc


def _wheel_file(root, rel: str, what: str) -> Path:
    """``rel`` under the folder ``root`` holding SGLang's files (``files.sglang_roots``); ``ValueError`` (one
    line) where ``root`` is given and lacks it, ``SglangUnavailable`` where no root is given."""
    if root is None:
        raise SglangUnavailable(f"{what}: no folder of SGLang's files given (step.model.sglang_files)")
    for folder in sglang_roots(Path(root).expanduser()):
        if (folder / rel).is_file():
            return (folder / rel).resolve()
    raise ValueError(f"sglang files {root}: no {rel} there ({what})")


def load_merge_state(root=None):
    """``(merge, description)``: ``merge(prefix_out, prefix_lse, suffix_out, suffix_lse, out)`` merges two
    attention partials ``[T, H, D]`` by their log-sum-exps ``[T, H]`` into ``out``. SGLang's own
    ``sgl_kernel.merge_state_v2`` where it loads, else the wheel's ``merge_state_triton`` under ``root`` (the
    fallback SGLang takes itself)."""
    try:
        from sgl_kernel import merge_state_v2  # noqa: PLC0415

        def merge(a, lse_a, b, lse_b, out):
            merge_state_v2(a, lse_a, b, lse_b, out, None)

        return merge, "sgl_kernel merge_state_v2"
    except Exception:  # noqa: BLE001 (not installed, or built for another torch: the wheel's Triton kernel)
        pass
    path = _wheel_file(root, MERGE_FILE, "SGLang's merge_state")
    try:
        function = getattr(load_source(path), MERGE_FUNCTION)
    except (ValueError, AttributeError) as exc:
        raise SglangUnavailable(f"{path}: {describe(exc)}") from exc

    def merge(a, lse_a, b, lse_b, out):
        function(a, lse_a, b, lse_b, output=out, output_lse=None)

    return merge, f"{MERGE_FILE} {MERGE_FUNCTION}"


def load_chain_accept(root=None):
    """``(upstream's DFlash chain accept, its file)`` from the wheel's files under ``root``."""
    path = _wheel_file(root, CHAIN_ACCEPT_FILE, "SGLang's DFlash accept")
    try:
        return getattr(load_source(path), CHAIN_ACCEPT_FUNCTION), path
    except (ValueError, AttributeError) as exc:
        raise SglangUnavailable(f"{path}: {describe(exc)}") from exc
