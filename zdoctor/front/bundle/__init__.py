"""The one-file bundle, ``zdoctor.pyz``: a zip application that runs with any system ``python3`` from 3.8.1.

- :mod:`.build`: ``zdoctor build-bundle``: lays zdoctor, its pure-Python dependencies and psutil's native
  module for x86_64 and aarch64 into one zip with a manifest.
- :mod:`.boot`: the bundle's bootstrap (standard library only): checks the interpreter and the machine,
  imports everything from the zip, and extracts only what cannot be used from it (psutil's shared object,
  the playbooks, assets and node layers' data files the code reads as files, the probe script other
  interpreters run) to a private per-user cache, verified by content hash.
"""

from __future__ import annotations
