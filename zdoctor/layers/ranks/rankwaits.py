"""Where each rank of a hung job waits, from its Python stack (``py-spy dump --json``), and whether the ranks
agree: every rank in the same collective from the same line is a job waiting for a peer; ranks in different
collectives, or one in a collective while another is outside any, are out of step and wait forever.

Frames are innermost first, as py-spy gives them: ``{name, file, line}``. The ZeRO-3 patterns are named from
DeepSpeed's own frames (the parameter all-gather of ``partition_parameters.py`` under
``PartitionedParameterCoordinator.fetch_sub_module``, the engine's ``forward``/``backward``/``step``) and
``generate`` frames."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: torch.distributed (and deepspeed.comm) calls a rank can block in.
COLLECTIVES = frozenset({
    "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_object", "all_gather_coalesced",
    "allgather_fn", "all_reduce", "all_reduce_coalesced", "inference_all_reduce", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_fn", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv", "wait", "init_process_group",
    "new_group", "_store_based_barrier", "rendezvous"})
#: Where those calls live.
COMM_FILES = ("torch/distributed/", "deepspeed/comm/")
ZERO_DIR = "deepspeed/runtime/zero/"
#: DeepSpeed ZeRO-3 functions and what a rank blocked under them waits for.
ZERO3_CALLS = {
    "fetch_sub_module": "ZeRO-3 parameter all-gather", "wait": "ZeRO-3 parameter all-gather",
    "all_gather_coalesced": "ZeRO-3 parameter all-gather", "_all_gather": "ZeRO-3 parameter all-gather",
    "all_gather": "ZeRO-3 parameter all-gather", "_all_gather_dtype": "ZeRO-3 parameter all-gather",
    "_all_gather_sequential": "ZeRO-3 parameter all-gather",
    "_all_gather_coalesced": "ZeRO-3 parameter all-gather",
    "reduce_scatter_coalesced": "ZeRO-3 gradient reduce-scatter",
    "partition_grads": "ZeRO-3 gradient reduce-scatter",
}
#: ZeRO-3 frames that name where in a forward pass a rank is, without being the collective themselves.
ZERO3_PLACES = ("reset_step", "_start_of_forward_hook", "pre_sub_module_forward", "post_sub_module_forward",
                "_pre_forward_module_hook", "_post_forward_module_hook", "release_sub_module",
                "assert_ints_same_as_other_ranks", "assert_lst_len_same_as_other_ranks")
ENGINE_FILE = "deepspeed/runtime/engine.py"
ENGINE_CALLS = ("forward", "backward", "step", "save_checkpoint", "load_checkpoint", "eval_batch", "train_batch")
#: Frames of a generation loop (transformers' GenerationMixin and the loops it runs).
GENERATE_CALLS = ("generate", "_sample", "sample", "greedy_search", "_greedy_search", "beam_search",
                  "_beam_search", "_assisted_decoding", "assisted_decoding", "contrastive_search")
#: Library code: a frame here is not where the user's program called in.
LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/lib/python3", "torch/", "deepspeed/", "transformers/",
                 "accelerate/", "<frozen")
PYSPY_TIMEOUT = 20.0
#: The OpType torch's c10d names each call by (its watchdog's "WorkNCCL(SeqNum=.., OpType=..)"); NCCL's
#: barrier is an all-reduce of one element, DeepSpeed's ZeRO-3 all-gather an all_gather_into_tensor.
OP_TYPES = {
    "all_gather": ("ALLGATHER",), "all_gather_into_tensor": ("_ALLGATHER_BASE",),
    "_all_gather_base": ("_ALLGATHER_BASE",), "allgather_fn": ("_ALLGATHER_BASE", "ALLGATHER"),
    "all_gather_coalesced": ("ALLGATHER_COALESCED",), "all_reduce": ("ALLREDUCE",),
    "all_reduce_coalesced": ("ALLREDUCE_COALESCED",), "reduce": ("REDUCE",), "reduce_scatter": ("REDUCE_SCATTER",),
    "reduce_scatter_tensor": ("_REDUCE_SCATTER_BASE",), "_reduce_scatter_base": ("_REDUCE_SCATTER_BASE",),
    "broadcast": ("BROADCAST",), "barrier": ("BARRIER", "ALLREDUCE"), "all_to_all": ("ALLTOALL",),
    "all_to_all_single": ("ALLTOALL_BASE",), "gather": ("GATHER",), "scatter": ("SCATTER",), "send": ("SEND",),
    "recv": ("RECV", "RECVANYSOURCE"),
    "ZeRO-3 parameter all-gather": ("_ALLGATHER_BASE", "ALLGATHER_COALESCED", "ALLGATHER"),
    "ZeRO-3 gradient reduce-scatter": ("_REDUCE_SCATTER_BASE", "REDUCE_SCATTER", "ALLREDUCE"),
}


def _short(name: str) -> str:
    """``_exception_logger.<locals>.wrapper`` -> ``wrapper``; ``Engine.step`` -> ``step``."""
    return name.rsplit(".", 1)[-1]


def where(frame: dict[str, Any]) -> str:
    """``torch/distributed/distributed_c10d.py:4287``."""
    return f"{frame.get('file') or '?'}:{frame.get('line') if frame.get('line') is not None else '?'}"


def parse_pyspy(text: str) -> list[dict[str, Any]]:
    """The threads of ``py-spy dump --json``: ``[{tid, name, active, owns_gil, frames: [{name, file, line}]}]``.

    Raises ValueError for output that is not py-spy's JSON."""
    doc = json.loads(text)
    if not isinstance(doc, list):
        raise ValueError("py-spy's output is not a list of threads")
    out = []
    for t in doc:
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            raise ValueError("py-spy's output has a thread without frames")
        frames = []
        for f in t["frames"][:200]:
            if not isinstance(f, dict):
                continue
            short = f.get("short_filename") or f.get("filename") or "?"
            frames.append({"name": str(f.get("name") or "?")[:200], "file": str(short)[:300],
                           "path": str(f.get("filename") or short)[:500],
                           "line": f.get("line") if isinstance(f.get("line"), int) else None})
        tid = t.get("os_thread_id") if isinstance(t.get("os_thread_id"), int) else None
        out.append({"tid": tid, "name": str(t.get("thread_name") or "")[:100], "active": bool(t.get("active")),
                    "owns_gil": bool(t.get("owns_gil")), "frames": frames})
    return out


