"""Report a distributed training run to a trainstate head, from every rank.

Call :func:`init` once in every process of the job (every rank that
torchrun, Slurm's ``srun`` or another launcher starts, or a plain script)::

    import trainstate
    trainstate.init()   # reads TRAINSTATE_URL and TRAINSTATE_TOKEN
    for step in range(steps):
        ...
        trainstate.report({"loss": loss}, step=step, total_steps=steps)

Each rank starts a small watcher process that joins its launch's group at
the head (which registers the run once every rank has joined), heartbeats,
and reports the rank's end: FINISHED when every rank exits cleanly, ERRORED
(with the rank and its traceback) at the first uncaught exception, and, for
a rank that dies without reporting, what its death shows (killed by
SIGKILL, exited with status 3; ABORTED when SIGTERM, SIGINT or SIGHUP ended
it). A job killed outright, watchers included, is ABORTED for a lost
controller after its lease. With :func:`report`, each rank's heartbeat
carries its progress (step, phase, latest scalars), and the head tells a
run that stopped advancing (STALLED) from one that goes on. When a run
stalls, each watcher captures its rank's Python stacks from outside the
rank (``faulthandler`` on a signal of its own) and posts them, so the head
names the rank stuck elsewhere than its peers, and where.

Nothing here breaks training: the rank itself makes no request, installs
no Python signal handler (only ``faulthandler``'s, in C, on one signal no
one else uses, which runs only when its stacks are captured) and never
blocks on trainstate; a head that is down is
logged once and retried in the background, and no exception from
trainstate reaches your code.
"""

import logging
import multiprocessing
import os
import socket
import sys
from typing import Mapping, Optional, Union
from urllib.parse import urlsplit

from . import _http, _launch, _probe, _proc
from ._contract import MAX_NAME_LEN
from ._run import TERMINAL, Run, current
from ._run import _set_current as _set_current
from .types import TrainWorkerInfo

__all__ = ["Run", "TERMINAL", "current", "fail", "finish", "init", "report", "__version__"]

__version__ = "0.1.0"

DEFAULT_TIMEOUT = 2.0
"""The deadline of each request to the head, in seconds."""

logger = logging.getLogger("trainstate")


