"""Readers of the node that several layers share: ELF files, the loader's cache and its emulation, symbol
versions, package owners, compiler identities, processes, the mount table, cgroup limits, host limits, the JIT
cache, kernel modules and PCI presence."""
