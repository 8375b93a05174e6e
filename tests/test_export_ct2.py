"""CTranslate2 export and backend on tiny random models: the exported model computes what ours computes
(teacher-forced log-probabilities equal within fp32 rounding) for every exportable architecture
variant, what cannot be exported is refused in one line, and the backend plugs into our decoding API.
Decoding agreement on a trained model: tests/system/test_ct2_decoding.py."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import random_model, sentencepiece_model

from nmt.benchmark import format_report, run_benchmark
from nmt.benchmark.ct2_speed import VARIANTS, compare_with_direct, format_direct, parse_layout
from nmt.checkpoint import FORMAT_VERSION, atomic_save
from nmt.config import (
    DecodingConfig,
    ExportCT2Config,
    RNNSearchConfig,
    ToyDataConfig,
    TrainConfig,
    TransformerConfig,
    to_container,
)
from nmt.decoding import length_penalty, pad_batch, translate_ids
from nmt.errors import NMTError
from nmt.models import Transformer
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID
from nmt.text.tokenizer import Tokenizer

ctranslate2 = pytest.importorskip("ctranslate2")

from nmt.ct2.backend import CT2Backend, ct2_length_penalty, thread_layout  # noqa: E402
from nmt.ct2.export import check_exportable, export_checkpoint, export_model  # noqa: E402
from nmt.inference.backends import load_backend  # noqa: E402
from nmt.inference.translator import Translator  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EN_DE = ("en", "de")
TINY = TransformerConfig(
    d_model=32, ff_dim=64, heads=4, encoder_layers=2, decoder_layers=2, max_positions=48, dropout=0.0
)


@pytest.fixture(scope="module")
def spm_models() -> dict:
    src, text = sentencepiece_model(0, 90)
    tgt, _ = sentencepiece_model(1, 70)
    return {"joint": Tokenizer(src), "separate": Tokenizer(src, tgt), "text": text}


def torch_log_probs(model: Transformer, src: list[int], tgt: list[int]) -> list[float]:
    """Teacher-forced log P of each target token and of the final EOS (source with EOS appended)."""
    with torch.no_grad():
        logits = model(pad_batch([src], "cpu"), torch.tensor([[BOS_ID, *tgt]]))
    log_probs = torch.log_softmax(logits.float(), dim=-1)[0]
    return log_probs[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS_ID])].tolist()


def checkpoint(model_cfg, tokenizer_state: dict, model_state: dict | None = None) -> dict:
    return {
        "format": FORMAT_VERSION,
        "model": model_state or {},
        "config": to_container(TrainConfig(data=ToyDataConfig(), model=model_cfg)),
        "tokenizer": tokenizer_state,
        "progress": {"step": 7},
    }


# ------------------------------------------------------------------------------------ score parity


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-norm", "post-norm"])
@pytest.mark.parametrize(
    "positional, kv_heads",
    [("sinusoidal", 0), ("learned", 0), ("rope", 0), ("sinusoidal", 2), ("rope", 1)],
    ids=["sinusoidal", "learned", "rope", "gqa", "rope-mqa"],
)
@pytest.mark.parametrize("vocab", ["joint-tied", "joint-untied", "separate"])
def test_exported_model_scores_like_pytorch(spm_models, tmp_path, norm_first, positional, kv_heads, vocab):
    tokenizer = spm_models["separate" if vocab == "separate" else "joint"]
    cfg = replace(
        TINY,
        norm_first=norm_first,
        positional=positional,
        kv_heads=kv_heads,
        share_embeddings=vocab == "joint-tied",
    )
    model = random_model(cfg, tokenizer)
    backend = CT2Backend(
        export_model(model, tokenizer, tmp_path / "ct2"), tokenizer, inter_threads=1, intra_threads=1
    )

    text = spm_models["text"]
    sources = tokenizer.encode_src(text[:6])  # different lengths: padded batches on both sides
    targets = [t[: 5 + 4 * i] for i, t in enumerate(tokenizer.encode_tgt(text[6:12]))]
    # Long enough to use positions far from 0 (the tables must line up everywhere).
    sources.append(tokenizer.encode_src([" ".join(text[20:26])])[0][: TINY.max_positions - 1])
    targets.append(tokenizer.encode_tgt([" ".join(text[30:36])])[0][: TINY.max_positions - 1])
    got = backend.score_ids(sources, targets, max_tokens=1000, shortlist=None)
    for src, tgt, ct2_scores in zip(sources, targets, got):
        assert ct2_scores == pytest.approx(torch_log_probs(model, src, tgt), abs=2e-4)


def test_shared_and_separate_vocabularies_are_written(spm_models, tmp_path):
    joint, separate = spm_models["joint"], spm_models["separate"]
    one = export_model(random_model(TINY, joint), joint, tmp_path / "joint")
    two = export_model(
        random_model(replace(TINY, share_embeddings=False), separate), separate, tmp_path / "sep"
    )
    assert {"shared_vocabulary.json", "sentencepiece.model", "nmt_export.json"} <= {
        p.name for p in one.iterdir()
    }
    names = {p.name for p in two.iterdir()}
    assert {"source_vocabulary.json", "target_vocabulary.json", "source.model", "target.model"} <= names
    assert (one / "sentencepiece.model").read_bytes() == joint.protos[0]


def test_quantized_export_leaves_the_model_alone(spm_models, tmp_path):
    """CTranslate2 quantizes the arrays it is given in place: ours must have been copies. (What
    quantization promises, translations close to full precision, is checked on a trained model in
    tests/system/test_ct2_decoding.py: a random model's int8 scores depend on the CPU's kernels.)"""
    tokenizer = spm_models["joint"]
    model = random_model(TINY, tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sources, targets = (
        tokenizer.encode_src(spm_models["text"][:4]),
        tokenizer.encode_tgt(spm_models["text"][4:8]),
    )
    for quantization in ("int8", "float16"):
        backend = CT2Backend(export_model(model, tokenizer, tmp_path / quantization, quantization), tokenizer)
        scores = backend.score_ids(sources, targets, max_tokens=1000, shortlist=None)
        assert [len(s) for s in scores] == [len(t) + 1 for t in targets]
        assert all(math.isfinite(x) and x <= 0 for s in scores for x in s)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------------------------ the backend


@pytest.mark.parametrize(
    "model_cfg", [TINY, replace(TINY, positional="rope", kv_heads=2)], ids=["base", "rope-gqa"]
)
def test_greedy_decoding_of_a_random_model_matches(spm_models, tmp_path, model_cfg):
    """A random model runs every sentence to its length budget: the cut-and-rescore path. With RoPE, each
    incremental step must rotate by its true position in both libraries."""
    tokenizer = spm_models["joint"]
    model = random_model(model_cfg, tokenizer)
    backend = CT2Backend(
        export_model(model, tokenizer, tmp_path / "ct2"), tokenizer, inter_threads=1, intra_threads=1
    )
    sources = tokenizer.encode_src(spm_models["text"][:12])
    cfg = DecodingConfig(beam_size=1, max_len_a=1.0, max_len_b=2)
    ours = translate_ids(model, sources, cfg, "cpu", TINY.max_positions)
    theirs = backend.translate_ids(sources, cfg)
    for a, b in zip(ours, theirs):
        assert a[0].tokens == b[0].tokens
        assert b[0].log_prob == pytest.approx(a[0].log_prob, abs=1e-3)
        assert b[0].score == pytest.approx(a[0].score, abs=1e-3)


def test_sentences_whose_search_kept_pad_or_bos_are_searched_again_without_them(spm_models, tmp_path):
    """A random model gives PAD and BOS beams: those sentences, and only those, are searched again with
    both suppressed, and every log-probability returned is the model's."""
    tokenizer = spm_models["joint"]
    model = random_model(TINY, tokenizer, seed=1)  # 21 of the 30 sentences hold PAD or BOS unsuppressed
    backend = CT2Backend(export_model(model, tokenizer, tmp_path / "m"), tokenizer, "cpu", 1, 1)
    sources = tokenizer.encode_src(spm_models["text"][:30])
    cfg = DecodingConfig(beam_size=4, nbest=4, max_len_a=1.0, max_len_b=2)
    searched = []
    search = backend._search

    def spy(which, *args, suppress):
        searched.append((list(which), suppress))
        return search(which, *args, suppress=suppress)

    backend._search = spy
    theirs = backend.translate_ids(sources, cfg)
    (first, unsuppressed), (again, suppressed) = searched
    assert first == list(range(30)) and not unsuppressed and suppressed and 0 < len(again) < 30
    free = backend.translator.translate_batch(
        [tokenizer.src_pieces(s) for s in sources], beam_size=4, num_hypotheses=4, max_decoding_length=40
    )
    held = {i for i, r in enumerate(free) if any({"<pad>", "<s>"} & set(h) for h in r.hypotheses)}
    assert held and set(again) >= held  # those CTranslate2 alone fills with PAD or BOS are among them
    for source, hyps in zip(sources, theirs):
        assert all(PAD_ID not in h.tokens and BOS_ID not in h.tokens for h in hyps)
        model_scores = backend.score_ids([source] * len(hyps), [h.tokens for h in hyps], 1000, None)
        for h, token_scores in zip(hyps, model_scores):
            assert h.log_prob == pytest.approx(sum(token_scores), abs=1e-4)


