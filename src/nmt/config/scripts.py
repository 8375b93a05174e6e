"""The schemas of the other scripts (evaluate, translate, serve, export, the benchmarks, ...), a block
each, after what several of them share: the decoding overrides, the checkpoint, the text to decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from nmt.config.knobs import NON_NEGATIVE, POSITIVE, knob, overrides_of
from nmt.config.train import PRECISIONS, DataConfig, DecodingConfig, TokenizerConfig
from nmt.errors import NMTError

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

    checkpoint: Any = MISSING  # a path, or a list of paths [a.pt,b.pt]: an ensemble (checkpoint_paths)
    decoding: DecodingOverrides = field(default_factory=DecodingOverrides)
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:1" ...
    # "torch" | "ct2" (CTranslate2, the model exported to ct2_model)
    backend: str = knob("torch", choices=("torch", "ct2"))
    ct2_model: str | None = None  # directory written by scripts/export_ct2.py from this checkpoint
    # backend=ct2: translations decoded at a time x threads each; 0 = auto (one one-thread translation
    # per core torch may use, measured fastest: docs/ctranslate2.md)
    ct2_inter_threads: int = 0
    ct2_intra_threads: int = 0
    # the decoder layer whose cross-attention (mean of its heads) gives word alignments, from 0 (negative:
    # from the last); null = the penultimate (a one-layer decoder's only one): docs/alignment.md
    alignment_layer: int | None = None


@dataclass
class TextPairConfig:
    """Sentence pairs from two line-aligned files, instead of a configured data split."""

    src: str | None = None  # the sources, a sentence per line
    ref: str | None = None  # their translations (the references), line by line


@dataclass
class EvalDataConfig:
    """Overrides of the data settings stored in the checkpoint."""

    split: str = "test"
    dir: str | None = None  # the local data folder, if it moved since training
    cache_dir: str | None = None


@dataclass
class SplitConfig(InferenceConfig):
    """A checkpoint over an evaluation text: a data split, or eval.src with eval.ref (what score.py and
    the benchmarks that time decoders on a split take; evaluate.py's ``eval`` has more)."""

    data: EvalDataConfig = field(default_factory=EvalDataConfig)  # a split and its references ...
    eval: TextPairConfig = field(default_factory=TextPairConfig)  # ... or eval.src with eval.ref


@dataclass
class DecodeScriptConfig(InferenceConfig):
    """What the scripts that decode many sentences take besides: evaluate.py and translate.py."""

    # backend=torch on a CPU: decode in this many single-threaded processes (each loads the model),
    # faster than one process of as many threads (docs/speed.md); 1 = here, on torch's threads
    workers: int = 1


# ----------------------------------------------------------------- evaluate.py, translate.py, score.py


@dataclass
class EvalFilesConfig(TextPairConfig):
    out: str | None = None  # hypotheses file; default: next to the report
    metrics: list[str] = knob(["bleu", "chrf"], choices=("bleu", "chrf", "ter"))  # add "ter" for TER
    tb_dir: str | None = None  # a run dir whose TensorBoard gets the scores
    by_length: bool = False  # also score buckets of source length (subwords): 1-10, 11-20, 21-30, 31-50, 51+


@dataclass
class EvaluateConfig(DecodeScriptConfig):
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    eval: EvalFilesConfig = field(default_factory=EvalFilesConfig)
    prefix_file: str | None = None  # target prefixes, a line per source (empty = none): outputs start so
    alignments: bool = False  # also write each hypothesis' word alignment (Pharaoh i-j) to a .align file


@dataclass
class TranslateConfig(DecodeScriptConfig):
    input: str | None = None  # file; default stdin
    output: str | None = None  # file; default stdout
    batch_sentences: int = 64  # input lines translated at a time (from a terminal: one)
    prefix_file: str | None = None  # target prefixes, a line per input line (empty = none): outputs start so
    alignments: bool = False  # after each translation, a tab and its word alignment (Pharaoh i-j)


@dataclass
class ScoreConfig(SplitConfig):
    """scripts/score.py: the model's log-probability of given translations of given sources."""

    # "tsv": log_prob, score, tokens (a line per pair) | "json": an object per line
    format: str = knob("tsv", choices=("tsv", "json"))
    per_token: bool = False  # also each subword's log-probability (EOS last)
    alignments: bool = False  # also each pair's word alignment (Pharaoh i-j)
    output: str | None = None  # file; default stdout


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

    # request body in KiB: 413 from its Content-Length or once read past it
    max_body_kb: int = knob(256, POSITIVE)
    max_sentences: int = knob(64, POSITIVE)  # sentences in one request
    max_chars: int = knob(20_000, POSITIVE)  # characters in one request, over its sentences
    max_beam_size: int = knob(16, POSITIVE)  # the largest beam_size a request may ask for
    # target subwords one sentence may get: a request whose max_len_a/max_len_b allow more gets 422
    max_output_tokens: int = knob(256, POSITIVE)
    # the answer's size; attention that could exceed it is refused (422)
    max_response_mb: float = knob(4.0, POSITIVE)
    # /score's log-probabilities at once (tokens x target vocabulary x 8 bytes): its batches are cut to fit
    max_score_mb: float = knob(256.0, POSITIVE)
    # /translate's search state at once (a Transformer's key/value caches: beam_size hypotheses over the
    # longest output allowed, per sentence): batches are cut to fit; a sentence over it alone gets 422
    max_search_mb: float = knob(512.0, POSITIVE)
    # per request, its body (408 when not all sent by then) and waiting included: 504; a decode past it stops
    timeout_s: float = knob(30.0, POSITIVE)
    max_tokens: int = knob(4096, POSITIVE)  # source subwords decoded together, over the requests batched
    queue_size: int = knob(64, POSITIVE)  # requests waiting to be decoded; beyond that: 503 with Retry-After
    retry_after_s: int = knob(1, POSITIVE)
    # decoding processes; 0 = one per CPU core the server may use (1 on a GPU)
    workers: int = knob(0, NON_NEGATIVE)
    threads: int = knob(1, POSITIVE)  # intra-op threads of each worker process
    # open connections (a new one included) and requests at once (uvicorn's limit_concurrency): beyond, 503
    max_connections: int = knob(128, POSITIVE)
    # Host headers answered (others: 400), against DNS rebinding: names ("example.com"), "*.example.com",
    # or "*" (any: behind a proxy that checks Host); [] = the bound host= and localhost names
    allowed_hosts: list[str] = knob(
        [],
        (
            lambda hosts: all(valid_host_pattern(h) for h in hosts),
            "must be host names without ports: 'example.com', '*.example.com' or '*' (any)",
        ),
    )


@dataclass
class ServeConfig(InferenceConfig):
    """scripts/serve.py: the HTTP translation service and its page."""

    host: str = "127.0.0.1"  # loopback only by default; 0.0.0.0 to serve other machines
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
    output: str = MISSING  # the model directory to write
    # how the weights are stored: none (fp32) | int8 | int8_float32 | int8_float16 | int8_bfloat16 | int16
    # | float16 | bfloat16; CTranslate2 computes in a type the device supports
    quantization: str = knob("none", choices=CT2_QUANTIZATIONS)
    force: bool = False  # replace an earlier export at output (never another directory: nmt.outputs)
    # a shortlist file (scripts/build_shortlist.py) written as CTranslate2's vocabulary map, used by
    # backend=ct2 with decoding.shortlist set to the same file
    shortlist: str | None = None


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

    text: list[str] = field(default_factory=lambda: list(HF_CHECK_TEXT))  # source sentences, when no src
    src: str | None = None  # a file of source sentences (a line each) instead of text, e.g. a test set
    ref: str | None = None  # its references: BLEU and chrF of both greedy outputs (needs src)
    tolerance: float = 1e-4  # the largest |logit difference| accepted (fp32); above it the export fails
    batch_sentences: int = 64  # sentences per forward pass and per generate call


@dataclass
class ExportHFConfig:
    """scripts/export_hf.py: a Transformer checkpoint as a folder that Hugging Face transformers loads."""

    checkpoint: str = MISSING
    output: str = MISSING  # the folder to write (config.json, model.safetensors, tokenizer files, README.md)
    force: bool = False  # replace a non-empty output, which must be an earlier export (nmt_export.json)
    check: HFCheckConfig = field(default_factory=HFCheckConfig)


# -------------------------------------------------------------------------------------- the benchmarks


@dataclass
class BenchConfig:
    """What scripts/benchmark.py measures and how long (see nmt.benchmark)."""

    train: bool = True  # training throughput of the project's train_step
    reference: bool = True  # ... and of a plain torch.nn.Transformer step on the same batches (A B A B)
    decode: bool = True  # greedy and beam search, cached and uncached
    warmup_steps: int = 5  # training steps run before measuring (allocator, autotuning, compile)
    steps: int = 20  # measured training steps per model; medians are reported
    precisions: list[str] = knob([], choices=PRECISIONS)  # also time these, e.g. [fp32,bf16], same batches
    decode_sentences: int = 1000  # test sentences decoded per setting; 0 = the whole test split
    beam_size: int = 5  # the beam of the beam-search measurements (greedy is always measured too)
    checkpoint: str | None = None  # trained model for decoding; None = the randomly initialised one
    random_len_a: float = 1.0  # a random model never emits EOS: its outputs get a * src_len + b tokens,
    random_len_b: int = 0  # about the length of real translations (Multi30k: 14.3 vs 14.2 subwords)
    matmul_size: int = 2048  # n of the n x n x n matmul that measures the device's ceiling
    output: str = "bench.json"  # written into the run dir
    ct2: bool = False  # also decode with CTranslate2 (the same model exported) and report the speed ratio
    ct2_quantizations: list[str] = knob(["none"], choices=CT2_QUANTIZATIONS)  # one export each: [none,int8]


@dataclass
class ServeBenchConfig(SplitConfig):
    """scripts/benchmark_server.py: requests/s and latency of the service on a split's sentences."""

    clients: list[int] = field(default_factory=lambda: [1, 8, 32])  # concurrent clients
    sentences: list[int] = field(default_factory=lambda: [1, 16])  # per request; each with each client count
    requests: int = 200  # requests per measurement
    serve: ServerLimits = field(default_factory=ServerLimits)  # the server's (scripts/serve.py) serve.*
    output: str = "serve_bench.json"


@dataclass
class CT2SpeedConfig(SplitConfig):
    """scripts/benchmark_ct2.py: backend=ct2 against CTranslate2 called directly, per thread layout, on a
    split's sentences (docs/ctranslate2.md)."""

    sentences: int = 0  # the split's first sentences; 0 = all
    layouts: list[str] = field(default_factory=lambda: ["1x2", "2x1", "1x1"])  # inter x intra threads
    repeats: int = 5  # each layout and variant, taking turns
    output: str = "ct2_speed.json"


@dataclass
class PrepareSpeedConfig:
    """scripts/benchmark_prepare.py: corpora of N unique pairs drawn from local parallel text (each drawn
    pair tagged with its number on both sides), prepared from scratch, timed and measured (docs/speed.md)."""

    dir: str = (
        "../shared/data/wmt14-de-en"  # the pairs are drawn from {dir}/{prefix}.{lang}; valid/test copied
    )
    prefixes: list[str] = field(default_factory=lambda: ["train", "extra-newstest2008-2012"])
    src_lang: str = "en"
    tgt_lang: str = "de"
    sizes: list[int] = field(default_factory=lambda: [100_000, 400_000, 1_600_000, 4_500_000])  # pairs
    seed: int = 1  # of the draw
    workers: int = knob(0, NON_NEGATIVE)  # data.workers of the preparation; 0 = one per CPU core
    tokenizer: TokenizerConfig = field(
        default_factory=lambda: TokenizerConfig(vocab_size=32_000, input_sentence_size=2_000_000)
    )
    workdir: str = "outputs/benchmark_prepare/corpora"  # the corpora and their caches (GBs at 4.5M pairs)
    keep: bool = False  # keep each corpus and cache after it is measured
    # also encode the prepared text with Hugging Face datasets (map(batched=True, num_proc=workers)) into
    # its Arrow cache, with the same tokenizer: the library's way of doing the same work, timed beside ours
    datasets_reference: bool = False
    output: str = "prepare_speed.json"


@dataclass
class DecodersSpeedConfig(SplitConfig):
    """scripts/benchmark_decoders.py: PyTorch and CTranslate2, each at its best configuration for the
    cores, side by side on a split's sentences (docs/speed.md)."""

    sentences: int = 0  # the split's first sentences; 0 = all
    repeats: int = 3  # every row, taking turns
    torch_threads: list[int] = field(default_factory=lambda: [1, 2])  # PyTorch rows: intra-op threads
    torch_processes: int = 2  # a PyTorch row of this many single-threaded processes; < 2 = none
    ct2_layouts: list[str] = field(default_factory=lambda: ["1x2", "2x1", "1x1"])  # CTranslate2 direct
    shortlist: str | None = None  # a shortlist file: the PyTorch rows again with it
    ct2_vmap_model: str | None = None  # the model exported with shortlist=: a backend=ct2 row with its map
    output: str = "decoders_speed.json"


# ----------------------------------------------------------------------------------- the other scripts


@dataclass
class AverageConfig:
    run_dir: str | None = None  # average the newest `last` step_N.pt of this run ...
    last: int = 5
    window: float = 0.0  # > 0: only step_N.pt from the last `window` share of the run's steps
    inputs: list[str] = field(default_factory=list)  # ... or exactly these checkpoints
    output: str | None = None  # default: {run_dir}/checkpoints/averaged.pt


@dataclass
class PipelineConfig:
    """scripts/pipeline.py's steps after training (the rest of its config is scripts/train.py's)."""

    average_last: int = knob(5, NON_NEGATIVE)  # newest step_N.pt averaged into averaged.pt; 0 = none
    alphas: list[float] = field(default_factory=list)  # length penalties tried on valid; [] = final.alphas
    test: bool = True  # evaluate the chosen final.pt on the test split (eval/, and the run's TensorBoard)


@dataclass
class SweepSummaryConfig:
    """scripts/sweep_summary.py: the jobs of a sweep as a table and a CSV file."""

    dir: str = MISSING  # the sweep's folder (hydra.sweep.dir), e.g. outputs/multirun/DATE/TIME
    csv: str | None = None  # default: sweep_summary.csv in the sweep's folder


@dataclass
class SelectConfig:
    """scripts/select_final.py: choose the final model of a run on the validation set, never on test."""

    run_dir: str = MISSING
    candidates: list[str] = field(default_factory=lambda: ["best.pt", "averaged.pt"])  # in checkpoints/
    alphas: list[float] = field(default_factory=list)  # length penalties to try; [] = the run's final.alphas
    split: str = "valid"
    output: str = "final.pt"  # written into checkpoints/
    device: str = "auto"


@dataclass
class PlotAttentionConfig:
    checkpoint: str = MISSING
    text: str = MISSING
    # default: eval/<checkpoint>.attention-<hash of text and settings>.png in the checkpoint's run
    output: str | None = None
    layer: int = -1  # decoder layer (Transformer); -1 = last
    heads: str = knob("mean", choices=("mean", "all"))  # "mean" (one panel) or "all" (one panel per head)
    decoding: DecodingOverrides = field(default_factory=DecodingOverrides)
    device: str = "auto"  # the PyTorch model's attention is plotted: no backend choice


@dataclass
class CompareAlignmentsConfig:
    """scripts/compare_alignments.py: how well each decoder layer's attention, read each way, agrees with
    reference word alignments of the same sentence pairs."""

    checkpoint: str = MISSING
    reference: str = MISSING  # Pharaoh links (i-j), a line per pair: a gold set, or an aligner's (eflomal)
    reference_reverse: str | None = None  # the other direction: the reference is grow-diag-final-and of both
    data: EvalDataConfig = field(default_factory=EvalDataConfig)  # a split and its references ...
    eval: TextPairConfig = field(default_factory=TextPairConfig)  # ... or eval.src with eval.ref
    device: str = "auto"
    max_tokens: int = 8000  # source plus target subwords per batch


@dataclass
class PlotCurvesConfig:
    runs: list[str] = field(default_factory=list)  # run dirs
    labels: list[str] = field(default_factory=list)  # one legend label per run (default: the dir name)
    output: str | None = None  # default: curves.png in the first run's dir
    dpi: int = 110


@dataclass
class DistillCorpusConfig:
    """``distill.*`` of scripts/distill.py: what the distilled corpus holds and how it is made."""

    keep_original: bool = False  # the original training pairs too, beside the distilled ones
    # sources translated and written at once; an interrupted run resumes at the first chunk not written
    chunk_sentences: int = knob(1000, POSITIVE)


@dataclass
class DistillConfig:
    """scripts/distill.py: a teacher (or an ensemble) translates a training split with beam search."""

    teacher: Any = MISSING  # a checkpoint path, or a list of paths [a.pt,b.pt]: an ensemble
    data: DataConfig | None = None  # whose training sources are translated; None = the teacher's data
    decoding: DecodingOverrides = field(default_factory=DecodingOverrides)  # None: the teacher's (tuned)
    device: str = "auto"
    # "torch" | "ct2" (CTranslate2, the teacher exported to ct2_model)
    backend: str = knob("torch", choices=("torch", "ct2"))
    ct2_model: str | None = None
    distill: DistillCorpusConfig = field(default_factory=DistillCorpusConfig)


@dataclass
class ShortlistConfig:
    """scripts/build_shortlist.py: the target subwords worth scoring for each source subword."""

    checkpoint: str = MISSING  # the model whose tokenizer the shortlist is for; written beside it
    data: DataConfig | None = None  # whose training split the statistics come from; None = the model's
    k: int = 10  # likeliest target subwords per source subword beyond the frequent ones (docs/decoding.md)
    frequent: int = 100  # most frequent target subwords, always candidates
    output: str | None = None  # default: shortlist.k{k}.n{frequent}.json beside the checkpoint


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
