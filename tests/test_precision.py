"""Training runs and stays finite in every precision, and compiled; fp16 only where CUDA is.

The steps are the real ones (``set_up`` + ``train_step`` on toy batches), on a model small enough that
a few steps take about a second on a CPU.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import nmt.devices
import nmt.models
import nmt.training.precision
from nmt.config import TrainConfig
from nmt.data import collate
from nmt.decoding import translate_ids
from nmt.devices import autocast, probe_bf16_speedup, resolve_precision
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
CPU = torch.device("cpu")


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Pretend the CPU's bf16 is "amx", "avx512_bf16" (dot products alone) or "" (none), with PyTorch's
    AVX-512 kernels."""

    def set_kind(kind: str) -> None:
        avx512_bf16, amx = kind in ("avx512_bf16", "amx"), kind == "amx"
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")

    return set_kind


def never_timed() -> tuple[float, str]:
    raise AssertionError("the probe ran where the CPU's facts decide")


def test_auto_without_native_bf16_is_fp32_untimed(cpu_bf16):
    cpu_bf16("")
    precision, why = resolve_precision("auto", CPU, never_timed, 1.1)
    assert precision == "fp32" and why.startswith("auto") and "no native" in why


@pytest.mark.parametrize("kind", ["avx512_bf16", "amx"])
@pytest.mark.parametrize(
    ("speedup", "expected"), [(1.3, "bf16"), (1.1, "bf16"), (1.05, "fp32"), (0.83, "fp32")]
)
def test_auto_with_native_bf16_takes_it_only_where_the_probe_finds_it_clearly_faster(
    cpu_bf16, kind, speedup, expected
):
    """AMX too: its bf16 matmuls run several times fp32's, yet the main job's small model stepped at
    0.83x in bf16 on one AMX Xeon (docs/speed.md)."""
    cpu_bf16(kind)
    precision, why = resolve_precision("auto", CPU, lambda: (speedup, "timed now"), 1.1)
    assert precision == expected
    assert f"{speedup:.2f}x as fast as fp32" in why and "timed now" in why  # the log says what and why
    assert ("cpu_bf16_min_speedup=1.1" in why) == (expected == "fp32")


@pytest.mark.parametrize("kind", ["avx512_bf16", "amx"])
def test_auto_with_native_bf16_without_a_probe_is_fp32(cpu_bf16, kind):
    cpu_bf16(kind)
    precision, why = resolve_precision("auto", CPU)
    assert precision == "fp32" and "not timed" in why and kind in why