def has_repeated_ngram(tokens: list[int], n: int) -> bool:
    ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(ngrams) != len(set(ngrams))


def never_pad_or_bos(model: Transformer) -> Transformer:
    """``model`` giving PAD and BOS no probability worth a beam anywhere (logits about -60), as training
    leaves a model: the decoder's output is pushed along a direction u that their (tied) embeddings
    point against."""
    with torch.no_grad():
        u = torch.nn.functional.normalize(torch.randn(model.cfg.d_model), dim=0)
        model.dec_norm.weight.fill_(1.0)
        model.dec_norm.bias.copy_(6.0 * u)
        model.output.weight[PAD_ID] = model.output.weight[BOS_ID] = -10.0 * u
    return model


@pytest.fixture(scope="module")
def looping(spm_models, tmp_path_factory):
    """A random model that loops (most outputs repeat a bigram) and runs to its length budget, where the
    word reward decides between lengths, and gives PAD and BOS no chance (as a trained model); its
    CTranslate2 backend; 30 sources."""
    tokenizer = spm_models["joint"]
    model = never_pad_or_bos(random_model(TINY, tokenizer, seed=3))
    backend = CT2Backend(
        export_model(model, tokenizer, tmp_path_factory.mktemp("ct2") / "m"),
        tokenizer,
        inter_threads=1,
        intra_threads=1,
    )
    return model, backend, tokenizer.encode_src(spm_models["text"][:30])


