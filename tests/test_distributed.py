"""Who started this process: torchrun, a submitit job or srun, and the GPU each rank takes."""

from __future__ import annotations

import pytest
import torch

from nmt.errors import NMTError
from nmt.training import distributed
from nmt.training.distributed import Launch, device_index, first_node, launch

LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "SUBMITIT_EXECUTOR")


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS + ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_JOB_ID", "SLURM_STEP_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("gpu[03-05,07],cpu1", "gpu03"), ("node12", "node12"), ("a-b[1,2]", "a-b1"), ("x,y", "x")],
)
def test_first_node_of_a_slurm_node_list(nodelist, first):
    assert first_node(nodelist) == first


def test_an_srun_task_is_a_rank_of_the_step(clean_env):
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "8")
    clean_env.setenv("SLURM_STEP_NUM_NODES", "2")
    clean_env.setenv("SLURM_PROCID", "5")
    clean_env.setenv("SLURM_LOCALID", "1")
    clean_env.setenv("SLURM_JOB_ID", "4242")
    clean_env.setenv("SLURM_STEP_NODELIST", "gpu[07-08]")
    where = launch()
    assert (where.launcher, where.rank, where.world_size, where.local_rank) == ("srun", 5, 8, 1)
    assert (where.tasks_per_node, where.master_addr) == (4, "gpu07")
    assert where.master_port == distributed.master_port("4242")  # every task derives the same port
    clean_env.setenv("WORLD_SIZE", "2")  # torchrun inside the Slurm job: its variables win
    assert launch().launcher == "torchrun"


def test_a_submitit_task_reads_its_job_environment(clean_env):
    pytest.importorskip("submitit")
    for name, value in {
        "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "77", "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1",
    }.items():  # fmt: skip
        clean_env.setenv(name, value)
    where = launch()
    assert (where.launcher, where.rank, where.world_size, where.local_rank) == ("submitit", 1, 2, 1)


def test_a_single_process_is_not_distributed(clean_env):
    assert launch().world_size == 1


def test_tasks_per_node_must_match_the_visible_gpus(monkeypatch):
    cuda = torch.device("cuda")
    where = Launch("submitit", 5, 8, 1, 4, "gpu07", 1234)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert device_index(where, cuda) == 1  # each task sees the node's 4 GPUs: its local rank's
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device_index(where, cuda) == 0  # each task sees its own one
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(NMTError, match=r"^submitit: 4 task\(s\) per node but 2 GPUs visible on "):
        device_index(where, cuda)
    assert device_index(where, torch.device("cpu")) == 1  # gloo on CPUs: no GPU to count
