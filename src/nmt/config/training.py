"""Structured configs: every knob of the toolkit, typed, registered in Hydra's ConfigStore.

The YAML files under ``configs/`` only pick values; the schema lives here, so a typo'd key or a
wrongly typed value in an override fails when Hydra composes the config, before any work starts.
Each config group option (``data/local.yaml``, ``model/rnnsearch.yaml``, ...) starts from one of the
schemas stored below (``defaults: [local_schema]``), so the subclass decides which keys exist.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import io
import os
import textwrap
import tokenize
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from nmt.errors import NMTError

# --------------------------------------------------------------------------------------- value rules
# Values the type system lets through but that cannot work, checked before any data or model is made
# (check_values): a test of the value and what it must be, for the error message.
Rule = tuple[Callable[[Any], bool], str]
POSITIVE: Rule = (lambda v: v > 0, "must be > 0")
NON_NEGATIVE: Rule = (lambda v: v >= 0, "must be >= 0")
PROBABILITY: Rule = (lambda v: 0 <= v < 1, "must be in [0, 1)")
SHARE: Rule = (lambda v: 0 < v <= 1, "must be in (0, 1]")


def one_of(choices: tuple[str, ...]) -> str:
    """What a setting with these choices must be, in the refusal's words."""
    return f"must be one of {', '.join(choices)}"


def knob(
    default: Any = MISSING,
    rule: Rule | None = None,
    choices: tuple[str, ...] | None = None,
    speed_only: bool = False,
) -> Any:
    """A setting that declares what it accepts: its default (a list is copied for each config), the rule
    its values follow or the choices it takes (the names its implementation's registry is keyed by; a
    list's items each), checked at start by check_values; and, for a decoding option, whether it changes
    only the speed, never the translation (the service keeps such options to itself). Its description
    is its comment."""
    if choices is not None and isinstance(default, list):
        rule = (lambda v: all(x in choices for x in v), f"must each be one of {', '.join(choices)}")
    elif choices is not None:
        rule = (lambda v: v in choices, one_of(choices))
    metadata = {"rule": rule, "choices": choices, "speed_only": speed_only}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------------------------------------- data


@dataclass
class CleanConfig:
    """Filters applied to training pairs only (valid/test are kept whole so scores stay comparable)."""

    min_words: int = 1
    max_words: int = 200
    max_ratio: float = 3.0  # longer side / shorter side, in whitespace words


@dataclass
class DataConfig:
    source: str = knob(choices=("hf", "local", "multi30k", "toy"))  # "hf" | "local" | "multi30k" | "toy"
    name: str = MISSING  # prepared corpus goes to {cache_dir}/{name}/
    cache_dir: str = "data"
    src_lang: str = "en"
    tgt_lang: str = "de"
    clean: CleanConfig = field(default_factory=CleanConfig)
    # processes that encode the training text when it is prepared; 0 = one per CPU core
    workers: int = knob(0, NON_NEGATIVE)


@dataclass
class HFDataConfig(DataConfig):
    """WMT from the Hugging Face hub (or parquet files, ``data_files``): a training subset drawn from
    every training file in proportion (only the parquet row groups it needs are fetched), the whole
    valid and test sets from their own files."""

    source: str = "hf"
    name: str = "wmt14_de_en"
    path: str = "wmt/wmt14"
    config_name: str = "de-en"
    # The hub commit every request names: the one that converted wmt/wmt14 to parquet. A branch or tag
    # ("main") is resolved to its commit first, logged; the prepared corpus is keyed by the commit.
    revision: str = "b199e406369ec1b7634206d3ded5ba45de2fe696"
    # seconds a hub request may wait for an answer before it fails
    hub_timeout_s: float = knob(30.0, POSITIVE)
    # tries again after a failed or stalled hub request (after 1, 2, 4 s)
    hub_retries: int = knob(3, NON_NEGATIVE)
    data_files: str | None = None  # local parquet/json instead of the hub (tests, mirrors)
    train_size: int = 200_000  # pairs drawn from all of the training split; more than it has = all
    seed: int = 1  # of the training subset
    train_split: str = "train"
    valid_split: str = "validation"  # newstest2013
    test_split: str = "test"  # newstest2014