def init(
    url: Optional[str] = None,
    token: Optional[str] = None,
    *,
    name: Optional[str] = None,
    key: Optional[str] = None,
    job_id: Optional[str] = None,
    timeout: float = DEFAULT_TIMEOUT,
    join_timeout: Optional[float] = None,
    stall_after: Optional[float] = None,
    on_stall: str = "detect",
    abort_after: Optional[float] = None,
    capture_stacks: Optional[bool] = None,
    stacks_signal: Union[int, str, None] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Run:
    """Reports this process's rank of the run to the head; returns its :class:`Run`.

    - ``url``, ``token``: the head (``http://head:8266``) and its bearer
      token; ``TRAINSTATE_URL`` and ``TRAINSTATE_TOKEN`` when not given.
      Without a URL the run is not reported (one warning says so). An
      ``https://`` head is trusted through the system's roots, or through
      only the CAs of the PEM file ``TRAINSTATE_CA_CERT`` when it is set.
    - ``name``: the run's name; ``TRAINSTATE_RUN_NAME``, else the script's name.
    - ``key``: the rendezvous key every rank of this launch shares;
      ``TRAINSTATE_RUN_KEY``, else derived from the launcher
      (``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID`` and step id, or a fresh
      one for a single process).
    - ``job_id``: the run's job id; ``TRAINSTATE_JOB_ID``, else
      ``SLURM_JOB_ID``, else the launcher's run id.
    - ``timeout``: the deadline of each request, in seconds.
    - ``join_timeout``: how long the head waits for the other ranks to join,
      in seconds (the head's default, 5 minutes, when not given).
    - ``stall_after``: how long the run may go without any rank's step
      advancing before the head calls it STALLED, in seconds (1 s to 7
      days; the head's ``--stall-after`` when not given). The first rank
      that joins with one sets it for the run.
    - ``on_stall``: what the head does when the run stalls: ``"detect"``
      (the default) says so (health STALLED, a capture of every rank's
      stacks, notifications); ``"abort"`` also ends the ranks the stall
      names ``abort_after`` seconds later (0 s to 7 days; the head's
      default, 60 s, when not given), each reported ERRORED with cause
      ``NO_PROGRESS``, so that the launcher restarts the job (from its
      checkpoint) if it has restarts left.
    - ``capture_stacks``: whether this rank's Python stacks may be captured
      when the head asks (a stall, or someone asked): the watcher signals
      the rank and Python's ``faulthandler`` writes every thread's stack
      from C, without the GIL; nothing runs in the rank otherwise. On by
      default; ``False``, or ``TRAINSTATE_STACKS=off``, leaves the signal
      untouched (see ``docs/health.md``).
    - ``stacks_signal``: the signal the capture uses, a number or a name
      (``"SIGRTMIN+7"``, the default: 41 on Linux); else
      ``TRAINSTATE_STACKS_SIGNAL``. A signal that already has a handler is
      not taken (one warning; the capture then uses ``py-spy`` when it is
      installed).
    - ``env``: the environment to read instead of ``os.environ``.

    Calling it again in the same process returns the same run. In a child
    process started by ``multiprocessing`` (fork or spawn) it reports
    nothing: only the rank itself does. Never raises.
    """
    existing = current()
    if existing is not None and existing._pid == os.getpid():
        return existing
    try:
        environ = os.environ if env is None else env
        run = _make(url, token, name, key, job_id, timeout, join_timeout, stall_after, environ)
        run._configure_stalls(on_stall, abort_after, capture_stacks, stacks_signal, environ)
    except Exception as err:  # noqa: BLE001 - training must go on
        logger.warning("trainstate: cannot report this rank (%s); training goes on", err)
        run = Run(url=None, token=None, launch=None, worker=None, name="", timeout=timeout, join_timeout=None, reason=str(err))
    _set_current(run)
    run._start()
    return run


def _make(
    url: Optional[str],
    token: Optional[str],
    name: Optional[str],
    key: Optional[str],
    job_id: Optional[str],
    timeout: float,
    join_timeout: Optional[float],
    stall_after: Optional[float],
    env: Mapping[str, str],
) -> Run:
    def disabled(reason: str) -> Run:
        return Run(url=None, token=None, launch=None, worker=None, name="", timeout=timeout, join_timeout=None, reason=reason)

    if multiprocessing.parent_process() is not None:
        return disabled("a multiprocessing child: its rank reports")
    url = url or env.get("TRAINSTATE_URL") or None
    if url is None:
        logger.warning("trainstate: TRAINSTATE_URL is not set; this run is not reported")
        return disabled("no head URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the head URL {url!r} must be http:// or https:// and name a host")
    token = token or env.get("TRAINSTATE_TOKEN") or None
    ca_cert = env.get("TRAINSTATE_CA_CERT") or None
    if ca_cert is not None:
        if parts.scheme != "https":
            raise ValueError(f"TRAINSTATE_CA_CERT is set, but the head URL {url!r} is not https://; unset one")
        _http.tls_context(ca_cert)
    launch = _launch.detect(env, key=key, job_id=job_id)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    node_ip, _fallback = _probe.route_to(parts.hostname, port)
    gpus = _probe.gpu_ids(env)
    pid = os.getpid()
    node = _probe.node_id()
    host = socket.gethostname().strip()
    worker: TrainWorkerInfo = {
        "actor_id": f"{launch.launcher}:{pid}@{_probe.hostname()}"[:MAX_NAME_LEN],
        "world_rank": launch.rank,
        "local_rank": launch.local_rank,
        "node_rank": launch.node_rank,
        "node_id": node,
        "node_ip": node_ip,
        "pid": pid,
        "gpu_ids": gpus,
        "status": "ALIVE",
        "resources": _probe.resources(gpus, launch.local_world_size),
    }
    if _probe.valid_name(host):
        # The node's host name, shown beside its id.
        worker["node_name"] = host
    run_name = name or env.get("TRAINSTATE_RUN_NAME") or _script_name()
    return Run(
        url=url.rstrip("/"),
        token=token,
        ca_cert=ca_cert,
        launch=launch,
        worker=worker,
        name=run_name[:MAX_NAME_LEN],
        timeout=timeout,
        join_timeout=join_timeout,
        process_start_ms=_proc.start_ms(pid) or _proc.now_ms(),
        stall_after=stall_after,
    )


def _script_name() -> str:
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    base = os.path.splitext(os.path.basename(script))[0]
    return base if base and base != "-c" and _probe.valid_name(base) else "python"


def finish() -> None:
    """Reports that this rank ended cleanly (also done at exit)."""
    run = current()
    if run is not None:
        run.finish()


def fail(error: Optional[BaseException] = None, detail: Optional[str] = None) -> None:
    """Reports that this rank failed (also done for an uncaught exception)."""
    run = current()
    if run is not None:
        run.fail(error, detail)


def report(
    metrics: Optional[Mapping[str, float]] = None,
    *,
    step: Optional[int] = None,
    total_steps: Optional[int] = None,
    phase: Optional[str] = None,
    expect_next_within: Optional[float] = None,
    step_time: Optional[float] = None,
    checkpoint: Optional[int] = None,
) -> None:
    """Reports this rank's progress (see :meth:`Run.report`); does nothing
    before :func:`init`. ``checkpoint=step`` says progress up to ``step``
    is saved. A few microseconds, never blocks, never raises but for a
    ``checkpoint`` that breaks a rule (``ValueError`` naming it)."""
    run = current()
    if run is not None:
        run.report(metrics, step=step, total_steps=total_steps, phase=phase, expect_next_within=expect_next_within, step_time=step_time, checkpoint=checkpoint)