def test_kernels_capped_at_avx2_count_as_no_native_bf16(cpu_bf16, monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 on an AMX CPU: PyTorch then emulates bf16, so fp32."""
    cpu_bf16("amx")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert resolve_precision("auto", CPU, never_timed, 1.1)[0] == "fp32"


def fake_clock(monkeypatch, seconds: dict[str, float]) -> tuple[Callable[[str], None], list[str]]:
    """An update that takes ``seconds[precision]`` on a clock that only it advances; the calls made."""
    now, calls = [0.0], []
    monkeypatch.setattr(nmt.devices.time, "perf_counter", lambda: now[0])

    def update(precision: str) -> None:
        calls.append(precision)
        now[0] += seconds[precision]

    return update, calls


def test_the_probe_takes_turns_and_is_measured_once_per_machine_and_model(monkeypatch, tmp_path):
    cache = tmp_path / "probe.json"
    update, calls = fake_clock(monkeypatch, {"fp32": 1.3, "bf16": 1.0})
    speedup, source = probe_bf16_speedup(update, {"model": "a"}, cache, pairs=4)
    assert speedup == pytest.approx(1.3) and "timed now" in source
    # a warm-up each, then pairs in alternating order: load changes hit both precisions alike
    assert calls == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "bf16", "bf16", "fp32"]
    calls.clear()
    assert probe_bf16_speedup(update, {"model": "a"}, cache)[0] == pytest.approx(1.3) and not calls
    assert "cached in" in probe_bf16_speedup(update, {"model": "a"}, cache)[1]
    other, _ = fake_clock(monkeypatch, {"fp32": 1.0, "bf16": 1.25})
    assert probe_bf16_speedup(other, {"model": "b"}, cache, pairs=2)[0] == pytest.approx(0.8)
    assert len(json.loads(cache.read_text())) == 2


def test_the_probe_cache_is_not_written_through_a_planted_symlink(monkeypatch, tmp_path):
    cache, victim = tmp_path / "probe.json", tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / f".probe.json.tmp-{os.getpid()}").symlink_to(victim)
    update, _ = fake_clock(monkeypatch, {"fp32": 1.3, "bf16": 1.0})
    probe_bf16_speedup(update, {"model": "a"}, cache, pairs=2)
    assert victim.read_text() == "keep me\n" and len(json.loads(cache.read_text())) == 1


def test_set_up_probes_on_avx512_bf16_alone_and_trains_as_without_the_probe(
    toy_config, tmp_path, cpu_bf16, monkeypatch
):
    """The probe runs the model's forward and backward in both precisions on the run's first training
    batches, each batch in both (timed here by a fake that says bf16 is 1.5x as fast), and leaves no
    gradient, no change of the random state and no step of the run's sampler behind: the run starts as
    one with trainer.precision=bf16 does."""
    cpu_bf16("avx512_bf16")
    ran: list[tuple[str, tuple[int, ...]]] = []
    forward = nmt.models.Transformer.forward  # experiment=toy

    def recording_forward(model, src, *args, **kwargs):
        ran.append(
            (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else "fp32", src.shape)
        )
        return forward(model, src, *args, **kwargs)

    def probe(update, key, cache, pairs=8):
        for precision in ("fp32", "bf16", "fp32", "bf16"):
            update(precision)
        assert key["threads"] == torch.get_num_threads() and key["model"]["d_model"] == 32
        return 1.5, f"faked, cache {cache.name}"

    monkeypatch.setattr(nmt.training.precision, "probe_bf16_speedup", probe)
    monkeypatch.setattr(nmt.models.Transformer, "forward", recording_forward)
    probed = set_up(toy_config("trainer.device=cpu"), tmp_path / "a")
    monkeypatch.setattr(nmt.models.Transformer, "forward", forward)
    probed.monitor.close({})
    after_probe = torch.get_rng_state()
    assert probed.precision == "bf16" and probed.sampler.position == 0
    split, positions = probed.data.splits["train"], probed.cfg.model.max_positions
    first_two = [
        collate(split, indices, positions).src.shape for indices in itertools.islice(probed.sampler, 2)
    ]
    probed.sampler.set_epoch(0)
    probed.sampler.position = 0
    assert [r[0] for r in ran] == ["fp32", torch.bfloat16] * 2
    assert [r[1] for r in ran] == [first_two[0]] * 2 + [first_two[1]] * 2  # the run's batches, each in both
    assert all(p.grad is None for p in probed.model.parameters())
    fixed = set_up(toy_config("trainer.device=cpu", "trainer.precision=bf16"), tmp_path / "b")
    fixed.monitor.close({})
    assert torch.equal(after_probe, torch.get_rng_state())
    assert all(torch.equal(a, b) for a, b in zip(probed.model.parameters(), fixed.model.parameters()))


def test_explicit_bf16_without_native_support_runs_but_warns_with_the_slowdown(cpu_bf16, caplog):
    cpu_bf16("")
    assert resolve_precision("bf16", torch.device("cpu"))[0] == "bf16"
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "slower than fp32 here" in warning and "trainer.precision=fp32" in warning


def test_explicit_bf16_on_a_native_cpu_does_not_warn(cpu_bf16, caplog):
    cpu_bf16("avx512_bf16")
    assert resolve_precision("bf16", torch.device("cpu")) == ("bf16", "set by trainer.precision")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_no_preset_hard_codes_a_precision(compose_train_cfg):
    """Presets say auto, so one preset is fast on AVX2 and AVX-512-bf16 CPUs (and GPUs) alike."""
    presets = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
    assert "multi30k_cpu" in presets
    for name in presets:
        assert not re.search(r"^\s*precision:", (CONFIGS / "experiment" / f"{name}.yaml").read_text(), re.M)
        assert compose_train_cfg(f"experiment={name}").trainer.precision == "auto"


PAGE_FAULTS_OF_A_REALLOCATED_TENSOR = """
import resource, sys, torch
from nmt.devices import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 * 1024 * 1024)  # 64 MiB, written through: every page touched
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del x
print(min(faults[2:]))  # once the first allocations have grown the heap
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_keep_freed_memory_reuses_freed_pages_instead_of_faulting_in_fresh_ones():
    """A tensor freed and allocated again (what every step does with its logits) takes its pages from
    the heap with keep_freed_memory, without a page fault per 4 KiB as glibc's default gives."""
    import subprocess
    import sys

    def faults(mode: str) -> int:
        run = subprocess.run(
            [sys.executable, "-c", PAGE_FAULTS_OF_A_REALLOCATED_TENSOR, mode],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(run.stdout.split()[-1])

    pages = 64 * 1024 * 1024 // 4096
    assert faults("default") > pages / 2  # fresh pages each time: the cost this avoids
    assert faults("keep") < pages / 20
