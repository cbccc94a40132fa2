"""``python -m zdoctor``: restarted isolated (``python -I``) first, see :mod:`zdoctor.front.isolate`."""

from __future__ import annotations

import sys

from zdoctor.front.isolate import restart_isolated

restart_isolated(sys.argv[1:], from_module=True)

from zdoctor.front.cli import main  # noqa: E402 - only once the interpreter is isolated
from zdoctor.front.finish import finish  # noqa: E402

finish(main())
