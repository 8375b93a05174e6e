"""Training runs and stays finite in every precision, and compiled; fp16 only where CUDA is.

The steps are the real ones (``set_up`` + ``train_step`` on toy batches), on a model small enough that
a few steps take about a second on a CPU.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nmt.config import TrainConfig
from nmt.data import collate
from nmt.decoding import translate_ids
from nmt.devices import autocast, resolve_precision
from nmt.errors import NMTError
from nmt.models.attention import DotProductAttention
from nmt.training.loop import train_step
from nmt.training.setup import Run, set_up

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# `pytest -m cuda` (scripts/gpu_check.sh) runs these on a GPU; elsewhere they skip.
needs_cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def toy_config(compose_train_cfg, cache_dir: Path) -> Callable[..., TrainConfig]:
    """The toy experiment, shrunk: a few hundred pairs, a 2+2-layer model of width 32."""
    return lambda *overrides: compose_train_cfg(
        "experiment=toy",
        f"data.cache_dir={cache_dir}",
        "data.train_size=400",
        "data.valid_size=20",
        "data.test_size=20",
        "model.d_model=32",
        "model.ff_dim=64",
        "model.heads=2",
        "trainer.max_tokens=512",
        "trainer.progress=false",
        *overrides,
    )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("toy-data")


def train_a_few_steps(cfg: TrainConfig, run_dir: Path, steps: int = 3) -> tuple[Run, list[float]]:
    """``steps`` updates as train() makes them; returns the run and the per-token loss of each."""
    run = set_up(cfg, run_dir)
    split, losses = run.data.splits["train"], []
    for indices in itertools.islice(run.sampler, steps):
        batch = collate(split, indices, cfg.model.max_positions).to(run.device)
        stats = train_step(run, [batch])
        run.progress.step += 1
        losses.append(float(stats["loss_sum"]) / stats["tokens"])
    run.monitor.close({})
    return run, losses


def assert_trained_finite(run: Run, losses: list[float]) -> None:
    assert losses and all(math.isfinite(x) for x in losses), losses
    assert run.progress.skipped_steps == 0
    assert all(bool(torch.isfinite(p).all()) for p in run.model.parameters())


@pytest.mark.parametrize(
    "precision, device",
    [
        ("fp32", "cpu"),
        ("bf16", "cpu"),
        pytest.param("bf16", "cuda", marks=needs_cuda),
        pytest.param("fp16", "cuda", marks=needs_cuda),
    ],
)
def test_training_steps_are_finite(precision: str, device: str, toy_config, tmp_path: Path):
    cfg = toy_config(f"trainer.precision={precision}", f"trainer.device={device}")
    run, losses = train_a_few_steps(cfg, tmp_path)
    assert run.precision == precision
    assert run.scaler.is_enabled() == (precision == "fp16")  # loss scaling only where fp16 needs it
    assert_trained_finite(run, losses)


def test_bf16_autocast_computes_in_bf16_on_cpu(toy_config, tmp_path: Path):
    """Guards against a silent fall-back to fp32 (the speed-up on CPU comes from bf16 matmuls)."""
    run = set_up(toy_config("trainer.precision=bf16", "trainer.device=cpu"), tmp_path)
    run.monitor.close({})
    batch = collate(run.data.splits["train"], [0, 1], run.cfg.model.max_positions)
    with autocast(run.device, run.precision):
        logits = run.model(batch.src, batch.tgt_in)
    assert logits.dtype == torch.bfloat16


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_attention_on_cpu_matches_fp32(causal: bool):
    """bf16 on CPU skips the fused kernel (slow there) for the explicit path: same result, no weights."""
    torch.manual_seed(0)
    attn = DotProductAttention(32, 4, dropout=0.0, cross=False)
    x = torch.randn(3, 7, 32)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = True
    expected, _ = attn(x, x, x, key_padding_mask=pad, causal=causal)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = attn(x, x, x, key_padding_mask=pad, causal=causal)
    assert out.dtype == torch.bfloat16 and weights is None
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)


def test_fp16_on_cpu_is_refused():
    with pytest.raises(NMTError, match="bf16"):
        resolve_precision("fp16", torch.device("cpu"))


@pytest.mark.skipif(
    os.environ.get("NMT_TEST_COMPILE") != "1",
    reason="torch.compile takes 1-2 min on a 2-core CPU (cold cache); set NMT_TEST_COMPILE=1 to run",
)
def test_compiled_training_then_decoding(toy_config, tmp_path: Path):
    cfg = toy_config("trainer.compile=true", "trainer.device=cpu")
    start = time.perf_counter()
    run, losses = train_a_few_steps(cfg, tmp_path)
    print(f"3 compiled steps (compilation included): {time.perf_counter() - start:.1f} s")
    assert run.step_model is not run.model  # the compiled wrapper trained the shared parameters
    assert_trained_finite(run, losses)
    split = run.data.splits["test"]
    sources = [split.src(i) for i in range(8)]
    for beam in (1, 3):
        decoding = replace(cfg.decoding, beam_size=beam, max_len_b=5)
        hyps = translate_ids(run.model, sources, decoding, run.device, cfg.model.max_positions)
        assert len(hyps) == len(sources) and all(len(h) == 1 for h in hyps)


# ------------------------------------------------------------------------------ precision=auto
@pytest.fixture
def cpu_bf16(monkeypatch):
    """Pretend the CPU does (True) or does not (False) compute bf16 natively."""

    def set_native(native: bool) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")

    return set_native


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16"), (False, "fp32")])
def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16(cpu_bf16, native, expected):
    cpu_bf16(native)
    precision, why = resolve_precision("auto", torch.device("cpu"))
    assert precision == expected
    assert ("natively" in why) == native and why.startswith("auto")


def test_amx_counts_as_native_bf16(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert resolve_precision("auto", torch.device("cpu"))[0] == "bf16"


def test_kernels_capped_at_avx2_count_as_no_native_bf16(cpu_bf16, monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 on an AVX-512 BF16 CPU: PyTorch then emulates bf16, so fp32."""
    cpu_bf16(True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert resolve_precision("auto", torch.device("cpu"))[0] == "fp32"


def test_explicit_bf16_without_native_support_runs_but_warns_with_the_slowdown(cpu_bf16, caplog):
    cpu_bf16(False)
    assert resolve_precision("bf16", torch.device("cpu"))[0] == "bf16"
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "slower than fp32 here" in warning and "trainer.precision=fp32" in warning


def test_explicit_bf16_on_a_native_cpu_does_not_warn(cpu_bf16, caplog):
    cpu_bf16(True)
    assert resolve_precision("bf16", torch.device("cpu")) == ("bf16", "set by trainer.precision")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_no_preset_hard_codes_a_precision(compose_train_cfg):
    """Presets say auto, so one preset is fast on AVX2 and AVX-512-bf16 CPUs (and GPUs) alike."""
    presets = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
    assert "multi30k_cpu" in presets
    for name in presets:
        assert not re.search(r"^\s*precision:", (CONFIGS / "experiment" / f"{name}.yaml").read_text(), re.M)
        assert compose_train_cfg(f"experiment={name}").trainer.precision == "auto"