@pytest.mark.parametrize(
    "setting",
    [{"beam_size": 1, "no_repeat_ngram": 2, "word_reward": 3.0}, {"beam_size": 4, "word_reward": 3.0}],
)
def test_ngram_blocking_and_word_reward_mean_the_same_in_both_backends(looping, setting):
    model, backend, sources = looping
    cfg = DecodingConfig(nbest=1, max_len_a=1.0, max_len_b=4)
    unblocked = backend.translate_ids(sources, replace(cfg, beam_size=1))
    assert sum(has_repeated_ngram(h[0].tokens, 2) for h in unblocked) > 10  # blocking has work to do
    cfg = replace(cfg, **setting)
    ours = translate_ids(model, sources, cfg, "cpu", TINY.max_positions)
    theirs = backend.translate_ids(sources, cfg)
    if cfg.no_repeat_ngram:
        assert not any(has_repeated_ngram(h[0].tokens, 2) for h in theirs)
    for a, b in zip(ours, theirs):
        assert a[0].tokens == b[0].tokens
        assert b[0].log_prob == pytest.approx(a[0].log_prob, abs=1e-3)
        assert b[0].score == pytest.approx(a[0].score, abs=1e-3)
        length = len(b[0].tokens) + 1
        assert b[0].score == pytest.approx(b[0].log_prob / length_penalty(length, cfg.alpha) + 3.0 * length)


def test_ct2_refuses_ngram_blocking_in_beam_search(looping):
    """CTranslate2 renormalises after the ban, which ranks beams differently: refused, not silently other."""
    _, backend, sources = looping
    with pytest.raises(NMTError, match=r"^backend=ct2 cannot block repeated n-grams in beam search"):
        backend.translate_ids(sources, DecodingConfig(beam_size=4, no_repeat_ngram=2))