def _library(frame: dict[str, Any]) -> bool:
    path = f"{frame.get('path') or ''} {frame.get('file') or ''}"
    return any(part in path for part in LIBRARY_PARTS)


def classify(frames: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Where one thread waits: ``{in_collective, call, at, caller, user, zero3, generate, engine, top}``.

    ``call`` is the collective (``all_gather``) or the DeepSpeed ZeRO-3 wait it blocks in, ``at`` that frame's
    ``file:line``, ``caller`` the first frame above the communication code, ``user`` the innermost frame of the
    user's own program; ``zero3``/``generate``/``engine`` the DeepSpeed and generation frames on the stack."""
    out: dict[str, Any] = {"in_collective": False, "call": None, "at": None, "caller": None, "caller_at": None,
                           "user": None,
                           "zero3": None, "generate": None, "engine": None,
                           "top": f"{frames[0]['name']} ({where(frames[0])})" if frames else None}
    comm_index = None
    for i, f in enumerate(frames):
        in_comm = any(part in f["file"] or part in f.get("path", "") for part in COMM_FILES)
        if in_comm and _short(f["name"]) in COLLECTIVES:
            comm_index = i
            out.update(in_collective=True, call=_short(f["name"]), at=where(f))
            break
    for i, f in enumerate(frames):
        short = _short(f["name"])
        in_zero = ZERO_DIR in f["file"] or ZERO_DIR in f.get("path", "")
        if in_zero and short in ZERO3_CALLS and out["zero3"] is None:
            out["zero3"] = f"{short} ({where(f)})"
            if not out["in_collective"] or (comm_index is not None and comm_index > i):
                out.update(in_collective=True, call=ZERO3_CALLS[short], at=where(f))
        elif in_zero and out["zero3"] is None and any(place in f["name"] for place in ZERO3_PLACES):
            out["zero3"] = f"{short} ({where(f)})"
        if out["generate"] is None and short in GENERATE_CALLS:
            out["generate"] = f"{short} ({where(f)})"
        if out["engine"] is None and ENGINE_FILE in (f["file"] + f.get("path", "")) and short in ENGINE_CALLS:
            out["engine"] = f"{short} ({where(f)})"
        if out["user"] is None and not _library(f):
            out["user"] = f"{f['name']} ({where(f)})"
    if out["in_collective"] and (str(out["call"]).startswith("ZeRO-3") or out["zero3"]) and out["user"]:
        # DeepSpeed's own frames stand between: the user's code that ran the forward, step or generate
        out["caller"] = out["user"]
        out["caller_at"] = out["user"].rsplit("(", 1)[-1].rstrip(")")
    elif out["in_collective"]:
        start = comm_index if comm_index is not None else 0
        above = [f for f in frames[start:] if not any(p in f["file"] for p in COMM_FILES)]
        if above:
            out["caller"] = f"{above[0]['name']} ({where(above[0])})"
            out["caller_at"] = where(above[0])
    return out


def main_thread(threads: Sequence[dict[str, Any]], pid: int) -> dict[str, Any] | None:
    """The thread that runs the training loop: the main thread, else the first thread in a collective."""
    for t in threads:
        if t.get("tid") == pid or t.get("name") == "MainThread":
            return t
    for t in threads:
        if classify(t["frames"])["in_collective"]:
            return t
    return threads[0] if threads else None


def rank_wait(rank: dict[str, Any]) -> dict[str, Any]:
    """One rank's wait: from its Python stack when there is one (``source`` py-spy), else from /proc
    (``source`` proc: the blocked system call and wait channel, the Python frame unknown)."""
    empty = {"in_collective": False, "call": None, "at": None, "caller": None, "caller_at": None, "user": None,
             "zero3": None, "generate": None, "engine": None, "top": None}
    if rank.get("state") == "Z":  # it has left: whatever the others wait for, it will not come
        return {**empty, "source": "exited"}
    py = rank.get("python") or {}
    threads = py.get("threads") or []
    t = main_thread(threads, rank["pid"]) if threads else None
    if t is not None and t["frames"]:
        got = classify(t["frames"])
        got.update(source="py-spy", thread=t.get("name") or str(t.get("tid")), idle=not t.get("active"))
        return got
    main = (rank.get("threads") or [{}])[0]
    return {**empty, "in_collective": None, "source": "proc", "threads": thread_summary(rank.get("threads") or []),
            "syscall": main.get("syscall") or rank.get("syscall"), "wchan": main.get("wchan") or rank.get("wchan"),
            "why_unknown": py.get("error") or "py-spy is not installed"}


def thread_summary(threads: Sequence[dict[str, Any]]) -> str:
    """The other threads' waits, grouped: ``gloo_tcp_loop in epoll_wait, 2 x pt_gloo_runloop in futex``."""
    counts: dict[tuple[str, str], int] = {}
    for t in threads[1:]:
        key = (str(t.get("comm") or "?"), str(t.get("syscall") or t.get("wchan") or "?"))
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{f'{n} x ' if n > 1 else ''}{comm} {'running' if call == 'running' else f'in {call}'}"
                     for (comm, call), n in sorted(counts.items()))


