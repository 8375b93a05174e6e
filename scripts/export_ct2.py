"""Export a checkpoint to CTranslate2: ``python scripts/export_ct2.py checkpoint=PATH output=DIR``.

Add ``quantization=int8`` (or int8_float32, bfloat16, float16, ...) for smaller, faster weights.
Translate with it: ``scripts/translate.py checkpoint=PATH backend=ct2 ct2_model=DIR``.
"""

from omegaconf import DictConfig, OmegaConf

from nmt.ct2.export import export_checkpoint
from nmt.runs.cli import script_main


@script_main("export_ct2")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    print(f"CTranslate2 model written to {export_checkpoint(cfg)}")


if __name__ == "__main__":
    main()
