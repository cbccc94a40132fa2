"""The container a job runs in and the limits of its cgroup: :mod:`.detect` says whether this is a container
and on what signs, :mod:`.cgroups` is the one reader of a process's cgroup memory and pids limits."""
