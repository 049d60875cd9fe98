"""The data layer's own errors, and the file check every reader makes before it opens a file; the
runner presents the errors as one-paragraph messages. Cheap to import (no MindSpore)."""

import os
from typing import Optional


class DataError(Exception):
    """A data problem: missing path, empty folder, unreadable file, bad labels; the message names it."""


class DataConfigError(DataError):
    """Data or padding settings that cannot work (out of range, contradictory)."""


def error_reason(err: BaseException) -> str:
    """The reason an error gives, on one line and uncut, for quoting in a refusal.

    MindSpore's errors open with a generic line ("Exception thrown from dataset pipeline. Refer to
    'Dataset Pipeline Error Message'.") and end with a C++ call stack; the reason is the section
    between. Cutting the text at a fixed length, or keeping its first line, kept the generic part and
    lost the reason, so the section is taken whole and the call stack left out.
    """
    lines = [line.strip() for line in str(err).splitlines()]
    kept, section = [], None
    for line in lines:
        if line.startswith("- ") and line.rstrip(": ").endswith(
            ("Error Message", "Call Stack: (For framework developers)")
        ):
            section = "stack" if "Call Stack" in line else "message"
            continue
        if set(line) <= {"-"}:
            continue
        if section == "message" or (section is None and line):
            kept.append(line)
    if any(line.startswith("- ") and "Error Message" in line for line in lines):
        kept = [k for k in kept if not k.startswith(("Exception thrown from", "For more details"))]
    text = " ".join(" ".join(kept).split()).replace("[ERROR] ", "")
    return text or type(err).__name__


def not_regular(path: str) -> Optional[str]:
    """Why path cannot be read as a data file, or None: every reader asks this before it opens a file,
    because opening a FIFO blocks until another process writes to it (the run would hang), and a
    device or socket is no data. Symbolic links are followed: a link to a regular file is read."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if os.path.islink(path):  # the target named: the user can see which file went missing
            return f"a symbolic link to nowhere ({os.readlink(path)} does not exist)"
        return f"cannot be opened ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device or other special file"
    return f"not a regular file ({kind})"