@dataclass
class LocalDataConfig(DataConfig):
    """A folder of line-aligned ``{split}.{lang}`` files."""

    source: str = "local"
    name: str = "${basename:${data.dir}}"
    dir: str = MISSING
    extra_train: list[str] = field(default_factory=list)  # prefixes, e.g. ["extra-newstest2008-2012"]
    origin: str = ""  # where the files come from: said in the error when data.dir lacks them
    # When data.dir lacks its files: this many training pairs drawn from WMT14 on the Hugging Face hub
    # instead (data=wmt14_de_en's source, with newstest2013/2014 as valid/test), logged; 0 = no fallback.
    hub_fallback_pairs: int = knob(0, NON_NEGATIVE)


MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw"


@dataclass
class Multi30kDataConfig(DataConfig):
    """Multi30k task 1 (Elliott et al., 2016), English-German image captions: 29,000 training pairs,
    val (1,014) and test_2016_flickr (1,000). Read from ``dir`` when it holds the six files, else from
    the download cache under ``cache_dir``, else fetched from ``url`` once; every file is checked
    against the SHA-256 pinned in nmt.data.download, so all three give the same corpus."""

    source: str = "multi30k"
    name: str = "multi30k-de-en"
    dir: str = "../shared/data/multi30k-de-en"  # a local copy: {train,valid,test}.{en,de}
    # Folder of {train,val,test_2016_flickr}.{en,de}.gz: an http(s) URL (no user:password@) or a local path
    url: str = MULTI30K_URL


@dataclass
class ToyDataConfig(DataConfig):
    """A synthetic, learnable task: word-by-word lexicon mapping plus a reordering rule."""

    source: str = "toy"
    name: str = "toy"
    src_lang: str = "src"
    tgt_lang: str = "tgt"
    train_size: int = 4000
    valid_size: int = 200
    test_size: int = 200
    vocab_words: int = 40
    min_len: int = 3
    max_len: int = 10
    seed: int = 1234
    # the reordering rule: swap adjacent word pairs after the lexicon mapping; false = word for word
    # (a related task, e.g. to fine-tune a model of the swapping one)
    swap_pairs: bool = True


# ----------------------------------------------------------------------------------------- tokenizer


@dataclass
class TokenizerConfig:
    joint: bool = True  # one SentencePiece model for both languages (enables tied embeddings)
    model_type: str = knob("bpe", choices=("bpe", "unigram"))  # "bpe" | "unigram"
    vocab_size: int = knob(8000, POSITIVE)
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # sentences sampled (shuffled) for training
    seed: int = 42
    # Subword regularisation (Kudo 2018; BPE-dropout, Provilkov et al. 2020): the training split is also
    # segmented `sampled_copies` times with SentencePiece's sampling, and epoch e trains on copy
    # e % sampled_copies. bpe: alpha is the probability of dropping a merge; unigram: the smoothing
    # exponent. 0 = off. Valid, test and inference always use the one best segmentation.
    sampling_alpha: float = knob(0.0, NON_NEGATIVE)
    sampled_copies: int = knob(8, POSITIVE)


# --------------------------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    arch: str = knob(choices=("transformer", "rnnsearch"))
    dropout: float = knob(0.1, PROBABILITY)
    # longest source/target (subwords); longer input is truncated
    max_positions: int = knob(1024, (lambda v: v >= 2, "must be >= 2 (one token plus EOS)"))


ATTENTION_KINDS = ("dot_product", "additive")  # model.self_attention and model.cross_attention


