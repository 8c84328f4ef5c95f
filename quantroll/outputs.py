"""The one file-handling layer of the commands that write (train, sft, convert, compare,
attribute, the --save-hf export): checks of the paths a command will write, made before
its work, and the rule of what quantroll may replace.

A path it could not write fails at once, in one line naming the flag, not after the
work is done.

"Could not write" is tried, not guessed from permission bits (a read-only filesystem,
or a user for whom the bits do not apply, root, would pass those): a hidden probe file
is created in the directory that will hold the output and removed again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from quantroll import durable
from quantroll.errors import QuantrollError


def _probe(flag: str, value: str, directory: Path) -> None:
    """Create and remove a file in ``directory``; one line naming the flag if that fails."""
    probe = durable.temp_name(directory / "quantroll-write-test", "tmp")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as err:
        raise QuantrollError(f"{flag} {value}: cannot write in {directory} ({durable.advice(err)})") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def _nearest_existing(path: Path) -> Path:
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            return p
    return Path("/")


def check_output_path(flag: str, value: str, *, is_file: bool) -> None:
    """``value`` can be created or replaced as a file (``is_file``) or a directory: its
    parent directory exists and can be written, and it is not already the other kind."""
    path = Path(value)
    parent = path.absolute().parent
    if not parent.is_dir():
        above = _nearest_existing(parent)
        if above.exists() and not above.is_dir():
            raise QuantrollError(f"{flag} {value}: {above} is a file, not a directory; choose another path")
        raise QuantrollError(f"{flag} {value}: the directory {parent} does not exist; create it first "
                             f"(mkdir -p {parent}) or choose another path")
    if is_file and path.is_dir():
        raise QuantrollError(f"{flag} {value} is a directory; give a file path")
    if not is_file and path.exists() and not path.is_dir():
        raise QuantrollError(f"{flag} {value} is a file; give a directory path")
    _probe(flag, value, path if (not is_file and path.is_dir()) else parent)


def check_output_dir(flag: str, value: str) -> None:
    """``value`` is a directory that exists or can be created with its parents: nothing
    on the way is a file, and the nearest existing directory can be written."""
    path = Path(value).absolute()
    above = _nearest_existing(path)
    if not above.is_dir():
        what = f"{value} is a file" if above == path else f"{above} is a file, not a directory"
        raise QuantrollError(f"{flag} {value}: {what}; give a directory path")
    _probe(flag, value, above)


# -- what quantroll owns ---------------------------------------------------------------
# Every directory quantroll writes holds MARKER, a JSON record of the files (and whole
# sub-directories) it wrote there. It is what makes replacing safe: an existing output
# is replaced only with --force and only when every file in it is listed (or is one of
# quantroll's own lock and temporary files); anything else is the user's, so the output
# is refused naming it, --force or not. An empty directory, or one holding only
# quantroll's lock, may always be used.

MARKER = ".quantroll"
MARKER_FORMAT = "quantroll-output"
_ALWAYS_OURS = (MARKER, ".quantroll.lock")
SHOWN = 3  # foreign files named in a refusal

FORCE_HELP = ("replace an existing output, but only one quantroll wrote all of (a directory whose files are all "
              "listed in its .quantroll; a metrics file that starts with a quantroll step record): one holding "
              "anything else is refused, --force or not, and an empty directory is always used. Default: an existing "
              "output is refused")


def _is_ours_by_name(name: str) -> bool:
    return name in _ALWAYS_OURS or durable.is_temp_name(name)


def read_marker(directory: str | Path) -> tuple[frozenset[str], frozenset[str]]:
    """(files, directories) the directory's marker lists, as relative POSIX paths; empty
    when there is no marker or it is not one quantroll wrote (then nothing is ours)."""
    try:
        record = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return frozenset(), frozenset()
    if not isinstance(record, dict) or record.get("format") != MARKER_FORMAT:
        return frozenset(), frozenset()

    def names(key: str) -> frozenset[str]:
        value = record.get(key)
        return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) else frozenset()

    return names("files"), names("dirs")


def list_files(root: str | Path) -> list[str]:
    """Every file (and link, and other non-directory) under ``root``, relative, sorted;
    quantroll's marker, locks and temporary files left out."""
    root = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            rel = (here / name).relative_to(root).as_posix()
            if not (here == root and _is_ours_by_name(name)) and not durable.is_temp_name(name):
                out.append(rel)
    return sorted(out)