def test_backend_returns_nbest_hypotheses_ranked_by_our_score(spm_models, tmp_path):
    tokenizer = spm_models["joint"]
    backend = CT2Backend(export_model(random_model(TINY, tokenizer), tokenizer, tmp_path / "m"), tokenizer)
    sources = tokenizer.encode_src(spm_models["text"][:5])
    hyps = backend.translate_ids(sources, DecodingConfig(beam_size=4, nbest=3, max_len_a=0.5, max_len_b=3))
    for src, nbest in zip(sources, hyps):
        assert len(nbest) == 3 and [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        assert all(len(h.tokens) <= int(0.5 * (len(src) + 1) + 3) for h in nbest)


@pytest.fixture(scope="module")
def early_ending(spm_models, tmp_path_factory):
    """A random model whose EOS is likely from the first step on (its output row raised), so that beams
    end at many different lengths and CTranslate2's own length penalty decides which ended hypotheses it
    keeps; its CTranslate2 backend (1 thread); 60 short sources and one long one."""
    tokenizer = spm_models["joint"]
    model = random_model(replace(TINY, share_embeddings=False), tokenizer, seed=1)
    with torch.no_grad():
        model.output.weight[EOS_ID] += 1.2
    backend = CT2Backend(
        export_model(model, tokenizer, tmp_path_factory.mktemp("ct2") / "m"),
        tokenizer,
        inter_threads=1,
        intra_threads=1,
    )
    sources = sorted(tokenizer.encode_src(spm_models["text"][:200]), key=len)
    return backend, sources[:60], sources[-1]


def test_a_sentence_decodes_alike_whatever_else_is_in_the_call(early_ending):
    """Each sentence alone, beside one long sentence, and all in one call (shuffled, with the long one):
    the same n-best lists. (A call with one length penalty and budget for all, from the mean and the
    longest source, changed 12 of these 60 best translations.)"""
    backend, short, long = early_ending
    cfg = DecodingConfig(beam_size=4, nbest=2, alpha=2.0, max_len_a=1.0, max_len_b=3)
    alone = [backend.translate_ids([s], cfg)[0] for s in short]
    assert len({len(nbest[0].tokens) for nbest in alone}) >= 4  # ends at many lengths: the penalty matters
    beside_long = [backend.translate_ids([s, long], cfg)[0] for s in short]
    order = random.Random(0).sample(range(len(short)), len(short))
    shuffled = backend.translate_ids([long, *(short[i] for i in order)], cfg)[1:]
    together = [None] * len(short)
    for i, nbest in zip(order, shuffled):
        together[i] = nbest
    for one, *others in zip(alone, beside_long, together):
        for other in others:
            assert [h.tokens for h in other] == [h.tokens for h in one]
            assert [h.score for h in other] == pytest.approx([h.score for h in one], abs=1e-5)


@pytest.mark.parametrize(
    ("given", "cores", "layout"),
    [((0, 0), 2, (2, 1)), ((0, 0), 1, (1, 1)), ((1, 0), 2, (1, 2)), ((0, 2), 4, (2, 2)), ((3, 1), 2, (3, 1))],
)
def test_thread_layout_fills_the_cores_with_one_thread_translations_unless_told(given, cores, layout):
    assert thread_layout(*given, cores) == layout


def test_the_thread_layout_reaches_ctranslate2_from_load_backend(spm_models, tmp_path):
    tokenizer = spm_models["joint"]
    model = random_model(TINY, tokenizer)
    model_dir = export_model(model, tokenizer, tmp_path / "m")
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        backend = load_backend(
            "ct2", str(model_dir), model, tokenizer, torch.device("cpu"), 48, EN_DE, (2, 1)
        )
        assert torch.get_num_threads() == 3  # CTranslate2 (intra_threads 1) leaves torch's threads alone
    finally:
        torch.set_num_threads(threads)
    assert (backend.translator.num_translators, backend.intra_threads) == (2, 1)
    with pytest.raises(NMTError, match="ct2_inter_threads=-1, ct2_intra_threads=0: must be >= 0"):
        load_backend("ct2", str(model_dir), model, tokenizer, torch.device("cpu"), 48, EN_DE, (-1, 0))


def test_backend_refuses_a_model_exported_with_another_tokenizer(spm_models, tmp_path):
    joint, separate = spm_models["joint"], spm_models["separate"]
    model_dir = export_model(random_model(TINY, joint), joint, tmp_path / "m")
    with pytest.raises(NMTError, match="different tokenizer"):
        CT2Backend(model_dir, separate)
    with pytest.raises(NMTError, match="not a model directory written by scripts/export_ct2.py"):
        CT2Backend(tmp_path, joint)


def test_ct2_length_penalty_grows_like_gnmt_at_the_given_length():
    alpha, n = 0.6, 20
    gnmt = lambda m: alpha * torch.log(torch.tensor((5.0 + m) / 6.0))  # noqa: E731
    lp = ct2_length_penalty(alpha, n)
    slope_gnmt = (gnmt(n + 0.01) - gnmt(n - 0.01)) / 0.02
    slope_ct2 = lp * (torch.log(torch.tensor(n + 0.01)) - torch.log(torch.tensor(n - 0.01))) / 0.02
    assert float(slope_ct2) == pytest.approx(float(slope_gnmt), rel=1e-3)
    assert ct2_length_penalty(0.0, n) > 0  # 0 would switch CTranslate2 to stopping at the first end


# --------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "model_cfg",
    [
        replace(TINY, cross_attention="additive"),
        replace(TINY, self_attention="additive"),
        RNNSearchConfig(embed_dim=8, hidden_size=8, attention_dim=8, readout_dim=4),
    ],
    ids=["additive-cross", "additive-self", "rnnsearch"],
)
def test_unexportable_models_are_refused_before_loading(tmp_path, model_cfg):
    # Neither weights nor tokenizer are valid: the refusal must come first, from the config alone.
    path = tmp_path / "model.pt"
    junk = torch.tensor(list(b"not a sentencepiece model"), dtype=torch.uint8)
    atomic_save(checkpoint(model_cfg, {"src": junk, "tgt": None}), path)
    with pytest.raises(NMTError, match="cannot be exported to CTranslate2") as e:
        export_checkpoint(ExportCT2Config(checkpoint=str(path), output=str(tmp_path / "out")))
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    with pytest.raises(NMTError):
        check_exportable(model_cfg)


