"""Writing outputs: every file the package writes appears whole or not at all.

``atomic_output(path)`` is the one atomic writer (a temporary file beside ``path``, renamed over it on
success, removed on failure); ``write_json`` and ``write_frame`` (parquet) are built on it;
``staged_folder(folder)`` does the same for a folder of files (the report). Nothing here imports pandas, so
workflow scripts that only write JSON stay light.
"""

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path


@contextlib.contextmanager
def atomic_output(path):
    """Yield a temporary path in ``path``'s directory (same suffix); on success it replaces ``path``
    atomically, on any error it is removed, so a partial ``path`` never exists."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:  # like mkstemp, but with the umask's permissions (mkstemp makes 0600 files)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def staged_folder(folder):
    """Yield a new empty folder beside ``folder`` to write into; on success its files move into ``folder``
    (the whole folder where ``folder`` does not exist yet, else file by file, each replacing its namesake,
    other files kept), on any error it is removed: a half-written ``folder`` never exists."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    while True:  # like mkdtemp, but with the umask's permissions (mkdtemp makes 0700 folders)
        stage = folder.parent / f".{folder.name}.{secrets.token_hex(6)}.tmp"
        try:
            stage.mkdir()
            break
        except FileExistsError:
            continue
    try:
        yield stage
        if not folder.exists():
            os.replace(stage, folder)
            return
        for path in sorted(stage.rglob("*")):
            if path.is_file():
                target = folder / path.relative_to(stage)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_json(data, path) -> None:
    """Write ``data`` as indented JSON (keys sorted) atomically."""
    with atomic_output(path) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_frame(df, path) -> None:
    """Write the DataFrame ``df`` to a parquet file atomically (no partial file on failure)."""
    with atomic_output(path) as tmp:
        df.to_parquet(tmp, index=False)


#: What ``check_writable`` writes to find a full disk (and removes).
PROBE_BYTES = 64 << 10


def check_writable(path, what: str, *, folder: bool = False) -> Path:
    """Raise ``ValueError`` (one line starting with ``what``) unless ``path`` can be written: a file (or with
    ``folder``, a folder) there can be created or replaced, its missing parent folders created. Checked before
    any work, so an unwritable output fails at once instead of after the work with a raw errno."""
    path = Path(path)
    if path.exists():
        if folder and not path.is_dir():
            raise ValueError(f"{what} {path}: exists and is not a folder")
        if not folder and path.is_dir():
            raise ValueError(f"{what} {path}: is a folder, not a file")
    target = path if folder and path.is_dir() else path.parent
    existing = target
    while not existing.exists():  # the nearest existing ancestor: the missing ones are created under it
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what} {path}: {existing} is not a folder")
    # create, write (and remove) a file where the first new entry would go: permission bits alone can say yes
    # where writing fails (read-only mounts, /proc, root on a read-only export), and an empty file can be made
    # on a full disk
    probe = existing / f".{path.name or 'out'}.{secrets.token_hex(6)}.probe"
    try:
        handle = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        where = "not writable" if existing == path else f"cannot create it in {existing}"
        raise ValueError(f"{what} {path}: {where} ({error.strerror})") from None
    try:
        os.write(handle, bytes(PROBE_BYTES))
        os.fsync(handle)
    except OSError as error:
        raise ValueError(f"{what} {path}: cannot write in {existing} ({error.strerror})") from None
    finally:
        os.close(handle)
        with contextlib.suppress(OSError):
            probe.unlink()
    return path
