"""The small keeper that stands between zdoctor and every command it runs (stdlib only, Python 3.8+).

zdoctor starts ``python -I -S -c SOURCE LIFE ENV STATUS CGROUP CREDS -- ARGV...``; the keeper

* joins the cgroup ``CGROUP`` (its ``cgroup.procs``; empty: none) so the command starts inside it;
* makes itself a child subreaper: whatever the command starts, however it detaches (a new process
  group as ninja gives each job, a new session, a double fork), stays its descendant;
* runs the command as ``CREDS`` (``uid:gid``; empty: as itself): it drops every supplementary group,
  then the gid, then the uid in the command's process just before the exec, so the keeper itself stays
  able to end the tree and the training user's code never runs as root;
* reads the command's environment from the pipe ``ENV`` (its own environment is empty, so no loader
  variable meant for the command touches the keeper), starts the command and tells zdoctor on ``STATUS``
  whether it could (``ok`` or ``E<errno>``);
* when the command exits, kills every descendant it left (a daemon, a backgrounded worker) and exits as
  the command did: the command's own exit decides, and nothing it started outlives it;
* on SIGTERM, SIGHUP or SIGINT (zdoctor ending it, or zdoctor's thread gone: its parent-death signal)
  and when ``LIFE`` reaches its end (zdoctor is gone, however it died, its reaper too), it ends the
  whole tree (SIGTERM, then SIGKILL until none is left) before it goes.
"""

from __future__ import annotations

SOURCE = r'''
import os, select, signal, sys, time
life, envfd, status = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
procs, creds, argv = sys.argv[4], sys.argv[5], sys.argv[7:]
me = os.getpid()
if procs:
    try:
        with open(procs, "w") as fh:
            fh.write(str(me))
    except OSError:
        pass
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
data = b""
while True:
    chunk = os.read(envfd, 65536)
    if not chunk:
        break
    data += chunk
os.close(envfd)
env = {}
for item in data.split(b"\0"):
    key, sep, value = item.partition(b"=")
    if sep and key:
        env[os.fsdecode(key)] = os.fsdecode(value)
stop = []
def on_signal(signum, frame):
    stop.append(signum)
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, on_signal)
# Every signal (the command's exit, a stop) writes a byte here, so the wait below wakes at once.
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda signum, frame: None)
r, w = os.pipe()
child = os.fork()
if child == 0:
    try:
        os.close(r)
        os.close(life)
        os.close(status)
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(s, signal.SIG_DFL)
        if creds:
            uid, gid = (int(x) for x in creds.split(":"))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise PermissionError(1, "the credentials did not take")
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        os.write(w, str(e.errno or 0).encode())
    except BaseException:
        os.write(w, b"0")
    os._exit(127)
os.close(w)
err = b""
while True:
    chunk = os.read(r, 64)
    if not chunk:
        break
    err += chunk
os.close(r)
try:
    os.write(status, b"E" + err + b"\n" if err else b"ok\n")
    os.close(status)
except OSError:
    pass
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def tree():
    kids = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # behind a filtering tracer that is gone: zdoctor ends the tree
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
            fields = data[data.rfind(b")") + 2:].split()
        except OSError:
            continue
        if fields and fields[0] != b"Z":
            kids.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [me]
    while todo:
        for pid in kids.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found

code = [None]
def reap():
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == child:
            code[0] = st

def end(grace):
    if grace:
        for pid in tree():
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and tree():
            reap()
            time.sleep(0.02)
    for _ in range(500):
        left = tree()
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.01)
    reap()

def die(signum):
    signal.signal(signum, signal.SIG_DFL)
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except Exception:
        pass
    os.kill(me, signum)
    os._exit(128 + signum)

if err:
    reap()
    sys.exit(127)
while True:
    if stop:
        end(0.5)
        die(stop[0])
    try:
        ready = select.select([life, wake_r], [], [], 0.5)[0]
    except OSError:
        ready = []
    if wake_r in ready:
        try:
            while os.read(wake_r, 512):
                pass
        except OSError:
            pass
    if life in ready:
        try:
            gone = os.read(life, 1) == b""
        except OSError:
            gone = True
        if gone:
            end(0.5)
            die(signal.SIGKILL)
    reap()
    if code[0] is not None:
        end(0)
        st = code[0]
        if os.WIFSIGNALED(st):
            die(os.WTERMSIG(st))
        os._exit(os.WEXITSTATUS(st))
'''
