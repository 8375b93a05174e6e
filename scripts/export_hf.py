"""Export a checkpoint to Hugging Face transformers:
``python scripts/export_hf.py checkpoint=PATH output=DIR``.

The folder loads with ``AutoModelForSeq2SeqLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` (no custom code) and holds a model card. After writing, the exporter
loads it with transformers and compares it with the checkpoint (logits and greedy output) on
``check.text``, or on a file: ``check.src=FILE`` (``check.ref=FILE`` adds BLEU and chrF of both). Add
``force=true`` to replace an earlier export. Which models export, and how to use them: docs/sharing.md.
"""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.evaluation.evaluate import own_reports
from nmt.hf.exporter import export_checkpoint
from nmt.hf.parity import format_parity
from nmt.runs.cli import script_main


@script_main("export_hf")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    parity = export_checkpoint(cfg, own_reports(Path(cfg.checkpoint), "test"))
    print(format_parity(parity))
    print(f"transformers model written to {cfg.output}")


if __name__ == "__main__":
    main()
