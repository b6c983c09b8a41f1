"""Which launcher started this process, and where it sits in the job.

Read from the environment the launcher sets, given as a mapping so tests
feed their own: torchrun / torch elastic, Slurm's ``srun``, a generic
``RANK``/``WORLD_SIZE`` launcher, or a plain single process.
"""

import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

from . import _probe, _proc
from ._contract import MAX_RENDEZVOUS_KEY_LEN, RENDEZVOUS_KEY_PATTERN

_KEY = re.compile(RENDEZVOUS_KEY_PATTERN)
"""The head's pattern of a whole key: a single character matches it when
the character may appear in a key."""


@dataclass(frozen=True)
class Launch:
    """Where this process sits in its job, and how to name its group."""

    launcher: str
    """``torchrun``, ``slurm``, ``env`` (``RANK``/``WORLD_SIZE`` without
    torch elastic) or ``single``."""
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    key: str
    """The rendezvous key every rank of this launch shares."""
    job_id: str
    attempt: int
    """0 for the first launch, then the launcher's restart count."""
    restarts_remaining: int
    """How many more times the launcher restarts the workers after a failure."""


def rendezvous_key(text: str) -> str:
    """``text`` as a rendezvous key: characters outside ``A-Za-z0-9._:-``
    become ``-``; a key longer than 256 characters is shortened with a hash
    of the whole, so every rank derives the same key."""
    key = "".join(c if _KEY.fullmatch(c) else "-" for c in text) or "-"
    if len(key) > MAX_RENDEZVOUS_KEY_LEN:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
        key = key[: MAX_RENDEZVOUS_KEY_LEN - 33] + "." + digest
    return key


def _int(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    value = env.get(name, "").strip()
    if not value:
        if default is None:
            raise ValueError(f"{name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def _first_count(value: str) -> Optional[int]:
    """The first count of a Slurm task list such as ``2(x3),1``."""
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


Agent = Tuple[int, int]
"""The process that launched this rank: its pid and its start (clock ticks
since boot, field 22 of ``/proc/<pid>/stat``), which together name one
process for as long as the machine is up."""

_MAX_WRAPPERS = 8


def launching_agent(pid: Optional[int] = None, proc: str = _proc.PROC) -> Optional[Agent]:
    """The torchrun agent that started the rank ``pid`` (this process by
    default): its parent, or, when the rank was started through wrappers (a
    shell, ``--no_python`` scripts), the nearest ancestor whose environment
    has no ``TORCHELASTIC_RUN_ID``: torchrun sets it for its workers only.
    ``None`` where ``/proc`` does not tell."""
    current = os.getpid() if pid is None else pid
    agent = _proc.parent(current, proc)
    for _ in range(_MAX_WRAPPERS):
        if agent is None or agent <= 1 or not _inherits_run_id(agent, proc):
            break
        above = _proc.parent(agent, proc)
        if above is None or above <= 1:
            break
        agent = above
    if agent is None or agent <= 0:
        return None
    started = _proc.start_ticks(agent, proc)
    return None if started is None else (agent, started)


def _inherits_run_id(pid: int, proc: str) -> bool:
    """True when ``pid`` was started with ``TORCHELASTIC_RUN_ID`` in its
    environment (a wrapper between torchrun and the rank). Unreadable: no."""
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return any(entry.startswith(b"TORCHELASTIC_RUN_ID=") for entry in environ.split(b"\0"))


def _single_node(env: Mapping[str, str], world: int) -> bool:
    """True when every rank of the launch runs on this node."""
    local_world = env.get("LOCAL_WORLD_SIZE", "").strip()
    if local_world.isdigit() and int(local_world) == world:
        return True
    return env.get("GROUP_WORLD_SIZE", "").strip() == "1"


def per_launch_id(master: str, agent: Agent, machine: str) -> str:
    """A launch id every local rank of one torchrun derives alike: the
    master's address and port, then a hash of the agent's pid and start
    and the machine's id (the same agent on another machine is another
    launch)."""
    text = "{}|{}|{}|{}".format(master, agent[0], agent[1], machine)
    return "{}.{}".format(master, hashlib.sha256(text.encode("utf-8")).hexdigest()[:16])


def detect(
    env: Mapping[str, str],
    key: Optional[str] = None,
    job_id: Optional[str] = None,
    *,
    agent: Callable[[], Optional[Agent]] = launching_agent,
    machine: Callable[[], str] = _probe.node_id,
) -> Launch:
    """The launch described by ``env``. ``key`` and ``job_id`` override what
    the environment says (as do ``TRAINSTATE_RUN_KEY`` and
    ``TRAINSTATE_JOB_ID``). ``agent`` and ``machine`` tell a plain torchrun
    launch from the next one on the same node (see :func:`launching_agent`).
    Raises ``ValueError`` when a launcher's variables are present but do not
    parse."""
    key = key or env.get("TRAINSTATE_RUN_KEY") or None
    job_id = job_id or env.get("TRAINSTATE_JOB_ID") or None
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
        elastic = "TORCHELASTIC_RUN_ID" in env
        rank = _int(env, "RANK")
        world = _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", 0)
        local_world = _int(env, "LOCAL_WORLD_SIZE", 1)
        node_rank = _int(env, "GROUP_RANK", rank // max(local_world, 1))
        run_id = env.get("TORCHELASTIC_RUN_ID", "")
        if not run_id or run_id == "none":
            # torchrun without --rdzv-id or --standalone: every launch says
            # "none". On one node, the agent (torchrun itself, the same
            # across its restarts of the workers) tells launches apart;
            # across nodes nothing shared does, and the master is the key.
            run_id = "{}-{}".format(env.get("MASTER_ADDR", "localhost"), env.get("MASTER_PORT", "0"))
            found = agent() if elastic and key is None and _single_node(env, world) else None
            if found is not None:
                run_id = per_launch_id(run_id, found, machine())
        attempt = _int(env, "TORCHELASTIC_RESTART_COUNT", 0)
        max_restarts = _int(env, "TORCHELASTIC_MAX_RESTARTS", 0)
        prefix = "torchrun" if elastic else "env"
        return Launch(
            launcher=prefix,
            rank=rank,
            local_rank=local_rank,
            world_size=world,
            local_world_size=local_world,
            node_rank=node_rank,
            key=rendezvous_key(key or f"{prefix}:{run_id}"),
            job_id=job_id or env.get("SLURM_JOB_ID") or run_id,
            attempt=attempt,
            restarts_remaining=max(max_restarts - attempt, 0),
        )
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if "SLURM_PROCID" in env and "SLURM_JOB_ID" in env and step is not None:
        # A task of an srun step (a batch script alone is a single process).
        world = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
        local_tasks = _first_count(env.get("SLURM_STEP_TASKS_PER_NODE", "")) or _first_count(
            env.get("SLURM_TASKS_PER_NODE", "")
        )
        slurm_job = env["SLURM_JOB_ID"]
        return Launch(
            launcher="slurm",
            rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            world_size=world,
            local_world_size=local_tasks or 1,
            node_rank=_int(env, "SLURM_NODEID", 0),
            key=rendezvous_key(key or f"slurm:{slurm_job}.{step}"),
            job_id=job_id or slurm_job,
            attempt=_int(env, "SLURM_RESTART_COUNT", 0),
            restarts_remaining=0,
        )
    own = key or "local:" + uuid.uuid4().hex
    return Launch(
        launcher="single",
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        key=rendezvous_key(own),
        job_id=job_id or env.get("SLURM_JOB_ID") or rendezvous_key(own),
        attempt=0,
        restarts_remaining=0,
    )