def label(rank: dict[str, Any]) -> str:
    """``rank 0 (pid 42)`` with the node when known: ``rank 1 on node-b (pid 7)``."""
    rid = rank.get("rank")
    name = f"rank {rid}" if rid not in (None, "unknown") else "rank ?"
    host = f" on {rank['host']}" if rank.get("host") else ""
    return f"{name}{host} (pid {rank.get('pid')})"


def said(w: dict[str, Any]) -> str:
    """``all_gather (torch/distributed/distributed_c10d.py:4287), called from train (train.py:11)``."""
    if w.get("source") == "exited":
        return "has exited (a zombie its parent has not reaped): it takes part in no collective any more"
    if w.get("source") == "proc":
        call = w.get("syscall") or "?"
        text = f"main thread blocked in {call}" + (f" ({w['wchan']})" if w.get("wchan") else "")
        if w.get("threads"):
            text += f"; other threads: {w['threads']}"
        return text + "; Python frame unknown"
    if not w.get("in_collective"):
        return f"in no collective: {w.get('user') or w.get('top')}" + (" (running)" if not w.get("idle") else "")
    text = f"{w['call']} ({w['at']})" + (f", called from {w['caller']}" if w.get("caller") else "")
    if w.get("zero3") and not str(w["call"]).startswith("ZeRO-3"):
        text += f", under ZeRO-3's {w['zero3']}"
    if w.get("generate"):
        text += f", inside {w['generate']}"
    return text


