"""The schemas of a training run (``scripts/train.py``: data, tokenizer, model, optim, trainer, decoding,
final) and their checks; the config a checkpoint stores is a TrainConfig."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, OmegaConf

from nmt.config.knobs import (
    DEVICE,
    EACH_NON_NEGATIVE,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    SHARE,
    check_values,
    fits_together,
    keyed_by_choices,
    knob,
)
from nmt.errors import NMTError

# ---------------------------------------------------------------------------------------------- data


@dataclass
class CleanConfig:
    """Filters applied to training pairs only (valid/test are kept whole so scores stay comparable)."""

    min_words: int = 1
    max_words: int = knob(200, POSITIVE)
    max_ratio: float = knob(3.0, help="longer side / shorter side, in whitespace words")


@dataclass
class DataConfig:
    source: str = knob(
        choices=("hf", "local", "multi", "multi30k", "toy"),
        help="where the corpus comes from (a data source; multi: several, one per direction)",
    )
    name: str = knob(MISSING, help="prepared corpus goes to {cache_dir}/{name}/")
    cache_dir: str = "data"
    src_lang: str = "en"
    tgt_lang: str = "de"
    clean: CleanConfig = field(default_factory=CleanConfig)
    workers: int = knob(
        0,
        NON_NEGATIVE,
        help="processes that encode the training text when it is prepared; 0 = one per CPU core",
    )


@dataclass
class HFDataConfig(DataConfig):
    """Any translation dataset on the Hugging Face hub (or parquet files, ``data_files``): a training
    subset drawn from every training file in proportion (only the parquet row groups it needs are
    fetched), the whole valid and test sets from their own splits, or drawn from training when the
    dataset has none. nmt.data.sources.hub reads it; data=wmt14_de_en and the other presets set it."""

    source: str = "hf"
    name: str = "hf-${data.config_name}"
    path: str = knob(MISSING, help="the dataset on the hub, e.g. wmt/wmt16")
    config_name: str = knob("default", help="its config (subset), e.g. ro-en")
    revision: str = knob(
        "main",
        help=(
            'A commit, branch or tag: a branch ("main") is resolved to its commit once, logged; the '
            "prepared corpus, the checkpoints and the test report name the commit. No parquet there: the "
            "hub's parquet conversion (refs/convert/parquet) is read instead."
        ),
    )
    hub_timeout_s: float = knob(
        30.0, POSITIVE, help="seconds a hub request may wait for an answer before it fails"
    )
    hub_deadline_s: float = knob(
        600.0, POSITIVE, help="seconds a whole hub request may take, however its server trickles the bytes"
    )
    hub_retries: int = knob(
        3, NON_NEGATIVE, help="tries again after a failed or stalled hub request (after 1, 2, 4 s)"
    )
    data_files: str | None = knob(None, help="local parquet/json instead of the hub (tests, mirrors)")
    train_size: int = knob(200_000, help="pairs drawn from all of the training split; more than it has = all")
    seed: int = knob(1, help="of the training subset (and of valid/test drawn from it)")
    src_column: str | None = knob(
        None, help="Two flat text columns instead of a `translation` struct; null = the language codes"
    )
    tgt_column: str | None = None
    train_split: str = "train"
    valid_split: str | None = knob("validation", help="null = valid_size pairs drawn from training")
    test_split: str | None = knob("test", help="null = test_size pairs drawn from training")
    valid_size: int = knob(2000, POSITIVE, help="pairs, when valid_split is null")
    test_size: int = knob(2000, POSITIVE, help="pairs, when test_split is null")
    valid_path: str | None = knob(
        None,
        help=(
            "Valid/test from another dataset or config (null = path, config_name): e.g. FLORES. A config "
            "with {lang} holds one language each (FLORES-style), joined on join_column, its text in "
            "text_column; {lang} is the language's config (flores_codes, else "
            "nmt.data.sources.hub.FLORES_CODES)."
        ),
    )
    valid_config: str | None = None
    valid_revision: str | None = knob(None, help="null: revision for path's own splits, else main")
    test_path: str | None = None
    test_config: str | None = None
    test_revision: str | None = None
    join_column: str = "id"
    text_column: str = "text"
    flores_codes: dict[str, str] = knob({}, help="language -> config, e.g. {de: deu_Latn}")


@dataclass
class LocalDataConfig(DataConfig):
    """A folder of line-aligned ``{split}.{lang}`` files."""

    source: str = "local"
    name: str = "${basename:${data.dir}}"
    dir: str = MISSING
    extra_train: list[str] = knob([], help='prefixes, e.g. ["extra-newstest2008-2012"]')
    origin: str = knob("", help="where the files come from: said in the error when data.dir lacks them")
    hub_fallback_pairs: int = knob(
        0,
        NON_NEGATIVE,
        help=(
            "When data.dir lacks its files: this many training pairs drawn from WMT14 on the Hugging Face"
            " hub instead (data=wmt14_de_en's source, with newstest2013/2014 as valid/test), logged; 0 = "
            "no fallback."
        ),
    )


MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw"


@dataclass
class Multi30kDataConfig(DataConfig):
    """Multi30k task 1 (Elliott et al., 2016), English-German image captions: 29,000 training pairs,
    val (1,014) and test_2016_flickr (1,000). Read from ``dir`` when it holds the six files, else from
    the download cache under ``cache_dir``, else fetched from ``url`` once; every file is checked
    against the SHA-256 pinned in nmt.data.download, so all three give the same corpus."""

    source: str = "multi30k"
    name: str = "multi30k-de-en"
    dir: str = knob("../shared/data/multi30k-de-en", help="a local copy: {train,valid,test}.{en,de}")
    url: str = knob(
        MULTI30K_URL,
        help=(
            "Folder of {train,val,test_2016_flickr}.{en,de}.gz: an http(s) URL (no user:password@) or a "
            "local path"
        ),
    )


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
    vocab_words: int = knob(40, POSITIVE)
    min_len: int = 3
    max_len: int = 10
    seed: int = 1234
    swap_pairs: bool = knob(
        True,
        help=(
            "the reordering rule: swap adjacent word pairs after the lexicon mapping; false = word for "
            "word (a related task, e.g. to fine-tune a model of the swapping one)"
        ),
    )


@dataclass
class MultiDataConfig(DataConfig):
    """Several corpora in one model (nmt.data.multilingual): each entry of ``corpora`` is a data config
    of its own (a source and its direction, as data/<preset>.yaml would give it). Source sentences get
    their target language's tag (``>>de<<``); training draws from the corpora by temperature; valid and
    test stay per direction. ``src_lang``/``tgt_lang`` only name the sides of the mixed prepared text."""

    source: str = "multi"
    name: str = "multi"
    src_lang: str = "src"
    tgt_lang: str = "tgt"
    corpora: list[Any] = knob(
        [],
        (lambda v: len(v) > 0, "must list at least one corpus"),
        help="the corpora, each a data config: {source: multi30k, src_lang: en, tgt_lang: de, ...}",
    )
    temperature: float = knob(
        5.0,
        POSITIVE,
        help="sampling temperature T: corpus k is drawn with p ~ n_k^(1/T); 1 = in proportion to size",
    )


# ----------------------------------------------------------------------------------------- tokenizer


@dataclass
class TokenizerConfig:
    joint: bool = knob(True, help="one SentencePiece model for both languages (enables tied embeddings)")
    model_type: str = knob("bpe", choices=("bpe", "unigram"), help="SentencePiece's segmentation algorithm")
    vocab_size: int = knob(8000, POSITIVE)
    character_coverage: float = knob(1.0, SHARE, help="share of the characters SentencePiece covers")
    input_sentence_size: int = knob(2_000_000, help="sentences sampled (shuffled) for training")
    seed: int = 42
    sampling_alpha: float = knob(
        0.0,
        NON_NEGATIVE,
        help=(
            "Subword regularisation (Kudo 2018; BPE-dropout, Provilkov et al. 2020): the training split "
            "is also segmented `sampled_copies` times with SentencePiece's sampling, and epoch e trains "
            "on copy e % sampled_copies. bpe: alpha is the probability of dropping a merge; unigram: the "
            "smoothing exponent. 0 = off. Valid, test and inference always use the one best segmentation."
        ),
    )
    sampled_copies: int = knob(8, POSITIVE)


# --------------------------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    arch: str = knob(choices=("transformer", "rnnsearch"))
    dropout: float = knob(0.1, PROBABILITY)
    max_positions: int = knob(
        1024,
        (lambda v: v >= 2, "must be >= 2 (one token plus EOS)"),
        help="longest source/target (subwords); longer input is truncated",
    )


ATTENTION_KINDS = ("dot_product", "additive")  # model.self_attention and model.cross_attention


@dataclass
class TransformerConfig(ModelConfig):
    arch: str = "transformer"
    d_model: int = knob(512, POSITIVE)
    ff_dim: int = knob(2048, POSITIVE)
    heads: int = knob(8, POSITIVE)
    kv_heads: int = knob(
        0,
        NON_NEGATIVE,
        help="key/value heads (grouped-query attention; 1 = multi-query); 0 = as many as heads",
    )
    encoder_layers: int = knob(6, POSITIVE)
    decoder_layers: int = knob(6, POSITIVE)
    attention_dropout: float = knob(0.0, PROBABILITY)
    activation_dropout: float = knob(0.0, PROBABILITY)
    norm_first: bool = knob(True, help="pre-norm; False = post-norm as in the paper")
    positional: str = knob(
        "sinusoidal",
        choices=("sinusoidal", "learned", "rope"),
        help="position encoding (rope: rotary, in self-attention)",
    )
    rope_base: float = knob(10000.0, help="RoPE wavelengths: base^(2i/head_dim) * 2pi")
    share_embeddings: bool = knob(True, help="tie source/target/output embeddings (needs a joint vocabulary)")
    self_attention: str = knob("dot_product", choices=ATTENTION_KINDS)
    cross_attention: str = knob("dot_product", choices=ATTENTION_KINDS)
    additive_dim: int = knob(
        0, NON_NEGATIVE, help="hidden size of additive scores per head; 0 = head dimension"
    )
    additive_chunk: int = knob(64, POSITIVE, help="target positions scored at once by additive attention")


@dataclass
class RNNSearchConfig(ModelConfig):
    """Bahdanau, Cho and Bengio (2014): BiGRU encoder, GRU decoder with additive attention."""

    arch: str = "rnnsearch"
    embed_dim: int = knob(620, POSITIVE, help="word embeddings (the paper's sizes are the defaults)")
    hidden_size: int = knob(1000, POSITIVE, help="GRU states, per direction in the encoder")
    attention_dim: int = knob(1000, POSITIVE, help="hidden size of the additive attention's scores")
    maxout: bool = knob(True, help="deep output with a maxout layer (paper); False = linear readout")
    readout_dim: int = knob(500, POSITIVE)
    share_embeddings: bool = False


# ----------------------------------------------------------------------------------------- optimizer


@dataclass
class OptimConfig:
    name: str = knob("adam", choices=("adam", "adamw"), help="the optimizer (adamw: decoupled weight decay)")
    lr: float = knob(7e-4, POSITIVE, help="peak learning rate, reached after warmup")
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
    schedule: str = knob(
        "inverse_sqrt",
        choices=("inverse_sqrt", "constant", "linear"),
        help="learning-rate schedule after warmup (linear: to zero at the budget's end)",
    )
    cooldown: float = knob(
        0.0,
        PROBABILITY,
        help=(
            "share of the budget, at its end, over which the schedule's rate falls linearly to zero "
            "(the cool-down of warmup-stable-decay, Hagele et al. 2024); 0 = off"
        ),
    )
    clip_norm: float = knob(1.0, NON_NEGATIVE, help="0 = no clipping")
    label_smoothing: float = knob(0.1, PROBABILITY)
    src_word_dropout: float = knob(
        0.0,
        PROBABILITY,
        help=(
            "word dropout (Sennrich & Zhang 2019): training inputs replaced by <unk> with this "
            "probability source tokens"
        ),
    )
    tgt_word_dropout: float = knob(
        0.0, PROBABILITY, help="decoder input tokens (the targets predicted stay intact)"
    )
    rdrop_alpha: float = knob(
        0.0,
        NON_NEGATIVE,
        help=(
            "R-Drop (Liang et al. 2021): weight of the symmetric KL between two dropout passes of each "
            "batch (the batch twice in one forward pass: about 3x the step's time, docs/speed.md); 0 = off"
        ),
    )


# ------------------------------------------------------------------------------------------- trainer


@dataclass
class DefaultBudgetConfig:
    """The budget of a run that sets none of max_steps, max_epochs, max_minutes: every run ends."""

    cpu_minutes: float = knob(60.0, POSITIVE, help="wall-clock minutes of training on a CPU")
    gpu_steps: int = knob(50_000, POSITIVE, help="updates on a GPU")


PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # auto: nmt.devices.resolve_precision; the others: DTYPES
# Validation metrics that trainer.best_metric may name, and whether higher is better.
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False, "ppl": False}


@dataclass
class TrainerConfig:
    device: str = knob("auto", DEVICE, help="where it runs")
    precision: str = knob(
        "auto",
        choices=PRECISIONS,
        help=(
            "auto = bf16 (fp16 if unsupported) on GPU; on a CPU fp32 without native bf16, and with it "
            "(avx512_bf16 or AMX) whichever a timed probe finds faster"
        ),
    )
    cpu_bf16_min_speedup: float = knob(
        1.1,
        POSITIVE,
        help=(
            "auto on a CPU with native bf16: bf16 only if the probe finds it this many times as fast as "
            "fp32 (bf16 rounds more: it must clearly pay, and noise must not flip the choice)"
        ),
    )
    compile: bool = False
    max_tokens: int = knob(4096, POSITIVE, help="padded source+target tokens per batch (per rank)")
    accumulate: int = knob(1, POSITIVE)
    max_steps: int = knob(0, NON_NEGATIVE, help="optimizer updates; 0 = no limit")
    max_epochs: int = knob(0, NON_NEGATIVE, help="0 = no limit")
    max_minutes: float = knob(0.0, NON_NEGATIVE, help="wall-clock budget for training; 0 = no limit")
    default_budget: DefaultBudgetConfig = field(default_factory=DefaultBudgetConfig)
    log_every: int = knob(50, POSITIVE)
    valid_every: int = knob(1000, POSITIVE)
    valid_bleu_sentences: int = knob(500, NON_NEGATIVE, help="validation sentences decoded for BLEU; 0 = all")
    valid_beam_size: int = knob(1, POSITIVE)
    best_metric: str = knob(
        "bleu",
        choices=tuple(HIGHER_IS_BETTER),
        help="the validation score that picks best.pt (bleu, chrf: higher is better; loss, ppl: lower)",
    )
    patience: int = knob(
        0, NON_NEGATIVE, help="validations without improvement before stopping; 0 = never stop early"
    )
    keep_checkpoints: int = knob(
        5,
        NON_NEGATIVE,
        help="step_N.pt kept for averaging: written at average_window's marks and at validations before them",
    )
    average_window: float = knob(
        0.2, SHARE, help="share of the budget at whose end keep_checkpoints step_N.pt are spread"
    )
    resume: str | None = knob(
        "auto",
        help=(
            '"auto": continue the run dir\'s last.pt if it has one (a re-run or a requeued job goes on), '
            "else start; a checkpoint path; null: start anew. None of them writes over another run's "
            "checkpoints in the run dir."
        ),
    )
    init_from: str | None = knob(
        None,
        help=(
            "A checkpoint whose weights start this run (fine-tuning, continued training): its "
            "architecture and tokenizer are kept (model.* and tokenizer.* must describe them; dropout may"
            " change), with a fresh optimizer, schedule, sampler and budget. Ignored once the run has "
            "checkpoints of its own (resume)."
        ),
    )
    init_unk_warning: float = knob(
        0.01,
        PROBABILITY,
        help=(
            "a fine-tune warns when more than this share of its training subwords is <unk> under the "
            "parent's tokenizer (text outside the alphabet it was trained on)"
        ),
    )
    max_bad_steps: int = knob(20, NON_NEGATIVE, help="consecutive non-finite losses before giving up")
    num_text_examples: int = knob(3, NON_NEGATIVE, help="validation triples written to TensorBoard")
    attention_image: bool = knob(True, help="cross-attention heatmap of a validation sentence in TensorBoard")
    progress: bool = True


# ------------------------------------------------------------------------------------------ decoding


@dataclass
class DecodingConfig:
    """The one list of decoding options. ``DecodingOverrides`` (every script's ``decoding.*``) and the
    service's request (nmt.serve.requests) are made from it, so an option added here, with its rule, is
    offered and checked everywhere alike."""

    beam_size: int = knob(5, POSITIVE, help="1 = greedy search")
    alpha: float = knob(0.6, NON_NEGATIVE, help="GNMT length penalty ((5+|y|)/6)^alpha; 0 = none")
    max_len_a: float = knob(1.2, NON_NEGATIVE, help="maximum output length a * src_len + b")
    max_len_b: int = knob(10, NON_NEGATIVE, help="the b of max_len_a * src_len + b")
    nbest: int = knob(1, POSITIVE, help="hypotheses returned per sentence (<= beam_size)")
    no_unk: bool = knob(False, help="never output <unk>")
    max_tokens: int = knob(8000, POSITIVE, speed_only=True, help="source tokens per batch (times beam size)")
    cache: bool = knob(True, speed_only=True, help="incremental decoding with a key/value cache")
    no_repeat_ngram: int = knob(
        0, NON_NEGATIVE, help="no n-gram twice in a hypothesis (fairseq, HF); 0 = off"
    )
    word_reward: float = knob(
        0.0, help="added to a hypothesis' score per token (EOS included); < 0 = penalty"
    )
    shortlist: str | None = knob(
        None,
        (lambda v: v is None or (isinstance(v, str) and v.strip() != ""), "must be a file or null"),
        speed_only=True,
        help=(
            "a shortlist file (scripts/build_shortlist.py): score only each sentence's candidate target "
            "subwords; null = the whole vocabulary. A file where the model runs: the service's to set, "
            "never a request's"
        ),
    )
    shortlist_group: int = knob(
        4,
        POSITIVE,
        speed_only=True,
        help=(
            "sentences whose shortlist candidates are scored together, with one matrix product over their"
            " union: fewer makes narrower products (a batch's union is several times a sentence's), more "
            "fewer of them"
        ),
    )


# --------------------------------------------------------------------------------------------- the run


@dataclass
class FinalConfig:
    """How the main job picks the run's final model (scripts/select_final.py reads it from the checkpoint)."""

    alphas: list[float] = knob(
        [],
        EACH_NON_NEGATIVE,
        help="length penalties tried on valid; [] = decoding.alpha",
    )


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


DATA_SCHEMAS = keyed_by_choices(
    DataConfig,
    "source",
    {
        "hf": HFDataConfig,
        "local": LocalDataConfig,
        "multi": MultiDataConfig,
        "multi30k": Multi30kDataConfig,
        "toy": ToyDataConfig,
    },
)
MODEL_SCHEMAS = keyed_by_choices(
    ModelConfig, "arch", {"transformer": TransformerConfig, "rnnsearch": RNNSearchConfig}
)


def to_train_config(container: dict) -> TrainConfig:
    """Rebuild a typed TrainConfig from a plain (resolved) dict, e.g. the one stored in a checkpoint."""
    schema = OmegaConf.structured(TrainConfig)
    schema.data = OmegaConf.structured(DATA_SCHEMAS[container["data"]["source"]])
    schema.model = OmegaConf.structured(MODEL_SCHEMAS[container["model"]["arch"]])
    return OmegaConf.to_object(OmegaConf.merge(schema, container))


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


def check_decoding(cfg: DecodingConfig, prefix: str = "decoding.") -> None:
    """The decoding options' values, and nbest within the beam."""
    check_values(cfg, prefix)


def check_model(cfg: ModelConfig) -> None:
    """The model's settings, and the Transformer's that must fit together (when it is built from a
    checkpoint's config, too)."""
    check_values(cfg, "model.")


@fits_together(ModelConfig)
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


def corpus_configs(cfg: MultiDataConfig, prefix: str = "data.") -> list[DataConfig]:
    """The typed config of each of ``cfg.corpora`` (its source's schema; the folders and the cache of
    ``cfg`` unless it names its own), checked as any data config is; one line naming the entry else."""
    typed = []
    for i, entry in enumerate(cfg.corpora):
        where = f"{prefix}corpora[{i}]"
        entry = dict(OmegaConf.to_container(entry) if OmegaConf.is_config(entry) else entry)
        entry.pop("tokenizer", None)
        source = entry.get("source")
        if source not in DATA_SCHEMAS or source == "multi":
            choices = tuple(k for k in DATA_SCHEMAS if k != "multi")
            raise NMTError(f"{where}.source={source}: must be one of {', '.join(choices)}")
        entry.setdefault("name", f"{cfg.name}-{i}")
        entry.setdefault("cache_dir", cfg.cache_dir)
        entry.setdefault("workers", cfg.workers)
        try:
            merged = OmegaConf.merge(OmegaConf.structured(DATA_SCHEMAS[source]), entry)
            corpus = OmegaConf.to_object(merged)
        except Exception as e:  # omegaconf's errors: an unknown key, a wrong type, a missing value
            raise NMTError(f"{where}: {str(e).splitlines()[0]}") from None
        check_values(corpus, f"{where}.")
        typed.append(corpus)
    return typed


def directions_of(cfg: DataConfig) -> list[tuple[str, str]]:
    """The directions a corpus (a checkpoint's ``data``) trains: its corpora's, or its own one."""
    if isinstance(cfg, MultiDataConfig):
        return [(c.src_lang, c.tgt_lang) for c in corpus_configs(cfg)]
    return [(cfg.src_lang, cfg.tgt_lang)]


@fits_together(MultiDataConfig)
def _multi_fits(cfg: MultiDataConfig, prefix: str) -> None:
    """Each direction once (its tag and its validation would be ambiguous), and one tokenizer for all."""
    seen: dict[tuple[str, str], int] = {}
    for i, corpus in enumerate(corpus_configs(cfg, prefix)):
        direction = (corpus.src_lang, corpus.tgt_lang)
        if direction in seen:
            raise NMTError(
                f"{prefix}corpora[{i}]: the direction {direction[0]}->{direction[1]} repeats "
                f"{prefix}corpora[{seen[direction]}]'s; one corpus per direction (merge them in one source)"
            )
        seen[direction] = i
    settings = [(i, e["tokenizer"]) for i, e in enumerate(cfg.corpora) if "tokenizer" in e]
    for i, tok in settings[1:]:
        if dict(tok) != dict(settings[0][1]):
            raise NMTError(
                f"{prefix}corpora[{i}].tokenizer={dict(tok)} differs from {prefix}corpora[{settings[0][0]}]"
                f".tokenizer={dict(settings[0][1])}: one SentencePiece model encodes every corpus"
            )


@fits_together(DecodingConfig)
def _decoding_fits(cfg: DecodingConfig, prefix: str) -> None:
    if cfg.nbest > cfg.beam_size:
        raise NMTError(f"{prefix}nbest={cfg.nbest} exceeds {prefix}beam_size={cfg.beam_size}")


def check_train_config(cfg: TrainConfig) -> None:
    """Refuse, at start, settings that would fail or misbehave hours into training."""
    check_values(cfg)
    if isinstance(cfg.data, MultiDataConfig):
        _corpora_tokenizer_fits(cfg.data, cfg.tokenizer)
    dropouts = ("dropout", "attention_dropout", "activation_dropout")
    if cfg.optim.rdrop_alpha > 0 and not any(getattr(cfg.model, key, 0.0) for key in dropouts):
        raise NMTError(
            f"optim.rdrop_alpha={cfg.optim.rdrop_alpha:g} compares two dropout passes, but model.dropout, "
            "model.attention_dropout and model.activation_dropout are 0: the passes would be the same"
        )


def _corpora_tokenizer_fits(data: MultiDataConfig, tokenizer: TokenizerConfig) -> None:
    """A corpus that names tokenizer settings must name the run's: one model encodes them all."""
    run = config_dict_of(tokenizer)
    for i, entry in enumerate(data.corpora):
        for key, value in dict(entry.get("tokenizer") or {}).items():
            if key not in run:
                raise NMTError(f"data.corpora[{i}].tokenizer.{key}: not a tokenizer setting")
            if run[key] != value:
                raise NMTError(
                    f"data.corpora[{i}].tokenizer.{key}={value} differs from tokenizer.{key}={run[key]}: "
                    "one SentencePiece model encodes every corpus"
                )


def config_dict_of(cfg: object) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