def foreign_files(directory: str | Path, also_ours: Callable[[str], bool] | None = None) -> list[str]:
    """Files in ``directory`` that quantroll did not write: not listed in its marker (nor
    under a listed directory), nor ``also_ours(top-level name)``. [] for a missing one."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    files, dirs = read_marker(directory)
    out = []
    for rel in list_files(directory):
        parts = rel.split("/")
        if rel in files or any("/".join(parts[:k]) in dirs for k in range(1, len(parts))):
            continue
        if also_ours is not None and also_ours(parts[0]):
            continue
        out.append(rel)
    return out


def _name_foreign(foreign: list[str]) -> str:
    shown = ", ".join(foreign[:SHOWN]) + (f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else "")
    return f"files quantroll did not write ({shown})"


def refuse_foreign(what: str, directory: str | Path, also_ours: Callable[[str], bool] | None = None,
                   writes: tuple[str, ...] = ()) -> None:
    """One line naming up to SHOWN files that are not quantroll's, if there are any. ``writes``:
    the top-level names the command writes; a directory holding some of them but no marker
    is named as an older quantroll's output (written before markers), refused the same way."""
    foreign = foreign_files(directory, also_ours)
    if not foreign:
        return
    if not any(read_marker(directory)) and {f.split("/")[0] for f in foreign} & set(writes):
        raise QuantrollError(f"{what} looks like the output of an older quantroll (it has no {MARKER} marker), whose "
                             "files quantroll cannot claim: it is neither continued nor replaced; move it away or "
                             "choose another directory")
    raise QuantrollError(f"{what} holds {_name_foreign(foreign)}; quantroll never replaces or deletes them, "
                         "--force or not: move them away or choose another directory")


def check_replace(what: str, path: str | Path, force: bool) -> None:
    """The rule for a directory a command replaces as a whole: absent or empty, or
    quantroll's own with ``force``. ``what`` names it ("--save-dir out")."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_symlink() or not path.is_dir():
        raise QuantrollError(f"{what} exists and is not a directory; choose another path")
    here = Path.cwd().resolve()
    if path.resolve() == here or path.resolve() in here.parents:
        raise QuantrollError(f"{what} is the current directory (or holds it), which quantroll never replaces; "
                             "give a new directory")
    refuse_foreign(what, path)
    if list_files(path) and not force:
        raise QuantrollError(f"{what} already holds an output quantroll wrote; pass --force to replace it, or choose "
                             "another directory")


def write_marker(directory: str | Path, files: list[str] | None = None, dirs: tuple[str, ...] = ()) -> None:
    """Record what quantroll wrote in ``directory`` (default: every file now in it)."""
    directory = Path(directory)
    record = {"format": MARKER_FORMAT, "written_by": "quantroll",
              "files": sorted(list_files(directory) if files is None else files), "dirs": sorted(dirs)}
    durable.write_atomic(directory / MARKER, json.dumps(record, indent=1) + "\n")


def record_owned(directory: str | Path, files: tuple[str, ...] = (), dirs: tuple[str, ...] = (),
                 drop: tuple[str, ...] = ()) -> None:
    """Add ``files`` and ``dirs`` to the directory's marker (creating it), drop ``drop``."""
    old_files, old_dirs = read_marker(directory)
    write_marker(directory, sorted((old_files | set(files)) - set(drop)), tuple(sorted((old_dirs | set(dirs)) - set(drop))))


def write_owned_file(directory: str | Path, name: str, text: str) -> None:
    """Write ``directory/name`` atomically and record it as quantroll's."""
    durable.write_atomic(Path(directory) / name, text)
    record_owned(directory, files=(name,))


# -- single JSON report files (--json of inspect and bench) ------------------------------
# A report file carries WRITTEN_BY at its top level, so that a later run can tell its own
# report (replaced, as a re-run expects) from a file of the user's (refused, always).

WRITTEN_BY = {"written_by": "quantroll"}
REPORT_RULE = "an existing FILE is replaced only if it is a JSON report quantroll wrote; any other file is refused"


def _is_our_report(path: Path) -> bool:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("written_by") == WRITTEN_BY["written_by"]


def check_report_file(flag: str, value: str) -> None:
    """``value`` can take a JSON report: writable, and absent, empty or one quantroll wrote."""
    check_output_path(flag, value, is_file=True)
    path = Path(value)
    if path.is_file() and path.stat().st_size and not _is_our_report(path):
        raise QuantrollError(f"{flag} {value} exists and is not a report quantroll wrote; quantroll never replaces it: "
                             "choose another file")


def write_report(flag: str, value: str, record: dict) -> None:
    """Write ``record`` (marked as quantroll's) to ``value`` atomically; checked again
    here, since the work before it may have taken hours and the file may have appeared."""
    check_report_file(flag, value)
    with durable.writing(f"{flag} {value}"):
        durable.write_atomic(value, json.dumps({**WRITTEN_BY, **record}, indent=2) + "\n")
