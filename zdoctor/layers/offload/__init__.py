"""The node layer ``offload``: offload capacity and storage (the ds_config, host RAM and the offload disk).

Its readers, probes (``probe_*`` modules), checks (``check_*`` modules) and rules live here.

Where DeepSpeed's NVMe offload writes, and whether that place can keep up.

- :mod:`zdoctor.readers.mounts`: the mount holding a path (``/proc/self/mountinfo``), its options, free space, and
  whether the file system is fit for O_DIRECT swap files.
- :mod:`.blockdev`: the block device under a mount, walked through partitions, device-mapper/LVM, md
  RAID and loop devices down to the disks (NVMe, SATA/SAS, rotational, virtio, network), the PCIe link
  of NVMe drives, filesystem UUIDs, and the NVMe drives that are present but unused.
- :mod:`.iotest`: O_DIRECT, libaio (DeepSpeed's ``async_io`` op), and a bounded sequential
  write/read throughput test with 1 MiB blocks.
- :mod:`.fstab`: fstab lines by UUID, the commands that mount a drive for offload, and a careful
  apply (``findmnt --verify`` on a copy, backup, atomic replace, mount, roll back on failure).

Everything here reads the machine through parameters (``sysfs_root``, ``dev_root``, mountinfo text)
so it runs the same against a recorded tree.
"""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2
