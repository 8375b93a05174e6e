"""torch.distributed set-up: one process per device, NCCL on GPU, gloo on CPU, whoever started the
processes: ``torchrun`` (``WORLD_SIZE``), a submitit job (``hydra/launcher=submitit_slurm``: its
``JobEnvironment``) or ``srun`` in an sbatch script (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``)."""

from __future__ import annotations

import os
import re
import socket
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt.errors import NMTError


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class Launch:
    """This process among the processes of one run, as its launcher tells it."""

    launcher: str  # "torchrun" | "submitit" | "srun"
    rank: int
    world_size: int
    local_rank: int
    tasks_per_node: int
    master_addr: str
    master_port: int


def launch() -> Launch:
    """How this process was started: torchrun first (its variables win, also inside a Slurm job), then
    a submitit job, then an ``srun`` step; a single process otherwise."""
    env = os.environ
    if "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        per_node = int(env.get("LOCAL_WORLD_SIZE", world))
        rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
        return Launch("torchrun", rank, world, local, per_node, env.get("MASTER_ADDR", ""), 0)
    if env.get("SUBMITIT_EXECUTOR"):
        import submitit  # a submitit job has it

        job = submitit.JobEnvironment()
        return Launch(
            "submitit",
            job.global_rank,
            job.num_tasks,
            job.local_rank,
            job.num_tasks // job.num_nodes,
            job.hostnames[0],
            master_port(job.job_id),
        )
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:  # a task of srun (not the batch script)
        world = int(env["SLURM_STEP_NUM_TASKS"])
        nodes = int(env.get("SLURM_STEP_NUM_NODES", "1"))
        return Launch(
            "srun",
            int(env["SLURM_PROCID"]),
            world,
            int(env.get("SLURM_LOCALID", "0")),
            world // nodes,
            first_node(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")),
            master_port(env.get("SLURM_JOB_ID", "0")),
        )
    return Launch("none", 0, 1, 0, 1, "", 0)


def launched_rank() -> int:
    """This process's rank (0 when alone), known before the process group is joined."""
    return launch().rank


def master_port(job_id: str) -> int:
    """``MASTER_PORT`` if set, else a port every task of the job derives alike from its id."""
    if os.environ.get("MASTER_PORT"):
        return int(os.environ["MASTER_PORT"])
    return 20000 + zlib.crc32(str(job_id).encode()) % 20000


def first_node(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,07],cpu1`` -> ``gpu03``."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return socket.gethostname()
    prefix, ranges = match.groups()
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def init_distributed(device: torch.device) -> Dist:
    """Join the process group when this process is one of several (torchrun, submitit, srun); a no-op
    otherwise. Without torchrun the rendezvous is the first node of the job, at a port of the job's."""
    where = launch()
    if where.world_size == 1:
        return Dist()
    local = device_index(where, device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if where.launcher == "torchrun":
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{where.master_addr}:{where.master_port}",
                rank=where.rank,
                world_size=where.world_size,
            )
    return Dist(dist.get_rank(), dist.get_world_size(), local)


def device_index(where: Launch, device: torch.device) -> int:
    """The GPU of this process among those it sees: its local rank when each sees all of the node's,
    0 when each task sees one (Slurm's --gpus-per-task). A task count that fits neither is refused: the
    ranks would share a GPU, or leave some unused."""
    if device.type != "cuda":
        return where.local_rank
    visible = torch.cuda.device_count()
    if visible == where.tasks_per_node:
        return where.local_rank
    if visible == 1:
        return 0
    raise NMTError(
        f"{where.launcher}: {where.tasks_per_node} task(s) per node but {visible} GPUs visible on "
        f"{socket.gethostname()}: run one task per GPU (hydra.launcher.tasks_per_node and "
        "hydra.launcher.gpus_per_node alike, or srun --ntasks-per-node equal to --gpus-per-node)"
    )


def all_reduce_sum(values: torch.Tensor, ranks: Dist) -> torch.Tensor:
    if ranks.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_gather_object(obj, ranks: Dist) -> list:
    """Every rank's ``obj``, in rank order, on every rank (e.g. random states for the checkpoint)."""
    if not ranks.enabled:
        return [obj]
    out = [None] * ranks.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, ranks: Dist):
    """Rank 0's value of ``obj`` on every rank (stop decisions, validation results)."""
    if not ranks.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def cleanup(ranks: Dist) -> None:
    if ranks.enabled and dist.is_initialized():
        dist.destroy_process_group()
