"""The benchmark: its reference has the project model's dimensions, its FLOP count follows the
documented formula, and a tiny end-to-end run produces a complete, JSON-serialisable report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.benchmark import ReferenceTransformer, format_report, run_benchmark, transformer_flops
from nmt.benchmark.decoders import run_decoders_speed
from nmt.config import DecodersSpeedConfig, TransformerConfig, check_values
from nmt.data import Batch
from nmt.errors import NMTError
from nmt.models import Transformer, count_parameters, kv_cache_bytes

REPO = Path(__file__).resolve().parents[1]

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_benchmark_config_extends_the_training_config(compose_benchmark_cfg):
    cfg, bench = compose_benchmark_cfg("bench.steps=3", "trainer.precision=bf16")
    assert cfg.data.name == "multi30k-de-en" and cfg.model.d_model == 256 and cfg.trainer.max_tokens == 4096
    assert cfg.trainer.precision == "bf16" and bench.steps == 3 and bench.reference


@pytest.mark.parametrize("norm_first", [True, False])
def test_reference_has_the_project_models_parameters(norm_first: bool):
    cfg = TransformerConfig(
        d_model=32, ff_dim=64, heads=4, encoder_layers=2, decoder_layers=3, norm_first=norm_first
    )
    project = Transformer(cfg, 100, 100, joint_vocab=True)
    reference = ReferenceTransformer(cfg, 100, 100, joint_vocab=True)
    # nn.Transformer always ends both stacks with a LayerNorm; post-norm project stacks do not.
    extra = 0 if norm_first else 2 * 2 * cfg.d_model
    assert count_parameters(reference) == count_parameters(project) + extra
    assert reference.output.weight is reference.src_tokens.weight  # tied like the project's


def test_transformer_flops_follow_the_formula():
    cfg = TransformerConfig(d_model=8, ff_dim=16, heads=2, encoder_layers=1, decoder_layers=2)
    model = Transformer(cfg, 50, 50, joint_vocab=True)
    src = torch.tensor([[5, 6, 3], [7, 3, 0]])  # lengths 3, 2 (EOS = 3, PAD = 0)
    tgt_out = torch.tensor([[8, 3], [3, 0]])  # lengths 2, 1
    batch = Batch(src, tgt_out, tgt_out, src_tokens=5, tgt_tokens=3)
    n_enc = sum(p.numel() for m in (model.encoder, model.enc_norm) for p in m.parameters())
    n_dec = sum(p.numel() for m in (model.decoder, model.dec_norm) for p in m.parameters())
    d, v = 8, 50
    expected = 6 * (n_enc * 5 + (n_dec + d * v) * 3) + 12 * d * (
        1 * (3 * 3 + 2 * 2) + 2 * (2 * (2 + 3) + 1 * (1 + 2))
    )
    assert transformer_flops(model, batch) == pytest.approx(expected)


def test_tiny_benchmark_run_reports_everything(tmp_path: Path, one_thread, tiny_benchmark_cfg):
    cfg, bench = tiny_benchmark_cfg(
        tmp_path / "data",
        "model.kv_heads=1",
        "trainer.precision=fp32",  # the run's own precision (auto would differ by CPU); bf16 is timed too
        "bench.warmup_steps=1",
        "bench.steps=2",
        "bench.beam_size=2",
        "bench.matmul_size=128",
        "bench.precisions=[fp32,bf16]",
        "bench.profile_steps=3",  # more than the 2 measured batches: they are taken again
    )
    results = run_benchmark(cfg, bench, tmp_path)
    train, decode = results["train"], results["decode"]
    assert set(train["results"]) == {"project fp32", "reference fp32", "project bf16", "reference bf16"}
    for result in train["results"].values():
        assert result["step_ms_median"] > 0 and len(result["step_ms"]) == 2
    assert set(train["project_over_reference"]) == {"fp32", "bf16"}
    assert set(train["speedup_over_fp32"]) == {"project bf16", "reference bf16"}
    assert 0 <= train["batches"]["padding_fraction"] < 1 and train["model_flops_per_token"] > 0
    assert decode["sentences"] == 12 and len(decode["results"]) == 4
    assert set(decode["cache_speedup"]) == {"greedy", "beam 2"}
    kv = decode["kv_cache_per_sentence"]
    assert kv["kv_heads"] == 1 and kv["dtype_bytes"] == 4 and kv["src_positions"] > 1
    assert kv["bytes"] == kv_cache_bytes(cfg.model, kv["tgt_positions"], kv["src_positions"], 4)
    assert kv["beam_size"] == 2
    cross = cfg.model.decoder_layers * kv["src_positions"] * 2 * (cfg.model.d_model // cfg.model.heads) * 4
    assert kv["beam_bytes"] == 2 * kv["bytes"] - cross  # the source's keys and values once per sentence
    profile = train["profile"]
    assert profile["steps"] == 3 and profile["ms_per_step"] > 0
    assert sum(profile["groups_ms"].values()) == pytest.approx(profile["ms_per_step"])
    assert profile["groups_ms"]["matrix products"] > 0 and profile["groups_ms"]["optimizer"] > 0
    assert profile["top_ops"][0]["ms_per_step"] >= profile["top_ops"][-1]["ms_per_step"]
    json.dumps(results)  # the script writes it as JSON
    report = format_report(results)
    assert "project/reference" in report and "cache speedup" in report and "KV cache per sentence" in report
    assert "where a project step's time goes" in report


def test_the_benchmark_script_without_the_reference(tmp_path: Path):
    """``bench.train=true bench.reference=false``: the project's step alone, no ratio to report."""
    args = [
        "experiment=toy",
        "data=toy",
        f"data.cache_dir={tmp_path / 'data'}",
        "data.train_size=300",
        "data.test_size=12",
        "model.d_model=32",
        "model.ff_dim=64",
        "model.heads=2",
        "trainer.precision=fp32",
        "bench.train=true",
        "bench.reference=false",
        "bench.decode=false",
        "bench.warmup_steps=1",
        "bench.steps=2",
        "bench.matmul_size=64",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert list(results["train"]["results"]) == ["project fp32"]
    assert "project_over_reference" not in results["train"] and "project fp32" in proc.stdout


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ct2_model": None}, "ct2_model=DIR is required"),
        ({"ct2_vmap_model": "m"}, "ct2_vmap_model needs shortlist=FILE"),
    ],
)
def test_decoders_benchmark_refuses_bad_settings_before_loading_anything(settings, message):
    cfg = DecodersSpeedConfig(**{"checkpoint": "missing.pt", "ct2_model": "missing-ct2", **settings})
    with pytest.raises(NMTError, match=message):
        run_decoders_speed(cfg)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"repeats": 0}, "repeats=0: must be > 0"),
        ({"torch_threads": [1, 0]}, r"torch_threads=\[1, 0\]: must each be > 0"),
    ],
)
def test_the_decoders_benchmarks_settings_follow_their_rules_at_start(settings, message):
    cfg = DecodersSpeedConfig(**{"checkpoint": "missing.pt", "ct2_model": "missing-ct2", **settings})
    with pytest.raises(NMTError, match=message):
        check_values(cfg)