@dataclass
class TransformerConfig(ModelConfig):
    arch: str = "transformer"
    d_model: int = knob(512, POSITIVE)
    ff_dim: int = knob(2048, POSITIVE)
    heads: int = knob(8, POSITIVE)
    # key/value heads (grouped-query attention; 1 = multi-query); 0 = as many as heads
    kv_heads: int = knob(0, NON_NEGATIVE)
    encoder_layers: int = knob(6, POSITIVE)
    decoder_layers: int = knob(6, POSITIVE)
    attention_dropout: float = knob(0.0, PROBABILITY)
    activation_dropout: float = knob(0.0, PROBABILITY)
    norm_first: bool = True  # pre-norm; False = post-norm as in the paper
    # "sinusoidal" | "learned" | "rope" (rotary, in self-attention)
    positional: str = knob("sinusoidal", choices=("sinusoidal", "learned", "rope"))
    rope_base: float = 10000.0  # RoPE wavelengths: base^(2i/head_dim) * 2pi
    share_embeddings: bool = True  # tie source/target/output embeddings (needs a joint vocabulary)
    self_attention: str = knob("dot_product", choices=ATTENTION_KINDS)  # "dot_product" | "additive"
    cross_attention: str = knob("dot_product", choices=ATTENTION_KINDS)  # "dot_product" | "additive"
    # hidden size of additive scores per head; 0 = head dimension
    additive_dim: int = knob(0, NON_NEGATIVE)
    additive_chunk: int = knob(64, POSITIVE)  # target positions scored at once by additive attention


@dataclass
class RNNSearchConfig(ModelConfig):
    """Bahdanau, Cho and Bengio (2014): BiGRU encoder, GRU decoder with additive attention."""

    arch: str = "rnnsearch"
    embed_dim: int = knob(620, POSITIVE)  # word embeddings (the paper's sizes are the defaults)
    hidden_size: int = knob(1000, POSITIVE)  # GRU states, per direction in the encoder
    attention_dim: int = knob(1000, POSITIVE)  # hidden size of the additive attention's scores
    maxout: bool = True  # deep output with a maxout layer (paper); False = linear readout
    readout_dim: int = knob(500, POSITIVE)
    share_embeddings: bool = False


# ----------------------------------------------------------------------------------------- optimizer


@dataclass
class OptimConfig:
    name: str = knob("adam", choices=("adam", "adamw"))  # "adam" | "adamw"
    lr: float = knob(7e-4, POSITIVE)  # peak learning rate, reached after warmup
    betas: list[float] = knob(
        [0.9, 0.98],
        (
            lambda v: len(v) == 2 and all(0 <= b < 1 for b in v),
            "must be two numbers in [0, 1), e.g. [0.9, 0.98]",
        ),
    )
    eps: float = knob(1e-9, NON_NEGATIVE)
    weight_decay: float = knob(0.0, NON_NEGATIVE)
    warmup_steps: int = knob(4000, NON_NEGATIVE)
    # "inverse_sqrt" | "constant" | "linear" (to zero at the budget's end)
    schedule: str = knob("inverse_sqrt", choices=("inverse_sqrt", "constant", "linear"))
    clip_norm: float = knob(1.0, NON_NEGATIVE)  # 0 = no clipping
    label_smoothing: float = knob(0.1, PROBABILITY)
    # word dropout (Sennrich & Zhang 2019): training inputs replaced by <unk> with this probability
    src_word_dropout: float = knob(0.0, PROBABILITY)  # source tokens
    # decoder input tokens (the targets predicted stay intact)
    tgt_word_dropout: float = knob(0.0, PROBABILITY)


# ------------------------------------------------------------------------------------------- trainer


@dataclass
class DefaultBudgetConfig:
    """The budget of a run that sets none of max_steps, max_epochs, max_minutes: every run ends."""

    cpu_minutes: float = knob(60.0, POSITIVE)  # wall-clock minutes of training on a CPU
    gpu_steps: int = knob(50_000, POSITIVE)  # updates on a GPU


PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # auto: nmt.devices.resolve_precision; the others: DTYPES
# Validation metrics that trainer.best_metric may name, and whether higher is better.
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False, "ppl": False}


