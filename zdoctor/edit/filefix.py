"""A remedy that replaces one file's text through the safe core, with copyable lines that do the same.

The guide applies it with :mod:`zdoctor.edit.core_apply` (the ``file-replace`` action): only while the file is
still the regular file whose bytes were shown (not a link, same owner), the new text written beside it,
the old file kept under a new name, the new one renamed into place. The copyable lines do the same steps
in the same order and stop at the first failing one; the undo puts the backup back.
"""

from __future__ import annotations

import hashlib
import os

from zdoctor.core.model import Remedy
from zdoctor.core.shellquote import shell_quote


def owner_only(folder: str = ".") -> str:
    """The line a block that writes in ``folder`` starts with: it goes on only as that folder's owner.

    Root pasting the lines into a folder a user owns would let that user rename a link over the block's
    temporary file between two lines (a root-owned file written or chowned through it); as the owner, the
    block has no more rights than the one who could race it. ``.``: the folder the block has entered.
    """
    q = shell_quote(folder)
    return (f'[ "$(id -u)" = "$(stat -c %u -- {q})" ] || {{ echo "zdoctor: run these lines as the owner of '
            f"the folder they write in (sudo -u '#$(stat -c %u -- {q})' bash), not as $(id -un)\" >&2; false; }}")


def heredoc_tag(text: str, base: str = "ZDOCTOR_FILE") -> str:
    """A here-document end marker that no line of ``text`` equals."""
    tag, n = base, 0
    while any(line.strip() == tag for line in text.splitlines()):
        n += 1
        tag = f"{base}_{n}"
    return tag


def replace_remedy(path: str, old_text: str, new_text: str, *, title: str, explanation: str,
                   uid: int | None, requires_root: bool = False, requires: list[str] | None = None,
                   tag: str = "ZDOCTOR_FILE") -> Remedy:
    """The remedy that turns ``path`` (now ``old_text``, owned by ``uid`` when known) into ``new_text``."""
    body = new_text if new_text.endswith("\n") or not new_text else new_text + "\n"
    end = heredoc_tag(body, tag)
    sha = hashlib.sha256(old_text.encode("utf-8", "surrogateescape")).hexdigest()
    folder, name = os.path.split(os.path.abspath(path))
    backup = f"{path}.bak.zdoctor-{sha[:12]}"
    qn = shell_quote(name)
    # One test a line: `set -e` does not stop at a failure on the left of `&&`.
    unchanged = ([f"test \"$(stat -c %u -- {qn})\" = {uid}"] if uid is not None else []) + \
        [f"test \"$(sha256sum < {qn})\" = '{sha}  -'"]
    commands = [
        f"cd -P -- {shell_quote(folder)}",
        owner_only(),
        f"test -f {qn}",
        f"test ! -L {qn}",
        *unchanged,
        f"new=$(mktemp -- {shell_quote('.' + name + '.zdoctor-XXXXXX')})",
        f"cat > \"$new\" <<'{end}'\n{body}{end}",
        f"chmod --reference={qn} -- \"$new\"",
        f"chown --reference={qn} -- \"$new\"",
        "sync -- \"$new\"",
        f"ln -- {qn} {shell_quote(os.path.basename(backup))}",
        *unchanged,
        f"mv -f -- \"$new\" {qn}",
    ]
    return Remedy(title=title, commands=commands, verified=False, requires_root=requires_root,
                  undo=[f"mv -f -- {shell_quote(backup)} {shell_quote(path)}"], requires=list(requires or []),
                  action={"kind": "file-replace", "path": path, "sha256": sha, "uid": uid, "text": body,
                          "backup": backup},
                  explanation=explanation)