def test_export_script_writes_the_model_and_refuses_in_one_line(spm_models, tmp_path):
    tokenizer = spm_models["joint"]
    model = random_model(TINY, tokenizer)
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    atomic_save(checkpoint(TINY, tokenizer.state_dict(), model.state_dict()), good)
    atomic_save(checkpoint(replace(TINY, cross_attention="additive"), tokenizer.state_dict()), bad)

    def export(*args: str) -> subprocess.CompletedProcess:
        script = str(REPO / "scripts" / "export_ct2.py")
        return subprocess.run([sys.executable, script, *args], cwd=tmp_path, capture_output=True, text=True)

    proc = export(f"checkpoint={good}", "output=ct2", "quantization=int8")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ct2" / "model.bin").is_file() and "ct2" in proc.stdout
    with pytest.raises(NMTError, match="already exists; add force=true to replace it"):
        export_checkpoint(ExportCT2Config(checkpoint=str(good), output=str(tmp_path / "ct2")))
    export_checkpoint(ExportCT2Config(checkpoint=str(good), output=str(tmp_path / "ct2"), force=True))
    # force=true replaces an export, never another directory: here the one holding the checkpoints
    with pytest.raises(NMTError, match="did not write \\(no nmt_export.json\\), so force=true does not"):
        export_checkpoint(ExportCT2Config(checkpoint=str(good), output=str(tmp_path), force=True))
    assert good.is_file() and bad.is_file()
    refused = export(f"checkpoint={bad}", "output=other")
    assert refused.returncode == 1 and not (tmp_path / "other").exists()
    assert refused.stderr.strip().startswith("error: model.cross_attention='additive' cannot be exported")
    assert len(refused.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt", "ct2", "good.pt"]  # no log files


# -------------------------------------------------------------------------------------- benchmark


def test_benchmark_reports_both_backends(tmp_path, one_thread, tiny_benchmark_cfg):
    cfg, bench = tiny_benchmark_cfg(
        tmp_path / "data",
        "bench.train=false",
        "bench.beam_size=2",
        "bench.matmul_size=64",
        "bench.ct2=true",
        "bench.ct2_quantizations=[none,int8]",
    )
    results = run_benchmark(cfg, bench, tmp_path)
    ct2 = results["decode"]["ct2"]
    assert [(r["quantization"], r["search"]) for r in ct2["results"]] == [
        ("none", "greedy"),
        ("none", "beam 2"),
        ("int8", "greedy"),
        ("int8", "beam 2"),
    ]
    assert all(r["sentences_per_s"] > 0 and r["speedup_over_torch"] > 0 for r in ct2["results"])
    assert ct2["results"][0]["same_as_torch"] == 1.0  # greedy, fp32: the same tokens
    assert "CTranslate2" in format_report(results)


def test_backend_against_ctranslate2_directly_side_by_side(spm_models, tmp_path):
    tokenizer = spm_models["joint"]
    model_dir = export_model(random_model(TINY, tokenizer), tokenizer, tmp_path / "m")
    sources = tokenizer.encode_src(spm_models["text"][:12])
    cfg = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=2)
    result = compare_with_direct(model_dir, tokenizer, sources, cfg, [(1, 1), (2, 1)], repeats=2, warmup=2)
    assert [row["layout"] for row in result["rows"]] == ["1x1", "2x1"]
    for row in result["rows"]:
        assert all(len(row[f"{v} s all"]) == 2 and row[f"{v} s"] > 0 for v in VARIANTS)
        assert row["backend / direct"] > 0 and row["backend / per length cpu"] > 0
    assert result["fastest_backend_layout"] in ("1x1", "2x1") and result["backend_over_fastest_direct"] > 0
    table = format_direct(result)
    assert len(table) == 5 and table[2].startswith("1x1") and "fastest layout" in table[-1]
    with pytest.raises(NMTError, match=r"layouts: '2-1' is not INTERxINTRA"):
        parse_layout("2-1")


