"""UsageError and the checks of flags that name local files, folders or Hub ids, run before anything is loaded (a typo
reports the path, not a failed connection to the Hub)."""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path


class UsageError(ValueError):
    """A bad flag value, found before training starts (the CLI prints it and exits with status 2)."""


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message (library errors often span many lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def name_list(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def looks_like_local_path(value: str) -> bool:
    """Whether a --model_name_or_path/--config_name/--tokenizer_name value names a local file or folder rather than
    a Hub id: it exists, starts with '.', '/' or '~', ends with a separator, has more than one separator, or its
    first component is an existing folder (``outputs/run``). A Hub id is ``name`` or ``org/name``."""
    if Path(value).expanduser().exists():
        return True
    normalised = value.replace(os.sep, "/")
    if normalised.startswith((".", "/", "~")) or normalised.endswith("/"):
        return True
    parts = normalised.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def check_local_path(flag: str, value: str, what: str = "folder") -> None:
    """Raise :class:`UsageError` naming the first missing folder when ``value`` looks local but does not exist (so
    a typo reports the path, not a failed connection to the Hub)."""
    if not looks_like_local_path(value):
        return
    path = Path(value).expanduser()
    if path.exists():
        return
    missing = path
    for parent in path.parents:  # the shortest prefix that does not exist
        if str(parent) not in ("", ".") and not parent.exists():
            missing = parent
    if missing == path:
        raise UsageError(f"{flag} {value!r}: no such {what}.")
    raise UsageError(f"{flag} {value!r}: no such folder {str(missing)!r}.")


def hub_hint(value: str) -> str:
    """For an error loading ``value``: says that no local folder has that name (so it was looked up on the Hub)."""
    return "" if Path(value).expanduser().exists() else "there is no local folder of that name, and as a Hub id: "


def closest_name(path: Path) -> str:
    """`` (did you mean 'outputs/mlm'?)`` for the closest existing name beside the nearest existing folder."""
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return ""
    try:
        names = sorted(entry.name for entry in parent.iterdir() if entry.is_dir())
    except OSError:
        return ""
    part = path.relative_to(parent).parts[0] if path.is_relative_to(parent) and path != parent else path.name
    match = difflib.get_close_matches(part, names, n=1)
    return f" (did you mean {str(parent / match[0])!r}?)" if match else ""


def hub_lookup_error(value: str) -> str | None:
    """``None`` when ``value`` can be loaded as a Hub model id (it exists there, or is in the local Hub cache, or the
    Hub is switched off with ``HF_HUB_OFFLINE`` and transformers will look in the cache itself); else why not. One
    metadata request, which fails at once without the network (file downloads retry for about 45 s first)."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        model_info(value, timeout=10)
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return "nor a model on the Hub (a private one needs `hf auth login`)"
    except Exception as error:  # no network: connection errors, timeouts
        try:
            if isinstance(try_to_load_from_cache(value, "config.json"), str):
                return None
        except Exception:  # an id the cache cannot even parse
            pass
        return f"and the Hub cannot be reached to look it up as a model id ({first_line(error)})"
    return None


def check_local_source(value: str | None, flag: str, needs: Sequence[str] = ("config.json",),
                       allow_file: bool = False, hub: bool = True) -> None:
    """Refuse, before anything is loaded, a ``--model_name_or_path`` / ``--config_name`` / ``--tokenizer_name`` that
    names a local folder which does not exist (or lacks all of ``needs``): transformers would take it for a Hub id
    and fail on the network after a long wait. Raises :class:`UsageError` naming the flag and the folder (and the
    closest existing name). A value that can be a Hub id (``name``, ``org/name``) and is no local path is looked up
    on the Hub when ``hub`` is true: refused when it is not there or the Hub is unreachable and it is not cached."""
    if value is None:
        return
    path = Path(value).expanduser()
    if path.is_dir():
        if needs and not any((path / name).is_file() for name in needs):
            raise UsageError(f"{flag} {value!r} is a folder without {' or '.join(needs)}.")
        return
    if path.exists():
        if allow_file:
            return
        raise UsageError(f"{flag} {value!r} is a file; a folder (or a Hub id) is needed.")
    if looks_like_local_path(value) or value.endswith(".json"):  # a config file, never a Hub id
        raise UsageError(f"{flag} {value!r}: no such local folder{closest_name(path)}.")
    problem = hub_lookup_error(value) if hub else None
    if problem is not None:
        raise UsageError(f"{flag} {value!r} is not a local folder{closest_name(path)}, {problem}.")


@contextlib.contextmanager
def exit_on_usage_error(script: str) -> Iterator[None]:
    """Around a script's ``main``: a :class:`UsageError` prints one ``SCRIPT: error: ...`` line on stderr and exits
    with status 2 (argparse's convention), instead of a traceback."""
    try:
        yield
    except UsageError as error:
        print(f"{script}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