def _site(w: dict[str, Any]) -> tuple[Any, ...]:
    return (w.get("call"), w.get("caller"))


def compare(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether the ranks wait in the same place: ``{verdict: agree|disagree|unknown|single, groups, unknown,
    patterns: [{id, ranks, why}]}``; each rank has its ``wait`` (:func:`rank_wait`)."""
    known = [r for r in ranks if r["wait"]["source"] in ("py-spy", "exited")]
    unknown = [r for r in ranks if r not in known]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in known:
        w = r["wait"]
        key = ("exited",) if w["source"] == "exited" else _site(w) if w["in_collective"] else \
            ("outside", w.get("user") or w.get("top"))
        groups.setdefault(key, []).append(r)
    if len(ranks) < 2:
        verdict = "single"
    elif len(groups) > 1:
        verdict = "disagree"
    elif unknown:
        verdict = "unknown"
    else:
        verdict = "agree"
    return {"verdict": verdict, "groups": [[r["pid"] for r in g] for g in groups.values()],
            "unknown": [r["pid"] for r in unknown], "patterns": patterns(known) if verdict == "disagree" else []}


def patterns(ranks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ZeRO-3 patterns the disagreeing ranks' frames show."""
    out = []
    gen_gather = [r for r in ranks if r["wait"].get("generate") and r["wait"].get("zero3")]
    others = [r for r in ranks if r not in gen_gather]
    if gen_gather and others:
        out.append({"id": "zero3-generate", "ranks": [r["pid"] for r in gen_gather + others],
                    "why": f"{', '.join(label(r) for r in gen_gather)} "
                           f"{'is' if len(gen_gather) == 1 else 'are'} still in a ZeRO-3 forward pass inside "
                           f"generate() while {', '.join(label(r) for r in others)} left it"})
    in_step = [r for r in ranks if (r["wait"].get("engine") or r["wait"].get("zero3")) and r not in gen_gather]
    outside = [r for r in ranks if not (r["wait"].get("engine") or r["wait"].get("zero3") or
                                        r["wait"].get("generate"))]
    if in_step and outside and not out:
        out.append({"id": "uneven-steps", "ranks": [r["pid"] for r in in_step + outside],
                    "why": f"{', '.join(label(r) for r in in_step)} {'is' if len(in_step) == 1 else 'are'} "
                           f"inside a DeepSpeed step "
                           f"({in_step[0]['wait'].get('engine') or in_step[0]['wait'].get('zero3')}) while "
                           f"{', '.join(label(r) for r in outside)} {'is' if len(outside) == 1 else 'are'} "
                           "outside the engine: the ranks ran different numbers of steps"})
    return out
