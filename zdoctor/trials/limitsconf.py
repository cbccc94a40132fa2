"""The remedy that raises a limit for every PAM login: a new drop-in under pam_limits' folder
(/etc/security/limits.d), named so that no file the node has is replaced. Offered by the GPU layer's host
limits and by NCCL's network (locked memory for RDMA)."""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.model import Remedy
from zdoctor.edit.sysfile import LIMITS_D, create_file_remedy, free_name


def limits_conf_remedy(item: str, value: str, dropins: dict[str, Any] | None) -> Remedy:
    """A new drop-in under pam_limits' folder, named so that no file the node has is replaced."""
    line = f"* - {item} {value}"
    dropins = dropins or {}
    given = dropins.get("path")
    folder: str = given if isinstance(given, str) else LIMITS_D
    path = free_name(folder, f"90-zdoctor-{item}", ".conf", dropins.get("names"))
    unknown = "" if isinstance(dropins.get("names"), list) else (
        f" The names in {folder} were not read ({dropins.get('error') or 'not recorded'}): the first line stops if "
        "this one is taken.")
    return create_file_remedy(
        path, f"# Written by zdoctor: {item} for every PAM login.\n{line}\n", check="limits.conf",
        title=f"Raise {item} for every login (a new drop-in {os.path.basename(path)})", verified=None,
        explanation=f"The line `{line}` in /etc/security/limits.conf syntax applies to new PAM logins, not to "
                    "running shells or services. Docker: --ulimit "
                    f"{'memlock=-1:-1' if item == 'memlock' else 'nofile=65536:65536'}; systemd services: "
                    f"{'LimitMEMLOCK=infinity' if item == 'memlock' else 'LimitNOFILE=65536'}; Slurm "
                    "propagates the limits of the submitting shell unless configured otherwise." + unknown)
