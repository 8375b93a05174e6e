"""A sweep's jobs (``-m``, a sweeper, a launcher): each job claims its own run dir, ends with a result
file (its objective: the best validation score by ``trainer.best_metric``), and the jobs of a sweep
folder are listed as a table (``scripts/sweep_summary.py``).

A job's folder holds ``.job-<launch>.json`` (its number and overrides, written when it starts) and, once
training ends, ``result.json`` (steps, best and final validation scores, training time). A job still
running or killed has no result file: its ``checkpoints/last.pt`` says how far it got.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from nmt.cache import atomic_write_text
from nmt.checkpoint import load_checkpoint
from nmt.config import HIGHER_IS_BETTER
from nmt.errors import NMTError
from nmt.runs.launching import launch_id

RESULT = "result.json"
# Overrides that do not make a job another job: a relaunch adds or changes them and continues the same run.
RELAUNCH_KEYS = ("trainer.resume", "trainer.progress")


@dataclass
class Job:
    """This Hydra job (a single run or a sweep's job): where it trains and how to continue it."""

    run_dir: Path
    overrides: list[str]  # hydra.overrides.task
    resume_hint: str  # the command that continues the run, quoted for the shell


def start_job(script: str, best_metric: str) -> Job:
    """The running Hydra job of ``scripts/<script>.py``; a sweep's job checks its sweeper's direction
    and claims its folder (:func:`claim_run_dir`) before any data or model work."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    task = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        check_direction(hydra_cfg.sweeper.get("direction"), best_metric)
        claim_run_dir(run_dir, task, hydra_cfg.job.num, launch_id())
    kept = [o for o in task if not o.startswith("trainer.resume=")]
    # Quoted for the shell: overrides may hold brackets (lists) or spaces (paths).
    hint = shlex.join(
        ["python", f"scripts/{script}.py", *kept, f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    )
    return Job(run_dir, task, hint)


def end_job(job: Job, rank: int) -> float:
    """The job's objective; rank 0 also writes its ``result.json``."""
    return objective(
        write_result(job.run_dir, job.overrides) if rank == 0 else job_result(job.run_dir, job.overrides)
    )


def job_overrides(overrides: list[str]) -> list[str]:
    """The overrides that define a job: those of a relaunch that only resumes it are left out."""
    return [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in RELAUNCH_KEYS]


def claim_run_dir(run_dir: Path, overrides: list[str], job_num: int, launch: str) -> None:
    """Mark ``run_dir`` as the folder of job ``job_num`` of the sweep launched as ``launch``; refuse it,
    in one line, when another job of the same launch has it. A relaunch (another ``launch``) continues
    the folder's run. Atomic (a hard link that fails if the claim exists), so jobs started at once by a
    parallel launcher cannot both claim it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    mine = job_overrides(overrides)
    claim = run_dir / f".job-{launch}.json"
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".job.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"num": job_num, "overrides": mine}, f)
        try:
            os.link(tmp, claim)
            return
        except FileExistsError:
            pass
    finally:
        Path(tmp).unlink(missing_ok=True)
    theirs = json.loads(claim.read_text(encoding="utf-8"))
    if theirs["num"] != job_num:
        differ = [o for o in mine if o not in theirs["overrides"]]
        raise NMTError(
            f"{run_dir}: jobs {theirs['num']} and {job_num} ({','.join(differ) or 'same overrides'}) of this "
            "sweep would share this run dir: hydra.sweep.subdir names them alike (a swept key among "
            "hydra.job.config.override_dirname.exclude_keys?); add ${hydra.job.num} to hydra.sweep.subdir "
            "or sweep keys that are part of the job's name"
        )


@dataclass
class JobResult:
    """How a job's training went: what ``scripts/sweep_summary.py`` lists."""

    job: str  # its folder, relative to the sweep's
    num: int | None  # hydra.job.num: its place in the sweep
    overrides: str  # what the sweep varies in this job (else all of its overrides), comma-separated
    steps: int
    metric: str  # trainer.best_metric
    best: float | None  # the best validation score by that metric: the job's objective
    bleu: float | None  # the last validation's scores
    chrf: float | None
    loss: float | None
    minutes: float  # training time (validations included), over all sessions of a resumed run
    status: str  # "ended" (its process ended: result.json) | "running or stopped" (no result.json yet)


def job_result(run_dir: Path, overrides: list[str] | None = None) -> JobResult:
    """The job's result from its ``result.json``, else from its ``last.pt`` (a job not finished)."""
    if overrides is None:
        overrides = _read_overrides(run_dir)
    path = run_dir / RESULT
    if path.is_file():
        fields = _read_result(path)
        return JobResult(
            **{**fields, "job": run_dir.name, "num": _job_num(run_dir), "overrides": ",".join(overrides)}
        )
    return _from_checkpoint(run_dir, overrides, "running or stopped")


def _read_result(path: Path) -> dict[str, Any]:
    """The fields of a ``result.json`` as :func:`write_result` writes them; one line naming the file and
    what is wrong when it is not one (edited, truncated, another program's)."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NMTError(f"{path}: not JSON ({e}); delete it to read the job from checkpoints/last.pt") from e
    names = [f.name for f in fields(JobResult) if f.name not in ("job", "num", "overrides")]
    if not isinstance(result, dict) or sorted(result) != sorted(names):
        raise NMTError(f"{path}: a result.json has exactly the fields {', '.join(names)}")
    for name in ("steps", "best", "bleu", "chrf", "loss", "minutes"):
        value = result[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise NMTError(f"{path}: {name} must be a number, not {value!r}")
    if result["metric"] not in HIGHER_IS_BETTER:
        raise NMTError(
            f"{path}: metric must be one of {', '.join(HIGHER_IS_BETTER)}, not {result['metric']!r}"
        )
    return result


def _from_checkpoint(run_dir: Path, overrides: list[str], status: str) -> JobResult:
    last = run_dir / "checkpoints" / "last.pt"
    if not last.is_file():
        raise NMTError(f"{run_dir}: no checkpoints/last.pt (the job has not validated or saved yet)")
    state = load_checkpoint(last)
    progress, metric = state["progress"], state["config"]["trainer"]["best_metric"]
    final = progress["history"][-1] if progress["history"] else {}
    return JobResult(
        job=run_dir.name,
        num=_job_num(run_dir),
        overrides=",".join(job_overrides(overrides)),
        steps=int(progress["step"]),
        metric=metric,
        best=progress["best"],
        bleu=final.get("bleu"),
        chrf=final.get("chrf"),
        loss=final.get("loss"),
        minutes=round(progress["elapsed_s"] / 60, 2),
        status=status,
    )


def write_result(run_dir: Path, overrides: list[str]) -> JobResult:
    """Write the finished job's ``result.json`` (from its ``last.pt``) and return it."""
    result = _from_checkpoint(run_dir, overrides, "ended")
    fields = {k: v for k, v in asdict(result).items() if k not in ("job", "num", "overrides")}
    atomic_write_text(run_dir / RESULT, json.dumps(fields, indent=2) + "\n")
    return result


def check_direction(direction: Any, metric: str) -> None:
    """Refuse a sweeper that would optimize the objective the wrong way (``hydra.sweeper.direction``, as
    Optuna's takes it, against whether ``trainer.best_metric`` is higher- or lower-better)."""
    if not isinstance(direction, str) or direction not in ("maximize", "minimize"):
        return  # no sweeper with a direction (or several objectives)
    higher = HIGHER_IS_BETTER[metric]
    wanted = "maximize" if higher else "minimize"
    if direction != wanted:
        raise NMTError(
            f"hydra.sweeper.direction={direction} but trainer.best_metric={metric}, the objective, is "
            f"{'higher' if higher else 'lower'}-better: give hydra.sweeper.direction={wanted}"
        )


def objective(result: JobResult) -> float:
    """The value a sweeper optimizes: the best validation score (NaN when the job never validated, which
    Optuna records as a failed trial)."""
    return math.nan if result.best is None else float(result.best)


def _job_num(run_dir: Path) -> int | None:
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    return OmegaConf.load(hydra_file).hydra.job.get("num") if hydra_file.is_file() else None


def _read_overrides(run_dir: Path) -> list[str]:
    """The overrides that the job's sweep varies (its name, ``hydra.job.override_dirname``, as Hydra
    stored it in ``.hydra/hydra.yaml``), else all of the job's (``.hydra/overrides.yaml``)."""
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    if hydra_file.is_file():
        name = OmegaConf.load(hydra_file).hydra.job.get("override_dirname")
        if name:
            return str(name).split(",")
    path = run_dir / ".hydra" / "overrides.yaml"
    return [str(o) for o in OmegaConf.load(path)] if path.is_file() else []


def sweep_jobs(sweep_dir: Path) -> list[Path]:
    """The job folders under ``sweep_dir``: those where Hydra stored a job's config, the sweep itself too
    when a one-job sweep ran in it."""
    if not sweep_dir.is_dir():
        raise NMTError(f"{sweep_dir}: no such folder (a sweep's folder: outputs/multirun/DATE/TIME)")
    jobs = sorted(p.parent.parent for p in sweep_dir.glob("**/.hydra/overrides.yaml"))
    jobs = [j for j in jobs if (j / "checkpoints" / "last.pt").is_file() or (j / RESULT).is_file()]
    if not jobs:
        raise NMTError(f"{sweep_dir}: no training jobs with a checkpoint or result.json under it")
    return jobs


def summarize(sweep_dir: Path) -> list[JobResult]:
    """Every job of the sweep, named by its folder relative to ``sweep_dir``."""
    rows = []
    for job in sweep_jobs(sweep_dir):
        result = job_result(job)
        result.job = str(job.relative_to(sweep_dir)) if job != sweep_dir else "."
        rows.append(result)
    return rows


COLUMNS = ("num", "overrides", "steps", "best", "bleu", "chrf", "loss", "minutes", "status")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def format_table(rows: list[JobResult]) -> str:
    """A plain-text table of the jobs, a line each."""
    metric = rows[0].metric if rows else "bleu"
    names = {"num": "job", "best": f"best {metric}", "minutes": "train min"}
    heads = [names.get(c, c) for c in COLUMNS]
    cells = [[_cell(getattr(r, c)) for c in COLUMNS] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def to_csv(rows: list[JobResult]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[f.name for f in JobResult.__dataclass_fields__.values()])
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    return out.getvalue()


def ranked(rows: list[JobResult]) -> list[JobResult]:
    """Best first: by ``best``, higher or lower being better as the metric says; NaN and missing last."""

    def key(r: JobResult) -> tuple[bool, float]:
        missing = r.best is None or math.isnan(r.best)
        value = 0.0 if missing else float(r.best)
        return missing, -value if HIGHER_IS_BETTER.get(r.metric, True) else value

    return sorted(rows, key=key)
