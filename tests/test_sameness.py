"""The bitwise comparison of two training runs (nmt.training.sameness)."""

import json

import torch

from nmt.training.sameness import LOSSES, compare_runs, differences


def test_a_tensor_one_bit_apart_differs_and_an_equal_one_does_not():
    a = torch.tensor([1.0, 2.0])
    b = a.clone()
    assert differences({"w": a}, {"w": b}) == []
    b.view(torch.int32)[1] += 1  # the last bit of the mantissa
    assert differences({"w": a}, {"w": b}) == [".w: tensors differ"]
    assert differences(a, a.double()) == [": tensors differ"]  # same values, another dtype


def test_nested_state_is_compared_key_by_key_but_for_wall_clock_time():
    a = {"state": {0: {"step": torch.tensor(3.0)}}, "progress": {"step": 3, "elapsed_s": 1.0, "best": 0.5}}
    b = {"state": {0: {"step": torch.tensor(3.0)}}, "progress": {"step": 3, "elapsed_s": 9.0, "best": 0.5}}
    assert differences(a, b) == []
    b["progress"]["best"] = 0.5000000000000001
    b["state"][1] = {}
    assert differences(a, b) == [
        ".state: keys ['1'] in one only",
        ".progress.best: 0.5 against 0.5000000000000001",
    ]


def test_runs_differing_in_one_loss_are_told_apart(tmp_path):
    state = {"model": {"w": torch.ones(2)}, "optimizer": {"state": {}}, "progress": {"step": 2}}
    for name, losses in (("a", [1.5, 2.25]), ("b", [1.5, 2.2500000000000004])):
        (tmp_path / name / "run/checkpoints").mkdir(parents=True)
        torch.save(state, tmp_path / name / "run/checkpoints/last.pt")
        (tmp_path / name / LOSSES).write_text(json.dumps([x.hex() for x in losses]))
    assert compare_runs(tmp_path / "a", tmp_path / "a") == []
    assert [line.split(":")[0] for line in compare_runs(tmp_path / "a", tmp_path / "b")] == ["losses[1]"]