# ------------------------------------------------------------------------- which model, which input


def test_backend_ct2_refuses_an_export_of_another_checkpoint_of_the_same_tokenizer(spm_models, tmp_path):
    """The export records the digest of the weights it holds: another checkpoint's export is refused
    in one line (/info and reports would name one model while another translates), the same weights
    saved again with other settings are accepted, and an export that records none is refused."""
    tokenizer = spm_models["joint"]
    first, second, again = tmp_path / "first.pt", tmp_path / "second.pt", tmp_path / "again.pt"
    weights = random_model(TINY, tokenizer, seed=0).state_dict()
    atomic_save(checkpoint(TINY, tokenizer.state_dict(), weights), first)
    atomic_save(
        checkpoint(TINY, tokenizer.state_dict(), random_model(TINY, tokenizer, seed=1).state_dict()), second
    )
    resaved = checkpoint(TINY, tokenizer.state_dict(), weights)
    atomic_save({**resaved, "progress": {"step": 8}}, again)
    model_dir = export_checkpoint(ExportCT2Config(checkpoint=str(first), output=str(tmp_path / "ct2")))
    cpu = torch.device("cpu")
    for accepted in (first, again):
        assert Translator.from_checkpoint(str(accepted), cpu, "ct2", str(model_dir)).backend.name == "ct2"
    with pytest.raises(NMTError) as e:
        Translator.from_checkpoint(str(second), cpu, "ct2", str(model_dir))
    assert str(e.value) == (
        f"ct2_model={model_dir} was exported from another model (checkpoint {first}, step 7) than the "
        "checkpoint's; export this checkpoint again (scripts/export_ct2.py)"
    )
    meta = model_dir / "nmt_export.json"
    info = json.loads(meta.read_text())
    meta.write_text(json.dumps({key: value for key, value in info.items() if key != "weights_sha256"}))
    with pytest.raises(NMTError, match=r"records no model it was exported from \(an older export\)"):
        Translator.from_checkpoint(str(first), cpu, "ct2", str(model_dir))


def test_an_empty_source_with_a_prefix_is_continued_as_backend_torch_continues_it(spm_models, tmp_path):
    """CTranslate2 skips an empty input (even one of EOS alone) and returned the bare prefix as the only
    hypothesis; both backends continue the prefix, with as many hypotheses."""
    tokenizer = spm_models["joint"]
    model = random_model(TINY, tokenizer)
    backend = load_backend(
        "ct2",
        str(export_model(model, tokenizer, tmp_path / "m")),
        model,
        tokenizer,
        torch.device("cpu"),
        48,
        EN_DE,
    )
    prefix = tokenizer.encode_tgt(spm_models["text"][:1])[0][:3]
    sources = [[], tokenizer.encode_src(spm_models["text"][1:2])[0], []]
    prefixes = [prefix, prefix, []]
    cfg = DecodingConfig(beam_size=3, nbest=3, max_len_a=1.0, max_len_b=5)
    ours = translate_ids(model, sources, cfg, "cpu", TINY.max_positions, prefixes=prefixes)
    theirs = backend.translate_ids(sources, cfg, prefixes=prefixes)
    assert [len(h) for h in theirs] == [len(h) for h in ours] == [3, 3, 1]
    assert all(len(h.tokens) > len(prefix) and h.tokens[:3] == prefix for h in theirs[0])
    for mine, other in zip(ours[:2], theirs[:2]):
        assert [h.tokens for h in other] == [h.tokens for h in mine]
        assert [h.score for h in other] == pytest.approx([h.score for h in mine], abs=1e-3)
