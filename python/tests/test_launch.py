"""Which launcher started the process, from its environment."""

from trainstate._launch import detect, rendezvous_key


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


def test_torchrun_without_a_run_id_is_told_apart_by_its_master():
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none",
           "MASTER_ADDR": "node-a", "MASTER_PORT": "29500", "SLURM_JOB_ID": "77"}
    launch = detect(env)
    assert launch.key == "torchrun:node-a-29500"
    assert launch.job_id == "77", "under Slurm the job is Slurm's"


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
