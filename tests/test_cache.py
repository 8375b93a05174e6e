"""Atomic writes of cache and result files: a file that exists is complete, and nothing planted beside
it is written through."""

import os
import stat
import threading
import time
from pathlib import Path

from nmt.cache import atomic_write_text, preparing


def plant_symlinks(path: Path, victim: Path) -> None:
    """Symlinks to ``victim`` at the temporary names a writer of ``path`` in this process could predict."""
    for name in (f".{path.name}.tmp-{os.getpid()}", f".{path.name}.tmp"):
        (path.parent / name).symlink_to(victim)


def test_a_symlink_planted_at_a_predictable_temporary_name_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    target = tmp_path / "meta.json"
    plant_symlinks(target, victim)
    atomic_write_text(target, "{}\n")
    assert victim.read_text() == "keep me\n"
    assert target.read_text() == "{}\n" and not target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".meta.json.tmp", f".meta.json.tmp-{os.getpid()}", "meta.json", "victim.txt"]
    )


def test_the_file_is_replaced_whole_with_the_modes_of_a_new_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # readable as any new file would be


def test_jobs_preparing_the_same_cache_wait_for_each_other(tmp_path):
    """Two jobs of a sweep needing the same corpus: the second waits for the first, then finds it."""
    order = []

    def job(name: str, hold: float) -> None:
        with preparing(tmp_path / "toy"):
            order.append(f"{name} in")
            time.sleep(hold)
            order.append(f"{name} out")

    first = threading.Thread(target=job, args=("a", 0.5))
    first.start()
    while not order:
        time.sleep(0.01)
    second = threading.Thread(target=job, args=("b", 0.0))
    second.start()
    first.join()
    second.join()
    assert order == ["a in", "a out", "b in", "b out"]
