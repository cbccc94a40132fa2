"""``python -m zdoctor``."""

from .cli import main

raise SystemExit(main())
