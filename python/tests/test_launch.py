"""Which launcher started the process, from its environment (and, for a
plain torchrun, from its launching agent: fed in, or read from a fake
``/proc``)."""

import os

from trainstate._launch import detect, launching_agent, per_launch_id, rendezvous_key
from trainstate._proc import start_ticks

MACHINE = "4c4c4544-0042"


def plain_torchrun(rank: int, world: int = 2, local_world: int = 2, **extra: str) -> dict:
    """The environment plain `torchrun --nproc_per_node N` gives a rank."""
    env = {
        "RANK": str(rank), "LOCAL_RANK": str(rank % local_world), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(rank // local_world),
        "GROUP_WORLD_SIZE": str(world // local_world), "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    }
    env.update(extra)
    return env


def detect_under(env: dict, agent, machine: str = MACHINE):
    return detect(env, agent=lambda: agent, machine=lambda: machine)


def test_torchrun_gives_ranks_the_restart_count_and_the_run_id_as_key():
    env = {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "cbaa9206-7490", "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
    }
    launch = detect(env)
    assert (launch.launcher, launch.rank, launch.local_rank, launch.world_size) == ("torchrun", 3, 1, 4)
    assert (launch.node_rank, launch.local_world_size) == (1, 2)
    assert (launch.key, launch.job_id) == ("torchrun:cbaa9206-7490", "cbaa9206-7490")
    assert (launch.attempt, launch.restarts_remaining) == (1, 2)


def test_a_multi_node_torchrun_without_a_run_id_is_keyed_by_its_master():
    # Nothing else is shared by the nodes of one launch: the head tells a
    # new launch into an ended run of the same key apart by its attempt.
    env = plain_torchrun(0, world=4, local_world=2, MASTER_ADDR="node-a", SLURM_JOB_ID="77")
    launch = detect_under(env, agent=(4242, 1000))
    assert launch.key == "torchrun:node-a-29500"
    assert launch.job_id == "77", "under Slurm the job is Slurm's"
    # Without GROUP_WORLD_SIZE or LOCAL_WORLD_SIZE nothing says it is one node.
    bare = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none",
            "MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}
    assert detect_under(bare, agent=(4242, 1000)).key == "torchrun:node-a-29500"


def test_every_rank_of_one_plain_torchrun_on_one_node_shares_a_key_of_that_launch():
    agent = (4242, 987654)
    keys = {detect_under(plain_torchrun(rank), agent).key for rank in range(2)}
    assert len(keys) == 1
    [key] = keys
    assert key.startswith("torchrun:127.0.0.1-29500.") and len(key) <= 64
    # The job id is the launch's too.
    assert detect_under(plain_torchrun(1), agent).job_id == key[len("torchrun:"):]


def test_the_next_plain_torchrun_on_the_same_node_gets_another_key():
    first = detect_under(plain_torchrun(0), (4242, 987654)).key
    assert detect_under(plain_torchrun(0), (4243, 990000)).key != first, "another agent: another launch"
    assert detect_under(plain_torchrun(0), (4242, 999999)).key != first, "a reused pid started later"
    assert detect_under(plain_torchrun(0), (4242, 987654), machine="other").key != first, "another machine"


def test_a_restart_of_the_workers_keeps_the_launchs_key():
    agent = (4242, 987654)
    first = detect_under(plain_torchrun(1), agent)
    again = detect_under(plain_torchrun(1, TORCHELASTIC_RESTART_COUNT="1", TORCHELASTIC_MAX_RESTARTS="1"), agent)
    assert again.key == first.key and again.attempt == 1 and again.restarts_remaining == 0


def test_one_node_is_known_from_the_group_world_size_too():
    env = plain_torchrun(0)
    del env["LOCAL_WORLD_SIZE"]
    assert detect_under(env, (4242, 987654)).key != "torchrun:127.0.0.1-29500"
    env["GROUP_WORLD_SIZE"] = "2"
    assert detect_under(env, (4242, 987654)).key == "torchrun:127.0.0.1-29500"


def test_a_run_id_a_given_key_or_an_unknown_agent_need_no_agent():
    asked = []

    def agent():
        asked.append(1)
        return (1, 1)

    assert detect(plain_torchrun(0, TORCHELASTIC_RUN_ID="abc"), agent=agent).key == "torchrun:abc"
    assert detect(plain_torchrun(0), key="mine", agent=agent).key == "mine"
    assert asked == []
    assert detect_under(plain_torchrun(0), agent=None).key == "torchrun:127.0.0.1-29500"
    # Not torchrun: RANK/WORLD_SIZE alone keeps the master as its key.
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert detect(env, agent=agent).key == "env:h-1" and asked == []


def test_the_launch_id_is_a_short_hash_of_the_agent_and_the_machine():
    one = per_launch_id("127.0.0.1-29500", (4242, 987654), MACHINE)
    assert one == per_launch_id("127.0.0.1-29500", (4242, 987654), MACHINE)
    assert one.startswith("127.0.0.1-29500.") and len(one) == len("127.0.0.1-29500.") + 16


def fake_proc(root, processes):
    """A /proc with `stat` and `environ` for each (pid, ppid, start, environ)."""
    for pid, ppid, start, environ in processes:
        directory = root / str(pid)
        directory.mkdir(parents=True)
        fields = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 30
        (directory / "stat").write_text(f"{pid} (py thon) x) " + " ".join(fields) + "\n")
        (directory / "environ").write_bytes(b"\0".join(e.encode() for e in environ) + b"\0")
    return str(root)


def test_the_agent_is_the_ranks_parent(tmp_path):
    proc = fake_proc(tmp_path, [
        (100, 1, 5000, ["PATH=/bin"]),                       # torchrun
        (200, 100, 5100, ["RANK=0", "TORCHELASTIC_RUN_ID=none"]),  # the rank
    ])
    assert launching_agent(200, proc) == (100, 5000)


def test_wrappers_between_torchrun_and_the_rank_are_skipped(tmp_path):
    # torchrun --no_python bash -c "python train.py": the shell inherited the worker's environment.
    proc = fake_proc(tmp_path, [
        (100, 1, 5000, ["PATH=/bin"]),
        (150, 100, 5050, ["RANK=1", "TORCHELASTIC_RUN_ID=none"]),
        (151, 150, 5060, ["RANK=1", "TORCHELASTIC_RUN_ID=none"]),
        (200, 151, 5100, ["RANK=1", "TORCHELASTIC_RUN_ID=none"]),
    ])
    assert launching_agent(200, proc) == (100, 5000)


def test_an_agent_proc_does_not_know_is_none(tmp_path):
    assert launching_agent(12345, str(tmp_path)) is None


def test_this_process_has_an_agent():
    parent = os.getppid()
    assert launching_agent() == (parent, start_ticks(parent))


def test_a_plain_rank_world_size_launcher_is_env():
    launch = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (launch.launcher, launch.rank, launch.node_rank, launch.key) == ("env", 1, 1, "env:h-1")


def test_an_srun_task_uses_the_step_and_its_node():
    env = {
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NODEID": "2",
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
    }
    launch = detect(env)
    assert (launch.launcher, launch.rank, launch.local_rank, launch.world_size, launch.node_rank) == ("slurm", 5, 1, 8, 2)
    assert (launch.key, launch.job_id, launch.local_world_size, launch.attempt) == ("slurm:4242.0", "4242", 2, 0)
    assert detect({**env, "SLURM_RESTART_COUNT": "2"}).attempt == 2


def test_a_batch_script_without_a_step_is_a_single_process():
    launch = detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "4242"})
    assert (launch.launcher, launch.world_size, launch.job_id) == ("single", 1, "4242")


def test_a_single_process_gets_a_fresh_key_unless_told():
    first, second = detect({}), detect({})
    assert first.launcher == "single" and first.world_size == 1
    assert first.key != second.key and first.key.startswith("local:")
    assert detect({"TRAINSTATE_RUN_KEY": "mine"}).key == "mine"
    assert detect({}, key="given", job_id="j").key == "given"


def test_keys_are_made_safe_the_same_way_on_every_rank():
    assert rendezvous_key("a b/c") == "a-b-c"
    long = rendezvous_key("x" * 300)
    assert len(long) == 256 and long == rendezvous_key("x" * 300)
