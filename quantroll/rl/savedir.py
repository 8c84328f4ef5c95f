"""A ``--save`` directory: versions of the trainer state behind one pointer file, so that
at every instant the directory names a complete state that loads.

    DIR/LATEST                         {"format": ..., "state": "step-00000012-1a2b3c4d", "step": 12}
    DIR/step-00000012-1a2b3c4d/        one complete state (quantroll/rl/state.py writes its files)
    DIR/.quantroll.lock                while a process trains into DIR (quantroll/locks.py)
    DIR/.quantroll                     what quantroll wrote there (quantroll/outputs.py): LATEST, the versions

A save writes the new version into a hidden ``.partial-`` directory beside the current
one, flushes it to disk and renames it to its version name, then replaces ``LATEST``
(``os.replace``: atomic), then deletes the version ``LATEST`` named before. Killed at
any instant, ``LATEST`` names a whole version: the old one until the replace, the new
one after. The leftovers of a kill (a ``.partial-`` directory, a version no longer
named) are deleted at the next start, by the process holding the lock.

(The save used to replace the whole directory with two renames; between them it did
not exist, and ``--load`` reported "not found" while the state sat in ``.DIR.old-*``,
which, like the ``.partial-*`` of a kill, nothing ever removed.)
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quantroll import durable, outputs
from quantroll.errors import QuantrollError
from quantroll.inputs import read_json
from quantroll.locks import LOCK_NAME

POINTER = "LATEST"
FORMAT = "quantroll-trainer-state"
LEGACY_FILES = ("trainer_state.pt", "step.json")  # the pickle format of quantroll <= 0.1, never read
_VERSION = re.compile(r"^step-(\d{8,})-[0-9a-f]{8}$")
_OURS = re.compile(r"^(step-\d{8,}-[0-9a-f]{8}|\.partial-\d+-[0-9a-f]{8}|\.LATEST\..*|LATEST)$")


@dataclass(frozen=True)
class SavedState:
    """The state ``LATEST`` names: its last finished step and its version directory."""

    step: int
    path: Path


def _damaged(directory: Path, what: str) -> QuantrollError:
    return QuantrollError(f"--load {directory}: {what}; resume from another save, or start over with --force")


def latest(directory: str | Path) -> SavedState | None:
    """The state the directory's pointer names, or None when it has none. A pointer that
    is damaged, or names a version that is not there, is one line."""
    directory = Path(directory)
    pointer = directory / POINTER
    if not pointer.is_file():
        if any((directory / name).exists() for name in LEGACY_FILES):
            raise QuantrollError(f"--load {directory} holds trainer_state.pt, the pickle format of an older quantroll, "
                                 "which quantroll no longer reads (unpickling a file can run code); start the run "
                                 "again with --force")
        return None
    record = read_json(pointer, "save pointer", fix="resume from another save, or start over with --force")
    name, step = record.get("state"), record.get("step")
    if record.get("format") != FORMAT or not isinstance(name, str) or not _VERSION.match(name) \
            or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise _damaged(directory, f"{POINTER} is not a quantroll state pointer")
    path = directory / name
    if not path.is_dir():
        raise _damaged(directory, f"{POINTER} names {name}, which is missing")
    return SavedState(step, path)


def holds_run(directory: str | Path) -> bool:
    """Whether the directory holds a state of some run (current or older format)."""
    directory = Path(directory)
    if not directory.is_dir():
        return False
    return (directory / POINTER).exists() or any((directory / n).exists() for n in LEGACY_FILES) \
        or any(_VERSION.match(p.name) for p in directory.iterdir())


def written_by_a_save(name: str) -> bool:
    """Whether a top-level name in a --save directory is one a save writes (pointer,
    version, partial version, pointer temporary, the old format's files): what the
    directory's marker lists, recognised without it too (a kill between a rename and the
    marker's update; directories saved before the marker existed)."""
    return name in LEGACY_FILES or name == LOCK_NAME or _OURS.match(name) is not None


def clean(directory: str | Path) -> list[str]:
    """Delete what killed saves left: partial versions and versions ``LATEST`` does not
    name. Call it holding the directory's lock. Returns the names deleted."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    try:
        current = latest(directory)
    except QuantrollError:
        return []  # a damaged pointer: keep everything for the user to look at
    keep = current.path.name if current else None
    removed = []
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith((".partial-", f".{POINTER}.")) or (_VERSION.match(entry.name) and entry.name != keep):
            durable.remove(entry)
            removed.append(entry.name)
    for stale in durable.stale_temps(directory):  # e.g. the marker's temporary file, its writer killed
        if stale.exists():
            durable.remove(stale)
            removed.append(stale.name)
    listed_files, listed_dirs = outputs.read_marker(directory)
    gone = tuple(n for n in listed_files | listed_dirs if not (directory / n).exists())  # a kill before the marker's update
    if removed or gone:
        outputs.record_owned(directory, drop=tuple(removed) + gone)
    parent = directory.absolute().parent
    for entry in parent.iterdir():  # the .DIR.partial-* / .DIR.old-* of the old whole-directory save
        if re.match(rf"^\.{re.escape(directory.absolute().name)}\.(partial|old)-[A-Za-z0-9_]{{8}}$", entry.name):
            durable.remove(entry)
            removed.append(entry.name)
    return removed


def wipe(directory: str | Path) -> None:
    """--force: delete the state (pointer first, so that no instant has a pointer to a
    half-deleted version); the user's own files and the lock stay."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for name in (POINTER, *LEGACY_FILES):
        durable.remove(directory / name)
    durable.fsync_dir(directory)
    for entry in directory.iterdir():
        if entry.name != LOCK_NAME and _OURS.match(entry.name):
            durable.remove(entry)
    outputs.write_marker(directory, [])


def write_version(directory: str | Path, step: int, write: Callable[[Path], None]) -> Path:
    """Write a new version with ``write(tmp_dir)`` and make it the one ``LATEST`` names;
    the previous one is deleted after. A failure (full disk, Ctrl-C) deletes the partial
    version and leaves ``LATEST`` as it was."""
    directory = Path(directory)
    durable.make_dirs(directory)
    previous = latest(directory) if (directory / POINTER).is_file() else None
    tmp = directory / f".partial-{os.getpid()}-{secrets.token_hex(4)}"
    final = directory / f"step-{step:08d}-{secrets.token_hex(4)}"
    try:
        os.mkdir(tmp)
        os.chmod(tmp, durable.dir_mode())
        write(tmp)
        durable.fsync_dir(tmp)
        os.rename(tmp, final)
        durable.fsync_dir(directory)
        outputs.record_owned(directory, files=(POINTER,), dirs=(final.name,))
    except BaseException:
        durable.remove(tmp)
        raise
    try:
        durable.write_atomic(directory / POINTER, _pointer(final.name, step))
    except BaseException:
        if not _names(directory, final.name):  # interrupted after the replace: final is the state now
            durable.remove(final)
        raise
    if previous is not None and previous.path != final:
        durable.remove(previous.path)
        outputs.record_owned(directory, drop=(previous.path.name,))
    return final


def _names(directory: Path, name: str) -> bool:
    try:
        return f'"{name}"' in (directory / POINTER).read_text()
    except (OSError, UnicodeDecodeError):
        return False


def _pointer(name: str, step: int) -> str:
    import json

    return json.dumps({"format": FORMAT, "state": name, "step": step}) + "\n"
