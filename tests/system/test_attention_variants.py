"""End to end: RNNsearch and a Transformer with additive cross-attention learn the toy task; their
attention shows up in TensorBoard and in scripts/plot_attention.py's PNG.

Each model is trained once per module (in-process, on one thread, with the session's toy data; see
conftest.py) and shared by the tests below. Each run takes about 25 s on two busy CPU cores.
"""

import time
from pathlib import Path

import matplotlib.image
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import DecodingConfig
from nmt.data import prepare_corpus
from nmt.decoding import beam_search, greedy_search, pad_batch
from nmt.plotting import PNG_DPI, attention_figure_size
from nmt.training.loop import train

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COMMON = ["trainer.keep_checkpoints=0", "trainer.valid_bleu_sentences=100"]
# The toy preset sets Transformer keys, which RNNSearchConfig rejects, so the RNNsearch run takes the
# preset's data, tokenizer and optimizer settings one by one (same data cache key).
RUNS = {
    "additive": [
        "model.cross_attention=additive",
        "model.d_model=64",
        "model.ff_dim=128",
        "model.heads=2",
        "model.additive_dim=16",
        "optim.lr=5e-3",
        "trainer.max_steps=800",
        "trainer.valid_every=800",
    ],
    "rnnsearch": [
        "tokenizer.vocab_size=300",
        "model=rnnsearch_small",
        "model.embed_dim=64",
        "model.hidden_size=64",
        "model.attention_dim=64",
        "model.readout_dim=64",
        "model.dropout=0.0",
        "model.max_positions=64",
        "optim.lr=3e-3",
        "optim.warmup_steps=100",
        "optim.label_smoothing=0.0",
        "trainer.max_tokens=2048",
        "trainer.max_steps=500",
        "trainer.valid_every=500",
    ],
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, toy, tmp_path_factory) -> dict:
    """A trained toy model: its run dir, final validation metrics and training time."""
    cfg = toy.config(*RUNS[request.param], *COMMON, preset=request.param != "rnnsearch")
    run_dir = tmp_path_factory.mktemp(request.param)
    start = time.monotonic()
    final = train(cfg, run_dir)
    return {"name": request.param, "dir": run_dir, "final": final, "seconds": time.monotonic() - start}


def test_learns_the_toy_task(run):
    assert run["final"]["bleu"] > 90, f"{run['name']}: {run['final']} after {run['seconds']:.0f} s"


@torch.no_grad()
def test_beam_of_one_equals_greedy(run):
    model, _, cfg = model_from_checkpoint(load_checkpoint(run["dir"] / "checkpoints" / "last.pt"))
    valid = prepare_corpus(cfg.data, cfg.tokenizer, progress=False).splits["valid"]
    src = pad_batch([valid.src(i).tolist() for i in range(40)], "cpu")
    decoding, limit = DecodingConfig(beam_size=1), cfg.model.max_positions - 1
    greedy = greedy_search(model, src, decoding, limit)
    beam = beam_search(model, src, decoding, limit)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]


def test_tensorboard_has_the_attention_image(run):
    events = EventAccumulator(str(run["dir"] / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert "valid/attention" in events.Tags()["images"]
    image = events.Images("valid/attention")[-1]
    assert image.width > 100 and image.height > 100


def test_plot_attention_script_writes_the_promised_png(run, toy, tmp_path):
    checkpoint = run["dir"] / "checkpoints" / "best.pt"
    _, tok, cfg = model_from_checkpoint(load_checkpoint(checkpoint))
    text = prepare_corpus(cfg.data, cfg.tokenizer, progress=False).raw("valid")[0][0]
    png = tmp_path / "maps" / "attention.png"
    args = [f"checkpoint={checkpoint}", f"text={text}", f"output={png}", "heads=all"]
    result = toy.script("plot_attention.py", *args, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    translation, where = result.stdout.strip().splitlines()
    assert translation and where == f"attention map: {png}"
    heads = getattr(cfg.model, "heads", 1)  # RNNsearch has one attention "head"
    src_len = len(tok.encode_src([text])[0]) + 1  # + </s>
    tgt_len = len(tok.encode_tgt([translation])[0]) + 1
    width, height = attention_figure_size(heads, tgt_len, src_len, title=True)
    pixels = matplotlib.image.imread(png)
    assert abs(pixels.shape[1] - width * PNG_DPI) <= 1 and abs(pixels.shape[0] - height * PNG_DPI) <= 1
    assert pixels.std() > 0.05  # not blank