@dataclass
class TrainerConfig:
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:1" ...
    # "auto" | "fp32" | "bf16" | "fp16"; auto = bf16 (fp16 if unsupported) on GPU; on a CPU bf16 with AMX,
    # fp32 without native bf16, and with avx512_bf16 alone whichever a timed probe finds faster
    precision: str = knob("auto", choices=PRECISIONS)
    # auto on an avx512_bf16-only CPU: bf16 only if the probe finds it this many times as fast as fp32
    # (bf16 rounds more: it must clearly pay, and noise must not flip the choice)
    cpu_bf16_min_speedup: float = knob(1.1, POSITIVE)
    compile: bool = False
    max_tokens: int = knob(4096, POSITIVE)  # padded source+target tokens per batch (per rank)
    accumulate: int = knob(1, POSITIVE)
    max_steps: int = knob(0, NON_NEGATIVE)  # optimizer updates; 0 = no limit
    max_epochs: int = knob(0, NON_NEGATIVE)  # 0 = no limit
    max_minutes: float = knob(0.0, NON_NEGATIVE)  # wall-clock budget for training; 0 = no limit
    default_budget: DefaultBudgetConfig = field(default_factory=DefaultBudgetConfig)
    log_every: int = knob(50, POSITIVE)
    valid_every: int = knob(1000, POSITIVE)
    valid_bleu_sentences: int = knob(500, NON_NEGATIVE)  # validation sentences decoded for BLEU; 0 = all
    valid_beam_size: int = knob(1, POSITIVE)
    # "bleu" | "chrf" (higher is better) | "loss" | "ppl" (lower is better)
    best_metric: str = knob("bleu", choices=tuple(HIGHER_IS_BETTER))
    # validations without improvement before stopping; 0 = never stop early
    patience: int = knob(0, NON_NEGATIVE)
    # step_N.pt kept for averaging (written at validations and window marks)
    keep_checkpoints: int = knob(5, NON_NEGATIVE)
    # share of the budget at whose end keep_checkpoints step_N.pt are spread
    average_window: float = knob(0.2, SHARE)
    # "auto": continue the run dir's last.pt if it has one (a re-run or a requeued job goes on), else start;
    # a checkpoint path; null: start anew. None of them writes over another run's checkpoints in the run dir.
    resume: str | None = "auto"
    # A checkpoint whose weights start this run (fine-tuning, continued training): its architecture and
    # tokenizer are kept (model.* and tokenizer.* must describe them; dropout may change), with a fresh
    # optimizer, schedule, sampler and budget. Ignored once the run has checkpoints of its own (resume).
    init_from: str | None = None
    # a fine-tune warns when more than this share of its training subwords is <unk> under the parent's
    # tokenizer (text outside the alphabet it was trained on)
    init_unk_warning: float = knob(0.01, PROBABILITY)
    max_bad_steps: int = knob(20, NON_NEGATIVE)  # consecutive non-finite losses before giving up
    num_text_examples: int = knob(3, NON_NEGATIVE)  # validation triples written to TensorBoard
    attention_image: bool = True  # cross-attention heatmap of a validation sentence in TensorBoard
    progress: bool = True


# ------------------------------------------------------------------------------------------ decoding


@dataclass
class DecodingConfig:
    """The one list of decoding options. ``DecodingOverrides`` (every script's ``decoding.*``) and the
    service's request (nmt.serve.requests) are made from it, so an option added here, with its rule, is
    offered and checked everywhere alike."""

    beam_size: int = knob(5, POSITIVE)  # 1 = greedy search
    alpha: float = knob(0.6, NON_NEGATIVE)  # GNMT length penalty ((5+|y|)/6)^alpha; 0 = none
    max_len_a: float = knob(1.2, NON_NEGATIVE)  # maximum output length a * src_len + b
    max_len_b: int = knob(10, NON_NEGATIVE)  # the b of max_len_a * src_len + b
    nbest: int = knob(1, POSITIVE)  # hypotheses returned per sentence (<= beam_size)
    no_unk: bool = knob(False)  # never output <unk>
    max_tokens: int = knob(8000, POSITIVE, speed_only=True)  # source tokens per batch (times beam size)
    cache: bool = knob(True, speed_only=True)  # incremental decoding with a key/value cache
    no_repeat_ngram: int = knob(0, NON_NEGATIVE)  # no n-gram twice in a hypothesis (fairseq, HF); 0 = off
    word_reward: float = knob(0.0)  # added to a hypothesis' score per token (EOS included); < 0 = penalty
    # a shortlist file (scripts/build_shortlist.py): score only each sentence's candidate target subwords;
    # null = the whole vocabulary. A file where the model runs: the service's to set, never a request's
    shortlist: str | None = knob(
        None,
        (lambda v: v is None or (isinstance(v, str) and v.strip() != ""), "must be a file or null"),
        speed_only=True,
    )
    # sentences whose shortlist candidates are scored together, with one matrix product over their
    # union: fewer makes narrower products (a batch's union is several times a sentence's), more
    # fewer of them
    shortlist_group: int = knob(4, POSITIVE, speed_only=True)


