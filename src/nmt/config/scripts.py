"""The schemas of the other scripts (evaluate, translate, serve, export, the benchmarks, ...), a block
each, after what several of them share: the decoding overrides, the checkpoint, the text to decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from nmt.config.knobs import (
    DEVICE,
    EACH_NON_NEGATIVE,
    EACH_POSITIVE,
    NON_NEGATIVE,
    POSITIVE,
    knob,
    overrides_of,
    section,
)
from nmt.config.train import PRECISIONS, DataConfig, DecodingConfig, TokenizerConfig
from nmt.errors import NMTError
from nmt.metrics import METRICS

# ------------------------------------------------- shared by the scripts that decode with a checkpoint


DecodingOverrides = overrides_of(
    DecodingConfig,
    "DecodingOverrides",
    "``decoding.*`` of evaluate, translate, serve and plot_attention: one field per DecodingConfig "
    "field; None keeps the checkpoint's (tuned) value.",
    module=__name__,
)


def checkpoint_paths(checkpoint: Any) -> list[str]:
    """``checkpoint=PATH`` or ``checkpoint=[A,B,...]`` (an ensemble of those models) as a list of paths."""
    paths = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
    if not paths or not all(isinstance(p, str) and p for p in paths):
        raise NMTError(f"checkpoint={checkpoint}: give a path or a list of paths [a.pt,b.pt]")
    return paths


@dataclass
class InferenceConfig:
    """What every script that translates with a checkpoint takes."""

    checkpoint: Any = knob(
        MISSING, help="a path, or a list of paths [a.pt,b.pt]: an ensemble (checkpoint_paths)"
    )
    decoding: DecodingOverrides = field(default_factory=DecodingOverrides)
    device: str = knob("auto", DEVICE, help="where it runs")
    backend: str = knob(
        "torch",
        choices=("torch", "ct2"),
        help="the decoder: our search, or CTranslate2 over the model exported to ct2_model",
    )
    ct2_model: str | None = knob(None, help="directory written by scripts/export_ct2.py from this checkpoint")
    ct2_inter_threads: int = knob(
        0,
        NON_NEGATIVE,
        help=(
            "backend=ct2: translations decoded at a time x threads each; 0 = auto (one one-thread "
            "translation per core torch may use, measured fastest: docs/ctranslate2.md)"
        ),
    )
    ct2_intra_threads: int = knob(0, NON_NEGATIVE)
    tgt_lang: str | None = knob(
        None,
        help=(
            "the language to translate into: required when the model has several (multilingual), its "
            "one else; another case or a three-letter code is mapped to the model's code"
        ),
    )
    src_lang: str | None = knob(
        None, help="the input's language, when the model has several: checks the direction was trained"
    )
    zero_shot: bool = knob(False, help="translate a direction the model never trained (src_lang -> tgt_lang)")
    alignment_layer: int | None = knob(
        None,
        help=(
            "the decoder layer whose cross-attention (mean of its heads) gives word alignments, from 0 "
            "(negative: from the last); null = the penultimate (a one-layer decoder's only one): "
            "docs/alignment.md"
        ),
    )


@dataclass
class TextPairConfig:
    """Sentence pairs from two line-aligned files, instead of a configured data split."""

    src: str | None = knob(None, help="the sources, a sentence per line")
    ref: str | None = knob(None, help="their translations (the references), line by line")


@dataclass
class EvalDataConfig:
    """Overrides of the data settings stored in the checkpoint."""

    split: str = "test"
    dir: str | None = knob(None, help="the local data folder, if it moved since training")
    cache_dir: str | None = None


@dataclass
class SplitConfig(InferenceConfig):
    """A checkpoint over an evaluation text: a data split, or eval.src with eval.ref (what score.py and
    the benchmarks that time decoders on a split take; evaluate.py's ``eval`` has more)."""

    data: EvalDataConfig = section(EvalDataConfig, help="a split and its references ...")
    eval: TextPairConfig = section(TextPairConfig, help="... or eval.src with eval.ref")


@dataclass
class DecodeScriptConfig(InferenceConfig):
    """What the scripts that decode many sentences take besides: evaluate.py and translate.py."""

    workers: int = knob(
        1,
        POSITIVE,
        help=(
            "backend=torch on a CPU: decode in this many single-threaded processes (each loads the "
            "model), faster than one process of as many threads (docs/speed.md); 1 = here, on torch's "
            "threads"
        ),
    )


# ----------------------------------------------------------------- evaluate.py, translate.py, score.py


@dataclass
class EvalFilesConfig(TextPairConfig):
    out: str | None = knob(None, help="hypotheses file; default: next to the report")
    metrics: list[str] = knob(["bleu", "chrf"], choices=tuple(METRICS), help="sacrebleu's metrics to report")
    tb_dir: str | None = knob(None, help="a run dir whose TensorBoard gets the scores")
    by_length: bool = knob(
        False, help="also score buckets of source length (subwords): 1-10, 11-20, 21-30, 31-50, 51+"
    )


@dataclass
class EvaluateConfig(DecodeScriptConfig):
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    eval: EvalFilesConfig = field(default_factory=EvalFilesConfig)
    prefix_file: str | None = knob(
        None, help="target prefixes, a line per source (empty = none): outputs start so"
    )
    alignments: bool = knob(
        False, help="also write each hypothesis' word alignment (Pharaoh i-j) to a .align file"
    )
    pivot: str | None = knob(
        None,
        help=(
            "a multilingual model: translate src_lang -> pivot, then pivot -> tgt_lang (two searches, "
            "both directions trained), e.g. to compare with zero_shot=true"
        ),
    )


@dataclass
class TranslateConfig(DecodeScriptConfig):
    input: str | None = knob(None, help="file; default stdin")
    output: str | None = knob(None, help="file; default stdout")
    batch_sentences: int = knob(64, help="input lines translated at a time (from a terminal: one)")
    prefix_file: str | None = knob(
        None, help="target prefixes, a line per input line (empty = none): outputs start so"
    )
    alignments: bool = knob(False, help="after each translation, a tab and its word alignment (Pharaoh i-j)")


@dataclass
class ScoreConfig(SplitConfig):
    """scripts/score.py: the model's log-probability of given translations of given sources."""

    format: str = knob(
        "tsv",
        choices=("tsv", "json"),
        help='"tsv": log_prob, score, tokens (a line per pair) | "json": an object per line',
    )
    per_token: bool = knob(False, help="also each subword's log-probability (EOS last)")
    alignments: bool = knob(False, help="also each pair's word alignment (Pharaoh i-j)")
    output: str | None = knob(None, help="file; default stdout")


# -------------------------------------------------------------------------------------------- serve.py


def valid_host_pattern(pattern: Any) -> bool:
    """A Host pattern as Starlette's TrustedHostMiddleware matches it: a name or address (IPv6 in
    brackets), ``*.domain`` or ``*``; never a port, which the Host header's match leaves out."""
    if not isinstance(pattern, str) or not pattern or pattern != pattern.strip() or "*" in pattern[1:]:
        return False
    if ":" in pattern and not (pattern.startswith("[") and pattern.endswith("]")):
        return False
    return pattern == "*" or not pattern.startswith("*") or pattern.startswith("*.")


@dataclass
class ServerLimits:
    """What one request may ask and cost, how requests are batched and who decodes them (``serve.*`` of
    scripts/serve.py). Each limit is checked before the work or the memory it bounds."""

    max_body_kb: int = knob(
        256, POSITIVE, help="request body in KiB: 413 from its Content-Length or once read past it"
    )
    max_sentences: int = knob(64, POSITIVE, help="sentences in one request")
    max_chars: int = knob(20_000, POSITIVE, help="characters in one request, over its sentences")
    max_beam_size: int = knob(16, POSITIVE, help="the largest beam_size a request may ask for")
    max_output_tokens: int = knob(
        256,
        POSITIVE,
        help=(
            "target subwords one sentence may get: a request whose max_len_a/max_len_b allow more gets 422"
        ),
    )
    max_response_mb: float = knob(
        4.0, POSITIVE, help="the answer's size; attention that could exceed it is refused (422)"
    )
    max_score_mb: float = knob(
        256.0,
        POSITIVE,
        help=(
            "/score's log-probabilities at once (tokens x target vocabulary x 8 bytes): its batches are "
            "cut to fit"
        ),
    )
    max_search_mb: float = knob(
        512.0,
        POSITIVE,
        help=(
            "/translate's search state at once (a Transformer's key/value caches: beam_size hypotheses "
            "over the longest output allowed, per sentence): batches are cut to fit; a sentence over it "
            "alone gets 422"
        ),
    )
    timeout_s: float = knob(
        30.0,
        POSITIVE,
        help=(
            "per request, its body (408 when not all sent by then) and waiting included: 504; a decode "
            "past it stops"
        ),
    )
    max_tokens: int = knob(4096, POSITIVE, help="source subwords decoded together, over the requests batched")
    queue_size: int = knob(
        64, POSITIVE, help="requests waiting to be decoded; beyond that: 503 with Retry-After"
    )
    retry_after_s: int = knob(1, POSITIVE)
    workers: int = knob(
        0, NON_NEGATIVE, help="decoding processes; 0 = one per CPU core the server may use (1 on a GPU)"
    )
    threads: int = knob(1, POSITIVE, help="intra-op threads of each worker process")
    max_connections: int = knob(
        128,
        POSITIVE,
        help=(
            "open connections (a new one included) and requests at once (uvicorn's limit_concurrency): "
            "beyond, 503"
        ),
    )
    allowed_hosts: list[str] = knob(
        [],
        (
            lambda hosts: all(valid_host_pattern(h) for h in hosts),
            "must be host names without ports: 'example.com', '*.example.com' or '*' (any)",
        ),
        help=(
            'Host headers answered (others: 400), against DNS rebinding: names ("example.com"), '
            '"*.example.com", or "*" (any: behind a proxy that checks Host); [] = the bound host= and '
            "localhost names"
        ),
    )


@dataclass
class ServeConfig(InferenceConfig):
    """scripts/serve.py: the HTTP translation service and its page."""

    host: str = knob(
        "127.0.0.1",
        (lambda v: bool(v.strip()), "must name an address: 127.0.0.1 (this machine) or 0.0.0.0 (every one)"),
        help="loopback only by default; 0.0.0.0 to serve other machines",
    )
    port: int = knob(8000, (lambda v: 0 <= v < 65536, "must be a TCP port (0 = any free one)"))
    serve: ServerLimits = field(default_factory=ServerLimits)


# ------------------------------------------------------------------------- export_ct2.py, export_hf.py


# How scripts/export_ct2.py stores the weights (quantization=, bench.ct2_quantizations): nmt.ct2.export
CT2_QUANTIZATIONS = (
    "none",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)


@dataclass
class ExportCT2Config:
    """scripts/export_ct2.py: a Transformer checkpoint as a CTranslate2 model directory."""

    checkpoint: str = MISSING
    output: str = knob(MISSING, help="the model directory to write")
    quantization: str = knob(
        "none",
        choices=CT2_QUANTIZATIONS,
        help="how the weights are stored (none: fp32); CTranslate2 computes in a type the device supports",
    )
    force: bool = knob(
        False, help="replace an earlier export at output (never another directory: nmt.outputs)"
    )
    shortlist: str | None = knob(
        None,
        help=(
            "a shortlist file (scripts/build_shortlist.py) written as CTranslate2's vocabulary map, used "
            "by backend=ct2 with decoding.shortlist set to the same file"
        ),
    )


# What scripts/export_hf.py translates with both models after writing, unless check.src is given:
# Multi30k-like English (the presets translate en->de); another source language needs its own sentences.
HF_CHECK_TEXT = [
    "A man in a blue shirt is standing on a ladder.",
    "Two young children are playing in the sand near the water.",
    "A group of people are sitting at a table outside a restaurant.",
    "A dog runs through the snow.",
]


@dataclass
class HFCheckConfig:
    """``check.*`` of scripts/export_hf.py: the exported folder, loaded by transformers, against the model."""

    text: list[str] = knob(list(HF_CHECK_TEXT), help="source sentences, when no src")
    src: str | None = knob(
        None, help="a file of source sentences (a line each) instead of text, e.g. a test set"
    )
    ref: str | None = knob(None, help="its references: BLEU and chrF of both greedy outputs (needs src)")
    tolerance: float = knob(
        1e-4, help="the largest |logit difference| accepted (fp32); above it the export fails"
    )
    batch_sentences: int = knob(64, help="sentences per forward pass and per generate call")


@dataclass
class ExportHFConfig:
    """scripts/export_hf.py: a Transformer checkpoint as a folder that Hugging Face transformers loads."""

    checkpoint: str = MISSING
    output: str = knob(
        MISSING, help="the folder to write (config.json, model.safetensors, tokenizer files, README.md)"
    )
    force: bool = knob(
        False, help="replace a non-empty output, which must be an earlier export (nmt_export.json)"
    )
    check: HFCheckConfig = field(default_factory=HFCheckConfig)


# -------------------------------------------------------------------------------------- the benchmarks


@dataclass
class BenchConfig:
    """What scripts/benchmark.py measures and how long (see nmt.benchmark)."""

    train: bool = knob(True, help="training throughput of the project's train_step")
    reference: bool = knob(
        True, help="... and of a plain torch.nn.Transformer step on the same batches (A B A B)"
    )
    decode: bool = knob(True, help="greedy and beam search, cached and uncached")
    warmup_steps: int = knob(
        5, NON_NEGATIVE, help="training steps run before measuring (allocator, autotuning, compile)"
    )
    steps: int = knob(20, POSITIVE, help="measured training steps per model; medians are reported")
    profile_steps: int = knob(
        0,
        NON_NEGATIVE,
        help="then profile this many of the project's steps (torch.profiler): its time by operator group",
    )
    precisions: list[str] = knob(
        [], choices=PRECISIONS, help="also time these, e.g. [fp32,bf16], same batches"
    )
    decode_sentences: int = knob(1000, help="test sentences decoded per setting; 0 = the whole test split")
    beam_size: int = knob(5, help="the beam of the beam-search measurements (greedy is always measured too)")
    checkpoint: str | None = knob(
        None, help="trained model for decoding; None = the randomly initialised one"
    )
    random_len_a: float = knob(
        1.0, help="a random model never emits EOS: its outputs get a * src_len + b tokens,"
    )
    random_len_b: int = knob(
        0, help="about the length of real translations (Multi30k: 14.3 vs 14.2 subwords)"
    )
    matmul_size: int = knob(2048, help="n of the n x n x n matmul that measures the device's ceiling")
    output: str = knob("bench.json", help="written into the run dir")
    ct2: bool = knob(
        False, help="also decode with CTranslate2 (the same model exported) and report the speed ratio"
    )
    ct2_quantizations: list[str] = knob(
        ["none"], choices=CT2_QUANTIZATIONS, help="one export each: [none,int8]"
    )


@dataclass
class ServeBenchConfig(SplitConfig):
    """scripts/benchmark_server.py: requests/s and latency of the service on a split's sentences."""

    clients: list[int] = knob([1, 8, 32], help="concurrent clients")
    sentences: list[int] = knob([1, 16], help="per request; each with each client count")
    requests: int = knob(200, help="requests per measurement")
    serve: ServerLimits = section(ServerLimits, help="the server's (scripts/serve.py) serve.*")
    output: str = "serve_bench.json"


@dataclass
class CT2SpeedConfig(SplitConfig):
    """scripts/benchmark_ct2.py: backend=ct2 against CTranslate2 called directly, per thread layout, on a
    split's sentences (docs/ctranslate2.md)."""

    sentences: int = knob(0, help="the split's first sentences; 0 = all")
    layouts: list[str] = knob(["1x2", "2x1", "1x1"], help="inter x intra threads")
    repeats: int = knob(5, POSITIVE, help="each layout and variant, taking turns")
    output: str = "ct2_speed.json"


@dataclass
class PrepareSpeedConfig:
    """scripts/benchmark_prepare.py: corpora of N unique pairs drawn from local parallel text (each drawn
    pair tagged with its number on both sides), prepared from scratch, timed and measured (docs/speed.md)."""

    dir: str = knob(
        "../shared/data/wmt14-de-en", help="the pairs are drawn from {dir}/{prefix}.{lang}; valid/test copied"
    )
    prefixes: list[str] = field(default_factory=lambda: ["train", "extra-newstest2008-2012"])
    src_lang: str = "en"
    tgt_lang: str = "de"
    sizes: list[int] = knob([100_000, 400_000, 1_600_000, 4_500_000], help="pairs")
    seed: int = knob(1, help="of the draw")
    workers: int = knob(0, NON_NEGATIVE, help="data.workers of the preparation; 0 = one per CPU core")
    tokenizer: TokenizerConfig = field(
        default_factory=lambda: TokenizerConfig(vocab_size=32_000, input_sentence_size=2_000_000)
    )
    workdir: str = knob(
        "outputs/benchmark_prepare/corpora", help="the corpora and their caches (GBs at 4.5M pairs)"
    )
    keep: bool = knob(False, help="keep each corpus and cache after it is measured")
    datasets_reference: bool = knob(
        False,
        help=(
            "also encode the prepared text with Hugging Face datasets (map(batched=True, "
            "num_proc=workers)) into its Arrow cache, with the same tokenizer: the library's way of doing"
            " the same work, timed beside ours"
        ),
    )
    output: str = "prepare_speed.json"


@dataclass
class DecodersSpeedConfig(SplitConfig):
    """scripts/benchmark_decoders.py: PyTorch and CTranslate2, each at its best configuration for the
    cores, side by side on a split's sentences (docs/speed.md)."""

    sentences: int = knob(0, help="the split's first sentences; 0 = all")
    repeats: int = knob(3, POSITIVE, help="every row, taking turns")
    torch_threads: list[int] = knob([1, 2], EACH_POSITIVE, help="PyTorch rows: intra-op threads")
    torch_processes: int = knob(2, help="a PyTorch row of this many single-threaded processes; < 2 = none")
    ct2_layouts: list[str] = knob(["1x2", "2x1", "1x1"], help="CTranslate2 direct")
    shortlist: str | None = knob(None, help="a shortlist file: the PyTorch rows again with it")
    ct2_vmap_model: str | None = knob(
        None, help="the model exported with shortlist=: a backend=ct2 row with its map"
    )
    output: str = "decoders_speed.json"


# ----------------------------------------------------------------------------------- the other scripts


@dataclass
class AverageConfig:
    run_dir: str | None = knob(None, help="average the newest `last` step_N.pt of this run ...")
    last: int = knob(5, POSITIVE)
    window: float = knob(0.0, help="> 0: only step_N.pt from the last `window` share of the run's steps")
    inputs: list[str] = knob([], help="... or exactly these checkpoints")
    output: str | None = knob(None, help="default: {run_dir}/checkpoints/averaged.pt")


@dataclass
class PipelineConfig:
    """scripts/pipeline.py's steps after training (the rest of its config is scripts/train.py's)."""

    average_last: int = knob(5, NON_NEGATIVE, help="newest step_N.pt averaged into averaged.pt; 0 = none")
    alphas: list[float] = knob(
        [], EACH_NON_NEGATIVE, help="length penalties tried on valid; [] = final.alphas"
    )
    test: bool = knob(
        True, help="evaluate the chosen final.pt on the test split (eval/, and the run's TensorBoard)"
    )


@dataclass
class SweepSummaryConfig:
    """scripts/sweep_summary.py: the jobs of a sweep as a table and a CSV file."""

    dir: str = knob(MISSING, help="the sweep's folder (hydra.sweep.dir), e.g. outputs/multirun/DATE/TIME")
    csv: str | None = knob(None, help="default: sweep_summary.csv in the sweep's folder")


@dataclass
class SelectConfig:
    """scripts/select_final.py: choose the final model of a run on the validation set, never on test."""

    run_dir: str = MISSING
    candidates: list[str] = knob(["best.pt", "averaged.pt"], help="in checkpoints/")
    alphas: list[float] = knob(
        [], EACH_NON_NEGATIVE, help="length penalties to try; [] = the run's final.alphas"
    )
    split: str = "valid"
    output: str = knob("final.pt", help="written into checkpoints/")
    device: str = knob("auto", DEVICE)


@dataclass
class PlotAttentionConfig:
    checkpoint: str = MISSING
    text: str = MISSING
    output: str | None = knob(
        None,
        help="default: eval/<checkpoint>.attention-<hash of text and settings>.png in the checkpoint's run",
    )
    layer: int = knob(-1, help="decoder layer (Transformer); -1 = last")
    heads: str = knob(
        "mean", choices=("mean", "all"), help='"mean" (one panel) or "all" (one panel per head)'
    )
    decoding: DecodingOverrides = field(default_factory=DecodingOverrides)
    device: str = knob("auto", DEVICE, help="the PyTorch model's attention is plotted: no backend choice")


@dataclass
class CompareAlignmentsConfig:
    """scripts/compare_alignments.py: how well each decoder layer's attention, read each way, agrees with
    reference word alignments of the same sentence pairs."""

    checkpoint: str = MISSING
    reference: str = knob(
        MISSING, help="Pharaoh links (i-j), a line per pair: a gold set, or an aligner's (eflomal)"
    )
    reference_reverse: str | None = knob(
        None, help="the other direction: the reference is grow-diag-final-and of both"
    )
    data: EvalDataConfig = section(EvalDataConfig, help="a split and its references ...")
    eval: TextPairConfig = section(TextPairConfig, help="... or eval.src with eval.ref")
    device: str = knob("auto", DEVICE)
    max_tokens: int = knob(8000, help="source plus target subwords per batch")


@dataclass
class PlotCurvesConfig:
    runs: list[str] = knob([], help="run dirs")
    labels: list[str] = knob([], help="one legend label per run (default: the dir name)")
    output: str | None = knob(None, help="default: curves.png in the first run's dir")
    dpi: int = 110


@dataclass
class DistillCorpusConfig:
    """``distill.*`` of scripts/distill.py: what the distilled corpus holds and how it is made."""

    keep_original: bool = knob(False, help="the original training pairs too, beside the distilled ones")
    chunk_sentences: int = knob(
        1000,
        POSITIVE,
        help=(
            "sources translated and written at once; an interrupted run resumes at the first chunk not "
            "written"
        ),
    )


@dataclass
class DistillConfig:
    """scripts/distill.py: a teacher (or an ensemble) translates a training split with beam search."""

    teacher: Any = knob(MISSING, help="a checkpoint path, or a list of paths [a.pt,b.pt]: an ensemble")
    data: DataConfig | None = knob(
        None, help="whose training sources are translated; None = the teacher's data"
    )
    decoding: DecodingOverrides = section(DecodingOverrides, help="None: the teacher's (tuned)")
    device: str = knob("auto", DEVICE)
    backend: str = knob(
        "torch",
        choices=("torch", "ct2"),
        help="the decoder: our search, or CTranslate2 over the teacher exported to ct2_model",
    )
    ct2_model: str | None = None
    distill: DistillCorpusConfig = field(default_factory=DistillCorpusConfig)


@dataclass
class ShortlistConfig:
    """scripts/build_shortlist.py: the target subwords worth scoring for each source subword."""

    checkpoint: str = knob(MISSING, help="the model whose tokenizer the shortlist is for; written beside it")
    data: DataConfig | None = knob(
        None, help="whose training split the statistics come from; None = the model's"
    )
    k: int = knob(
        10,
        NON_NEGATIVE,
        help="likeliest target subwords per source subword beyond the frequent ones (docs/decoding.md)",
    )
    frequent: int = knob(100, NON_NEGATIVE, help="most frequent target subwords, always candidates")
    output: str | None = knob(None, help="default: shortlist.k{k}.n{frequent}.json beside the checkpoint")


def data_or_model_data(data: DataConfig | None, model_data: DataConfig) -> DataConfig:
    """``data=...`` of distill and build_shortlist if given (it must be in the model's direction), else the
    data the model was trained on."""
    if data is None:
        return model_data
    if (data.src_lang, data.tgt_lang) != (model_data.src_lang, model_data.tgt_lang):
        raise NMTError(
            f"data.src_lang={data.src_lang} data.tgt_lang={data.tgt_lang}: the model translates "
            f"{model_data.src_lang} -> {model_data.tgt_lang}; set data.src_lang and data.tgt_lang to match"
        )
    return data
