"""Every schema stored in Hydra's ConfigStore, under the names the YAML files of ``configs/`` start
from (``defaults: [local_schema]``)."""

from __future__ import annotations

import os

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from nmt.config.scripts import (
    AverageConfig,
    BenchConfig,
    CompareAlignmentsConfig,
    CT2SpeedConfig,
    DecodersSpeedConfig,
    DistillConfig,
    EvaluateConfig,
    ExportCT2Config,
    ExportHFConfig,
    PipelineConfig,
    PlotAttentionConfig,
    PlotCurvesConfig,
    PrepareSpeedConfig,
    ScoreConfig,
    SelectConfig,
    ServeBenchConfig,
    ServeConfig,
    ShortlistConfig,
    SweepSummaryConfig,
    TranslateConfig,
)
from nmt.config.train import (
    DecodingConfig,
    HFDataConfig,
    LocalDataConfig,
    Multi30kDataConfig,
    MultiDataConfig,
    OptimConfig,
    RNNSearchConfig,
    TokenizerConfig,
    ToyDataConfig,
    TrainConfig,
    TrainerConfig,
    TransformerConfig,
)


def _basename(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def _sorted_pair(a: str, b: str) -> str:
    """A language pair in alphabetical order, as OPUS-100 and Multi30k's folder name it (de-en, en-fr)."""
    return "-".join(sorted([a, b]))


def _en_pair(a: str, b: str) -> str:
    """A pair with English as ``xx-en``, as WMT's configs name it (de-en for en->de and de->en)."""
    return f"{b if a == 'en' else a}-en"


RESOLVERS = {"basename": _basename, "sorted_pair": _sorted_pair, "en_pair": _en_pair}


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
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
    cs.store(name="pipeline_schema", node={"pipeline": PipelineConfig})
    cs.store(name="sweep_summary_schema", node=SweepSummaryConfig)
    cs.store(group="data", name="hf_schema", node=HFDataConfig)
    cs.store(group="data", name="local_schema", node=LocalDataConfig)
    cs.store(group="data", name="multi30k_schema", node=Multi30kDataConfig)
    cs.store(group="data", name="multi_schema", node=MultiDataConfig)
    cs.store(group="data", name="toy_schema", node=ToyDataConfig)
    cs.store(group="model", name="transformer_schema", node=TransformerConfig)
    cs.store(group="model", name="rnnsearch_schema", node=RNNSearchConfig)
    cs.store(group="tokenizer", name="tokenizer_schema", node=TokenizerConfig)
    cs.store(group="optim", name="optim_schema", node=OptimConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="decoding", name="decoding_schema", node=DecodingConfig)