def overrides_of(config: type, name: str, doc: str) -> type:
    """A dataclass with ``config``'s fields, each optional with default None and the same rule (a real
    dataclass type: Hydra's ConfigStore types the ``decoding.*`` of the scripts with it)."""
    hints = typing.get_type_hints(config)
    fields = [
        (f.name, hints[f.name] | None, field(default=None, metadata=f.metadata))
        for f in dataclasses.fields(config)
    ]
    overrides = dataclasses.make_dataclass(name, fields)
    overrides.__module__, overrides.__doc__ = __name__, doc
    overrides.__overrides_of__ = config  # where field_comments finds the fields' comments
    return overrides


DecodingOverrides = overrides_of(
    DecodingConfig,
    "DecodingOverrides",
    "``decoding.*`` of evaluate, translate, serve and plot_attention: one field per DecodingConfig "
    "field; None keeps the checkpoint's (tuned) value.",
)


@functools.cache
def field_comments(config: type) -> dict[str, str]:
    """Each field's comment in the dataclass source (trailing, or the block of comment lines right above
    it), inherited ones included: the one place the scripts' ``--help`` takes its descriptions from."""
    comments: dict[str, str] = {}
    for cls in reversed(getattr(config, "__overrides_of__", config).__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        names = {f.name for f in dataclasses.fields(cls)}
        lines = textwrap.dedent(inspect.getsource(cls)).splitlines(keepends=True)
        above: list[str] = []
        for token in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
            if token.type == tokenize.COMMENT and token.line.strip().startswith("#"):
                above.append(token.string.lstrip("# ").strip())
            elif token.type == tokenize.NAME and token.start[1] == 4 and token.string in names:
                line = lines[token.start[0] - 1]
                trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
                text = " ".join([*above, trailing]).strip()
                if text:
                    comments[token.string] = text
                above = []
            elif token.type not in (tokenize.NL, tokenize.COMMENT):
                above = [] if token.type == tokenize.NEWLINE else above
    return comments


def checkpoint_paths(checkpoint: Any) -> list[str]:
    """``checkpoint=PATH`` or ``checkpoint=[A,B,...]`` (an ensemble of those models) as a list of paths."""
    paths = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
    if not paths or not all(isinstance(p, str) and p for p in paths):
        raise NMTError(f"checkpoint={checkpoint}: give a path or a list of paths [a.pt,b.pt]")
    return paths


def merge_decoding(base: DecodingConfig, overrides: DecodingOverrides) -> DecodingConfig:
    """The checkpoint's decoding settings with the overrides that were given."""
    return dataclasses.replace(base, **{k: v for k, v in vars(overrides).items() if v is not None})


@dataclass
class FinalConfig:
    """How the main job picks the run's final model (scripts/select_final.py reads it from the checkpoint)."""

    # length penalties tried on valid; [] = decoding.alpha
    alphas: list[float] = knob([], (lambda v: all(a >= 0 for a in v), "must all be >= 0"))


# --------------------------------------------------------------------------------------- the scripts


@dataclass
class TrainConfig:
    data: DataConfig = MISSING
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = MISSING
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    final: FinalConfig = field(default_factory=FinalConfig)
    seed: int = 1

# How scripts/export_ct2.py stores the weights (quantization=, bench.ct2_quantizations): nmt.ct2.export
CT2_QUANTIZATIONS = (
    "none", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16"
)


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
class TextPairConfig:
    """Sentence pairs from two line-aligned files, instead of a configured data split."""

    src: str | None = None  # the sources, a sentence per line
    ref: str | None = None  # their translations (the references), line by line


@dataclass
class EvalFilesConfig(TextPairConfig):
    out: str | None = None  # hypotheses file; default: next to the report
    metrics: list[str] = knob(["bleu", "chrf"], choices=("bleu", "chrf", "ter"))  # add "ter" for TER
    tb_dir: str | None = None  # a run dir whose TensorBoard gets the scores
    by_length: bool = False  # also score buckets of source length (subwords): 1-10, 11-20, 21-30, 31-50, 51+


@dataclass
class EvalDataConfig:
    """Overrides of the data settings stored in the checkpoint."""

    split: str = "test"
    dir: str | None = None  # the local data folder, if it moved since training
    cache_dir: str | None = None


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
class SplitConfig(InferenceConfig):
    """A checkpoint over an evaluation text: a data split, or eval.src with eval.ref (what score.py and
    the benchmarks that time decoders on a split take; evaluate.py's ``eval`` has more)."""

    data: EvalDataConfig = field(default_factory=EvalDataConfig)  # a split and its references ...
    eval: TextPairConfig = field(default_factory=TextPairConfig)  # ... or eval.src with eval.ref


@dataclass
class DecodeConfig(InferenceConfig):
    """What the scripts that decode many sentences take besides: evaluate.py and translate.py."""

    # backend=torch on a CPU: decode in this many single-threaded processes (each loads the model),
    # faster than one process of as many threads (docs/speed.md); 1 = here, on torch's threads
    workers: int = 1


@dataclass
class EvaluateConfig(DecodeConfig):
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    eval: EvalFilesConfig = field(default_factory=EvalFilesConfig)
    prefix_file: str | None = None  # target prefixes, a line per source (empty = none): outputs start so
    alignments: bool = False  # also write each hypothesis' word alignment (Pharaoh i-j) to a .align file


@dataclass
class TranslateConfig(DecodeConfig):
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


@dataclass
class AverageConfig:
    run_dir: str | None = None  # average the newest `last` step_N.pt of this run ...
    last: int = 5
    window: float = 0.0  # > 0: only step_N.pt from the last `window` share of the run's steps
    inputs: list[str] = field(default_factory=list)  # ... or exactly these checkpoints
    output: str | None = None  # default: {run_dir}/checkpoints/averaged.pt


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


def _basename(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    if not OmegaConf.has_resolver("basename"):
        OmegaConf.register_new_resolver("basename", _basename)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="average_schema", node=AverageConfig)
    cs.store(name="select_schema", node=SelectConfig)
    cs.store(name="export_ct2_schema", node=ExportCT2Config)
    cs.store(name="export_hf_schema", node=ExportHFConfig)
    cs.store(name="serve_schema", node=ServeConfig)
    cs.store(name="benchmark_server_schema", node=ServeBenchConfig)
    cs.store(name="benchmark_ct2_schema", node=CT2SpeedConfig)
    cs.store(name="benchmark_decoders_schema", node=DecodersSpeedConfig)
    cs.store(name="benchmark_prepare_schema", node=PrepareSpeedConfig)
    cs.store(name="plot_attention_schema", node=PlotAttentionConfig)
    cs.store(name="plot_curves_schema", node=PlotCurvesConfig)
    cs.store(name="score_schema", node=ScoreConfig)
    cs.store(name="compare_alignments_schema", node=CompareAlignmentsConfig)
    cs.store(name="distill_schema", node=DistillConfig)
    cs.store(name="shortlist_schema", node=ShortlistConfig)
    # Merged before the `train` config it extends, whose root schema (TrainConfig) then stays the type.
    cs.store(name="benchmark_schema", node={"bench": BenchConfig})
    cs.store(group="data", name="hf_schema", node=HFDataConfig)
    cs.store(group="data", name="local_schema", node=LocalDataConfig)
    cs.store(group="data", name="multi30k_schema", node=Multi30kDataConfig)
    cs.store(group="data", name="toy_schema", node=ToyDataConfig)
    cs.store(group="model", name="transformer_schema", node=TransformerConfig)
    cs.store(group="model", name="rnnsearch_schema", node=RNNSearchConfig)
    cs.store(group="tokenizer", name="tokenizer_schema", node=TokenizerConfig)
    cs.store(group="optim", name="optim_schema", node=OptimConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="decoding", name="decoding_schema", node=DecodingConfig)


DATA_SCHEMAS = {
    "hf": HFDataConfig,
    "local": LocalDataConfig,
    "multi30k": Multi30kDataConfig,
    "toy": ToyDataConfig,
}
MODEL_SCHEMAS = {"transformer": TransformerConfig, "rnnsearch": RNNSearchConfig}


def to_train_config(container: dict) -> TrainConfig:
    """Rebuild a typed TrainConfig from a plain (resolved) dict, e.g. the one stored in a checkpoint."""
    schema = OmegaConf.structured(TrainConfig)
    schema.data = OmegaConf.structured(DATA_SCHEMAS[container["data"]["source"]])
    schema.model = OmegaConf.structured(MODEL_SCHEMAS[container["model"]["arch"]])
    return OmegaConf.to_object(OmegaConf.merge(schema, container))


def split_benchmark_config(cfg: DictConfig) -> tuple[TrainConfig, BenchConfig]:
    """scripts/benchmark.py's composed config as the training config it extends and its ``bench``."""
    bench = OmegaConf.to_object(cfg.bench)
    with open_dict(cfg):
        del cfg["bench"]  # the rest is a TrainConfig
    return OmegaConf.to_object(cfg), bench


def to_container(cfg: TrainConfig) -> dict:
    """A plain, resolved dict of the config (for checkpoints, TensorBoard hparams, printing)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


DATA_FOLDERS = ("cache_dir", "dir")  # the keys of a data config that name folders


def with_absolute_folders(data: DataConfig) -> DataConfig:
    """``data`` with its folders absolute (from the working directory): a run's checkpoints then find
    the corpus and the cache the run used wherever they are evaluated from, instead of preparing the
    corpus again under the working directory of the day."""
    folders = {key: os.path.abspath(getattr(data, key)) for key in DATA_FOLDERS if hasattr(data, key)}
    return dataclasses.replace(data, **folders)


# --------------------------------------------------------------------------------- value checks
@functools.cache
def knobs_of(config: type) -> dict[str, dict[str, Any]]:
    """Each field of the dataclass ``config`` that has a rule, with its knob's metadata; a subclass that
    only changes a default (``arch: str = "transformer"``) keeps the rule its base declares."""
    found: dict[str, dict[str, Any]] = {}
    for cls in reversed(config.__mro__):
        if dataclasses.is_dataclass(cls):
            found |= {f.name: dict(f.metadata) for f in dataclasses.fields(cls) if f.metadata.get("rule")}
    return found


def knob_rules(config: type) -> dict[str, Rule]:
    """The rule of each setting of ``config`` that has one."""
    return {name: meta["rule"] for name, meta in knobs_of(config).items()}


def check_values(cfg: object, prefix: str = "") -> None:
    """Raise NMTError naming the first setting of ``cfg`` (nested sections included) whose value breaks its
    knob's rule, as ``KEY=VALUE: must be ...`` with the closest choice; None (not set) is never checked.
    Then the settings of a section that must fit together (``FITS``)."""
    knobs = knobs_of(type(cfg))
    for name, value in vars(cfg).items():
        if dataclasses.is_dataclass(value):
            check_values(value, f"{prefix}{name}.")
        elif value is not None and name in knobs:
            (ok, what), choices = knobs[name]["rule"], knobs[name]["choices"]
            if not ok(value):
                raise NMTError(f"{prefix}{name}={value}: {what}{closest_choice(value, choices)}")
    for section, fits in FITS:
        if isinstance(cfg, section):
            fits(cfg, prefix)


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """A choice given to a function rather than in a config, refused as check_values refuses a setting."""
    if value not in choices:
        raise NMTError(f"{key}={value}: {one_of(choices)}{closest_choice(value, choices)}")


def closest_choice(value: Any, choices: tuple[str, ...] | None) -> str:
    """``; did you mean X?`` for the choice closest to a refused value (a list's first refused item),
    case aside, else nothing."""
    if isinstance(value, list):
        value = next((x for x in value if x not in (choices or ())), "")
    lowered = {c.lower(): c for c in choices or ()}
    close = difflib.get_close_matches(str(value).lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[close[0]]}?" if close else ""


def check_decoding(cfg: DecodingConfig, prefix: str = "decoding.") -> None:
    """The decoding options' values, and nbest within the beam."""
    check_values(cfg, prefix)


def valid_host_pattern(pattern: Any) -> bool:
    """A Host pattern as Starlette's TrustedHostMiddleware matches it: a name or address (IPv6 in
    brackets), ``*.domain`` or ``*``; never a port, which the Host header's match leaves out."""
    if not isinstance(pattern, str) or not pattern or pattern != pattern.strip() or "*" in pattern[1:]:
        return False
    if ":" in pattern and not (pattern.startswith("[") and pattern.endswith("]")):
        return False
    return pattern == "*" or not pattern.startswith("*") or pattern.startswith("*.")


def check_model(cfg: ModelConfig) -> None:
    """The model's settings, and the Transformer's that must fit together (when it is built from a
    checkpoint's config, too)."""
    check_values(cfg, "model.")


def _model_fits(cfg: ModelConfig, prefix: str) -> None:
    """The schema (model=...) decides the architecture; the Transformer's shape constraints (values that
    are fine one by one but not together)."""
    schema = MODEL_SCHEMAS[cfg.arch]
    if type(cfg) in MODEL_SCHEMAS.values() and not isinstance(cfg, schema):
        raise NMTError(
            f"{prefix}arch={cfg.arch}: must be {type(cfg).arch} here (model=... chooses the architecture, "
            "with its settings)"
        )
    if not isinstance(cfg, TransformerConfig):
        return
    if cfg.d_model % cfg.heads:
        raise NMTError(f"model.d_model={cfg.d_model} is not divisible by model.heads={cfg.heads}")
    if cfg.heads % (cfg.kv_heads or cfg.heads):
        raise NMTError(
            f"model.heads={cfg.heads} must be a multiple of model.kv_heads={cfg.kv_heads} "
            "(key/value heads; 0 = as many as model.heads)"
        )
    if cfg.positional == "rope":
        if cfg.self_attention != "dot_product":
            raise NMTError(
                "model.positional=rope rotates the queries and keys of dot-product self-attention: "
                "use model.self_attention=dot_product or model.positional=sinusoidal/learned"
            )
        if cfg.rope_base <= 0 or (cfg.d_model // cfg.heads) % 2:
            raise NMTError(
                f"model.positional=rope needs model.rope_base > 0 (got {cfg.rope_base:g}) and an even "
                f"head dimension model.d_model / model.heads (got {cfg.d_model // cfg.heads})"
            )


def _decoding_fits(cfg: DecodingConfig, prefix: str) -> None:
    if cfg.nbest > cfg.beam_size:
        raise NMTError(f"{prefix}nbest={cfg.nbest} exceeds {prefix}beam_size={cfg.beam_size}")


# Checks of settings that must fit together, run on each section of these types after its values'.
FITS: tuple[tuple[type, Callable[[Any, str], None]], ...] = (
    (ModelConfig, _model_fits),
    (DecodingConfig, _decoding_fits),
)


def check_train_config(cfg: TrainConfig) -> None:
    """Refuse, at start, settings that would fail or misbehave hours into training."""
    check_values(cfg)
