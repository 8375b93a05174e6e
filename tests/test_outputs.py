"""Where results are written (nmt.outputs): an output file that is one of its inputs is refused, and
``force=true`` replaces an earlier output of the same writer only, never another directory, never
through a symbolic link, and never what another writer is filling."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.errors import NMTError
from nmt.outputs import check_output_dir, check_output_file, replace_output_dir

RECORD, WRITER = "record.json", "the test"


def written(path: Path, text: str = "new") -> Path:
    """Fill ``path`` as a writer does, record included."""
    (path / "model.bin").write_text(text)
    (path / RECORD).write_text("{}")
    return path


def an_output(path: Path, text: str = "old") -> Path:
    path.mkdir(parents=True)
    return written(path, text)


def test_an_output_file_that_is_an_input_is_refused_by_name_link_or_hard_link(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("Ein Satz.\n")
    (tmp_path / "link.txt").symlink_to(doc)
    os.link(doc, tmp_path / "hard.txt")
    for output in (doc, tmp_path / "link.txt", tmp_path / "hard.txt", f"{tmp_path}/./doc.txt"):
        with pytest.raises(NMTError, match=f"output={output} is input={doc}: writing it would empty it"):
            check_output_file(output, {"input": str(doc), "prefix_file": None})
    with open(doc, "rb") as stdin, pytest.raises(NMTError, match="is stdin"):
        check_output_file(doc, {"stdin": stdin})
    check_output_file(tmp_path / "other.txt", {"input": doc})  # not there yet
    (tmp_path / "other.txt").write_text("")
    check_output_file(tmp_path / "other.txt", {"input": doc, "prefix_file": tmp_path / "missing"})
    check_output_file(None, {"input": doc})
    assert doc.read_text() == "Ein Satz.\n"


def test_force_replaces_an_earlier_output(tmp_path):
    out = an_output(tmp_path / "ct2")
    with pytest.raises(NMTError, match="already exists; add force=true"):
        check_output_dir(out, RECORD, False, WRITER)
    with replace_output_dir(out, RECORD, True, WRITER) as tmp:
        assert out.is_dir() and tmp.parent == out.parent and tmp.name.startswith(".ct2.tmp-")
        written(tmp)
    assert (out / "model.bin").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # nothing left beside it


def test_force_never_replaces_a_directory_that_is_no_output(tmp_path):
    """``output=outputs/RUN force=true`` must not delete the run, its checkpoints or anything else."""
    run = tmp_path / "outputs" / "RUN"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_text("weights")
    refused = pytest.raises(NMTError, match=f"output={run} is a directory that the test did not write")
    with refused, replace_output_dir(run, RECORD, True, WRITER) as tmp:
        written(tmp)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(NMTError, match="is a file, not a directory"):
        check_output_dir(a_file, RECORD, True, WRITER)
    assert (run / "checkpoints" / "best.pt").read_text() == "weights" and a_file.read_text() == "mine"
    assert sorted(p.name for p in run.parent.iterdir()) == ["RUN"]


def test_a_symbolic_link_is_never_followed_nor_replaced(tmp_path):
    target = an_output(tmp_path / "models" / "v3")
    link = tmp_path / "current"
    link.symlink_to(target, target_is_directory=True)
    for force in (False, True):
        with pytest.raises(NMTError, match="is a symbolic link"):
            check_output_dir(link, RECORD, force, WRITER)
    planted = an_output(tmp_path / "planted")  # a record that is a link is no record
    (planted / RECORD).unlink()
    (planted / RECORD).symlink_to(target / RECORD)
    with pytest.raises(NMTError, match="did not write"):
        check_output_dir(planted, RECORD, True, WRITER)
    assert link.is_symlink() and (target / "model.bin").read_text() == "old"


def test_a_failed_or_incomplete_write_leaves_the_earlier_output_whole(tmp_path):
    out = an_output(tmp_path / "ct2")
    with pytest.raises(RuntimeError), replace_output_dir(out, RECORD, True, WRITER) as tmp:
        (tmp / "model.bin").write_text("half")
        raise RuntimeError("interrupted")
    incomplete = pytest.raises(NMTError, match="did not write record.json")
    with incomplete, replace_output_dir(out, RECORD, True, WRITER):
        pass
    assert (out / "model.bin").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


def test_writers_to_one_output_fill_folders_of_their_own(tmp_path):
    """Another writer's folder (a live process) is left alone, one whose process is gone is cleaned,
    and so is neither a plain ``.NAME.tmp`` nor anything else beside the output."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    try:
        busy = tmp_path / f".ct2.tmp-{host}-{sleeper.pid}-abc"
        abandoned = tmp_path / f".ct2.tmp-{host}-{gone.pid}-def"
        legacy = tmp_path / ".ct2.tmp"
        for folder in (busy, abandoned, legacy):
            folder.mkdir()
            (folder / "model.bin").write_text("theirs")
        with replace_output_dir(tmp_path / "ct2", RECORD, False, WRITER) as tmp:
            assert tmp not in (busy, abandoned, legacy)
            written(tmp)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert (busy / "model.bin").read_text() == "theirs" and (legacy / "model.bin").read_text() == "theirs"
    assert not abandoned.exists() and (tmp_path / "ct2" / RECORD).is_file()


def test_an_output_file_that_cannot_be_written_is_refused_at_start(tmp_path):
    """A directory, a folder that is not there or is a file: one line before the work, not a traceback
    after it. A writer that makes its folders (``make_folder``) needs only a place to make them."""
    (tmp_path / "notes.txt").write_text("mine")
    cases = [
        (tmp_path, "is a directory; name a file"),
        (tmp_path / "missing" / "out.txt", f"the folder {tmp_path / 'missing'} does not exist"),
        (tmp_path / "notes.txt" / "out.txt", "notes.txt is a file, not a folder"),
    ]
    for output, message in cases:
        with pytest.raises(NMTError, match=message):
            check_output_file(output, {}, "eval.out")
    check_output_file(tmp_path / "missing" / "deeper" / "out.txt", {}, make_folder=True)
    with pytest.raises(NMTError, match="notes.txt is a file"):
        check_output_file(tmp_path / "notes.txt" / "a" / "out.txt", {}, make_folder=True)
    with pytest.raises(NMTError, match=r"^eval\.out=.* is input="):
        check_output_file(tmp_path / "notes.txt", {"input": tmp_path / "notes.txt"}, "eval.out")


def test_an_output_that_holds_the_current_directory_is_refused_before_any_work(tmp_path, monkeypatch):
    """``output=. force=true`` inside an earlier export (or ``output=..`` below it) would rename the
    directory the process runs in and delete it: refused at start, and nothing is left beside it."""
    out = an_output(tmp_path / "ct2")
    (out / "sub").mkdir()
    for cwd, output in ((out, "."), (out / "sub", ".."), (out, str(out))):
        monkeypatch.chdir(cwd)
        with pytest.raises(NMTError, match="holds the current directory"):
            check_output_dir(output, RECORD, True, WRITER)
        with (
            pytest.raises(NMTError, match="holds the current directory"),
            replace_output_dir(output, RECORD, True, WRITER) as tmp,
        ):
            written(tmp)
    assert (out / "model.bin").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]
    monkeypatch.chdir(tmp_path)
    with replace_output_dir("ct2", RECORD, True, WRITER) as tmp:  # a relative name from elsewhere
        written(tmp)
    assert (out / "model.bin").read_text() == "new"
