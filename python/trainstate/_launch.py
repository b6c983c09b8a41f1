"""Which launcher started this process, and where it sits in the job.

Read from the environment the launcher sets, given as a mapping so tests
feed their own: torchrun / torch elastic, Slurm's ``srun``, a generic
``RANK``/``WORLD_SIZE`` launcher, or a plain single process.
"""

import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import Mapping, Optional

_KEY_CHARS = re.compile(r"[^A-Za-z0-9._:-]")
_MAX_KEY = 256


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
    key = _KEY_CHARS.sub("-", text) or "-"
    if len(key) > _MAX_KEY:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
        key = key[: _MAX_KEY - 33] + "." + digest
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


def detect(env: Mapping[str, str], key: Optional[str] = None, job_id: Optional[str] = None) -> Launch:
    """The launch described by ``env``. ``key`` and ``job_id`` override what
    the environment says (as do ``TRAINSTATE_RUN_KEY`` and
    ``TRAINSTATE_JOB_ID``). Raises ``ValueError`` when a launcher's variables
    are present but do not parse."""
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
            # torchrun's default --rdzv-id; the master's address tells launches apart.
            run_id = "{}-{}".format(env.get("MASTER_ADDR", "localhost"), env.get("MASTER_PORT", "0"))
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
        local_world = _first_count(env.get("SLURM_STEP_TASKS_PER_NODE", "")) or _first_count(
            env.get("SLURM_TASKS_PER_NODE", "")
        )
        slurm_job = env["SLURM_JOB_ID"]
        return Launch(
            launcher="slurm",
            rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            world_size=world,
            local_world_size=local_world or 1,
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
