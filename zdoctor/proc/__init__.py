"""Processes and privilege: the runner every command goes through, the keeper, containment in a cgroup,
who runs what (the training user, the owner of the code), reading a file as its folder's owner, and
zdoctor's own scratch folders."""
